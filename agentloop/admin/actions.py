"""The chat list's actions: cancel, halt, resume, switch model, approve or deny what waits.

Cancel, halt, resume and switch model are the set-based verbs of ``ChatQuerySet``
(``agentloop.models.bulk``, so any chat model's admin has them): one UPDATE per batch of
chats, never over a running step, so "select all" on 100,000 chats finishes. Halt and switch
model first ask for the reason or the model on a page of their own. Every chat an action
changed gets a history entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.models import CHANGE, LogEntry
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..exceptions import AgentloopError, ToolCallNotWaitingError
from ..models import bulk
from ..models.bulk import BulkResult
from .filters import holding

__all__ = [
    "DEFAULT_DENY_REASON",
    "approve_pending",
    "cancel_chats",
    "deny_pending",
    "halt_chats",
    "resume_chats",
    "switch_model",
]

#: the reason a denial from the admin gives the model when the reviewer typed none.
DEFAULT_DENY_REASON = "Denied by a reviewer in the admin."

_FORM_TEMPLATE = "admin/agentloop/chat/bulk_action.html"


def _logger(
    modeladmin: admin.ModelAdmin, request: HttpRequest, message: str
) -> Callable[[list[Any]], None]:
    """Each batch's changed chats get a history entry (one INSERT per batch)."""
    manager = modeladmin.model._default_manager

    def log(pks: list[Any]) -> None:
        LogEntry.objects.log_actions(
            user_id=request.user.pk,  # type: ignore[arg-type] # admin_view: logged in
            queryset=manager.filter(pk__in=pks),
            action_flag=CHANGE,
            change_message=message,
        )

    return log


def _report(
    modeladmin: admin.ModelAdmin, request: HttpRequest, result: BulkResult, done: str, left: str
) -> None:
    modeladmin.message_user(request, done % {"count": result.changed}, messages.SUCCESS)
    if result.skipped:
        modeladmin.message_user(request, left % {"count": result.skipped}, messages.WARNING)


@admin.action(description=_("Cancel the running step"), permissions=["change"])
def cancel_chats(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    # Also wakes each run (in this process, or any worker when Redis is set).
    log = _logger(modeladmin, request, "Cancellation requested.")
    result = bulk.cancel(queryset, on_batch=log)
    _report(
        modeladmin, request, result,
        gettext("Cancellation requested for %(count)d chat(s)."),
        gettext("%(count)d chat(s) had no run to cancel."),
    )  # fmt: skip


@admin.action(description=_("Resume in the background"), permissions=["change"])
def resume_chats(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    log = _logger(modeladmin, request, "Queued to resume in the background.")
    result = bulk.complete_later(queryset, on_batch=log)
    _report(
        modeladmin, request, result,
        gettext("%(count)d chat(s) queued."),
        gettext("%(count)d chat(s) are running and go on by themselves."),
    )  # fmt: skip


@dataclass(frozen=True)
class _Question:
    """What an action asks for on its form page before it acts: one field."""

    field: str
    title: str
    label: str
    help_text: str
    missing: str  # the problem shown when the field is left empty


def _asked(
    modeladmin: admin.ModelAdmin,
    request: HttpRequest,
    queryset: QuerySet,
    question: _Question,
    problem: str = "",
) -> TemplateResponse:
    """The page asking ``question``, posting back to the same action."""
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": question.title,
        "opts": modeladmin.opts,
        "field": question.field,
        "label": question.label,
        "help_text": question.help_text,
        "value": request.POST.get(question.field, ""),
        "problem": problem,
        "action": request.POST.get("action", ""),
        "select_across": request.POST.get("select_across", "0"),
        "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
        "count": queryset.count(),
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
    }
    return TemplateResponse(request, _FORM_TEMPLATE, context, status=400 if problem else 200)


def _ask_first(
    modeladmin: admin.ModelAdmin,
    request: HttpRequest,
    queryset: QuerySet,
    question: _Question,
    act: Callable[[str], None],
) -> TemplateResponse | None:
    """Ask ``question`` (again, saying what was wrong, if the answer was empty or ``act``
    refused it); once answered, ``act`` on the answer."""
    if "apply" not in request.POST:
        return _asked(modeladmin, request, queryset, question)
    answer = request.POST.get(question.field, "").strip()
    if not answer:
        return _asked(modeladmin, request, queryset, question, problem=question.missing)
    try:
        act(answer)
    except AgentloopError as exc:  # nothing changed: say why on the same page
        return _asked(modeladmin, request, queryset, question, problem=str(exc))
    return None


@admin.action(description=_("Halt before the next model call…"), permissions=["change"])
def halt_chats(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet
) -> TemplateResponse | None:
    question = _Question(
        field="reason",
        title=gettext("Halt the runs of these chats"),
        label=gettext("Reason"),
        help_text=gettext(
            "Each run finishes its tool round and stops before its next model call; its "
            "stop reason is “halted: <reason>”. Chats with no run are left alone."
        ),
        missing=gettext("Give a reason for the halt."),
    )

    def halt(reason: str) -> None:
        log = _logger(modeladmin, request, f"Halt requested: {reason}")
        _report(
            modeladmin, request, bulk.halt(queryset, reason, on_batch=log),
            gettext("Halt requested for %(count)d chat(s)."),
            gettext("%(count)d chat(s) had no run to halt."),
        )  # fmt: skip

    return _ask_first(modeladmin, request, queryset, question, halt)


@admin.action(description=_("Switch model…"), permissions=["change"])
def switch_model(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet
) -> TemplateResponse | None:
    question = _Question(
        field="model",
        title=gettext("Switch these chats to another model"),
        label=gettext("Model"),
        help_text=gettext(
            "“provider:model”, e.g. openai:gpt-4.1-mini. Chats a run holds now keep their "
            "model (run the action again once they are done)."
        ),
        missing=gettext("Name a model."),
    )

    def switch(model: str) -> None:
        log = _logger(modeladmin, request, f"Model switched to {model}.")
        _report(
            modeladmin, request, bulk.with_model(queryset, model, on_batch=log),
            gettext("%(count)d chat(s) switched to the new model."),
            gettext("%(count)d chat(s) are running and keep their model."),
        )  # fmt: skip

    return _ask_first(modeladmin, request, queryset, question, switch)


def _decide_all(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet, verb: str
) -> None:
    decided = chats = 0
    for chat in holding(queryset, "approval"):
        done = 0
        for call in chat.pending_approvals():
            try:
                if verb == "approve":
                    chat.approve(call.pk, by=request.user)
                else:
                    chat.deny(call.pk, reason=DEFAULT_DENY_REASON, by=request.user)
            except ToolCallNotWaitingError:
                continue  # decided meanwhile by someone else
            done += 1
            past = "Approved" if verb == "approve" else "Denied"
            modeladmin.log_change(request, chat, f"{past} tool call {call.name} ({call.call_id}).")
        decided += done
        chats += bool(done)
    text = (
        gettext("Approved %(calls)d tool call(s) in %(chats)d chat(s).")
        if verb == "approve"
        else gettext("Denied %(calls)d tool call(s) in %(chats)d chat(s).")
    )
    level = messages.SUCCESS if decided else messages.WARNING
    modeladmin.message_user(request, text % {"calls": decided, "chats": chats}, level)


@admin.action(description=_("Approve the tool calls waiting for approval"), permissions=["change"])
def approve_pending(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    _decide_all(modeladmin, request, queryset, "approve")


@admin.action(description=_("Deny the tool calls waiting for approval"), permissions=["change"])
def deny_pending(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    _decide_all(modeladmin, request, queryset, "deny")

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
from functools import partial
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.models import CHANGE, LogEntry
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.functional import Promise
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..exceptions import AgentloopError, ToolCallNotWaitingError
from ..models import bulk
from ..models.bulk import BulkResult
from .filters import holding

__all__ = [
    "CHAT_ACTIONS",
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

#: text, or text translated when shown (``gettext_lazy``).
_Text = str | Promise

_FORM_TEMPLATE = "admin/agentloop/chat/bulk_action.html"


def _run(
    modeladmin: admin.ModelAdmin,
    request: HttpRequest,
    verb: Callable[..., BulkResult],
    history: str,
    done: _Text,
    left: _Text,
) -> None:
    """Run the bulk ``verb`` with each batch's changed chats getting the history entry
    ``history`` (one INSERT per batch), then say how many it changed and how many it left."""
    manager = modeladmin.model._default_manager

    def log(pks: list[Any]) -> None:
        LogEntry.objects.log_actions(
            user_id=request.user.pk,  # type: ignore[arg-type] # admin_view: logged in
            queryset=manager.filter(pk__in=pks),
            action_flag=CHANGE,
            change_message=history,
        )

    result = verb(on_batch=log)
    modeladmin.message_user(request, done % {"count": result.changed}, messages.SUCCESS)
    if result.skipped:
        modeladmin.message_user(request, left % {"count": result.skipped}, messages.WARNING)


@admin.action(description=_("Cancel the running step"), permissions=["change"])
def cancel_chats(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    # Also wakes each run (in this process, or any worker when Redis is set).
    _run(
        modeladmin, request, partial(bulk.cancel, queryset), "Cancellation requested.",
        gettext("Cancellation requested for %(count)d chat(s)."),
        gettext("%(count)d chat(s) had no run to cancel."),
    )  # fmt: skip


@admin.action(description=_("Resume in the background"), permissions=["change"])
def resume_chats(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    _run(
        modeladmin, request, partial(bulk.complete_later, queryset),
        "Queued to resume in the background.",
        gettext("%(count)d chat(s) queued."),
        gettext("%(count)d chat(s) are running and go on by themselves."),
    )  # fmt: skip


@dataclass(frozen=True)
class _Question:
    """What an action asks for on its form page before it acts (one field), and the bulk
    verb it then runs with the answer."""

    field: str
    title: _Text
    label: _Text
    help_text: _Text
    missing: _Text  # the problem shown when the field is left empty
    #: ``bulk.halt``, ``bulk.with_model``: called (queryset, answer, on_batch=...).
    verb: Callable[..., BulkResult]
    history: str  # each changed chat's history entry; {} is the answer
    done: _Text
    left: _Text


def _asked(
    modeladmin: admin.ModelAdmin,
    request: HttpRequest,
    queryset: QuerySet,
    question: _Question,
    problem: _Text = "",
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
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet, question: _Question
) -> TemplateResponse | None:
    """Ask ``question`` (again, saying what was wrong, if the answer was empty or the verb
    refused it); once answered, run the verb on the answer."""
    if "apply" not in request.POST:
        return _asked(modeladmin, request, queryset, question)
    answer = request.POST.get(question.field, "").strip()
    if not answer:
        return _asked(modeladmin, request, queryset, question, problem=question.missing)
    verb = partial(question.verb, queryset, answer)
    try:
        _run(
            modeladmin, request, verb, question.history.format(answer), question.done, question.left
        )
    except AgentloopError as exc:  # nothing changed: say why on the same page
        return _asked(modeladmin, request, queryset, question, problem=str(exc))
    return None


_HALT = _Question(
    field="reason",
    title=_("Halt the runs of these chats"),
    label=_("Reason"),
    help_text=_(
        "Each run finishes its tool round and stops before its next model call; its "
        "stop reason is “halted: <reason>”. Chats with no run are left alone."
    ),
    missing=_("Give a reason for the halt."),
    verb=bulk.halt,
    history="Halt requested: {}",
    done=_("Halt requested for %(count)d chat(s)."),
    left=_("%(count)d chat(s) had no run to halt."),
)

_SWITCH_MODEL = _Question(
    field="model",
    title=_("Switch these chats to another model"),
    label=_("Model"),
    help_text=_(
        "“provider:model”, e.g. openai:gpt-4.1-mini. Chats a run holds now keep their "
        "model (run the action again once they are done)."
    ),
    missing=_("Name a model."),
    verb=bulk.with_model,
    history="Model switched to {}.",
    done=_("%(count)d chat(s) switched to the new model."),
    left=_("%(count)d chat(s) are running and keep their model."),
)


@admin.action(description=_("Halt before the next model call…"), permissions=["change"])
def halt_chats(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet
) -> TemplateResponse | None:
    return _ask_first(modeladmin, request, queryset, _HALT)


@admin.action(description=_("Switch model…"), permissions=["change"])
def switch_model(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet
) -> TemplateResponse | None:
    return _ask_first(modeladmin, request, queryset, _SWITCH_MODEL)


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


#: the chat list's actions, in the order the list offers them.
CHAT_ACTIONS = [cancel_chats, halt_chats, resume_chats, switch_model, approve_pending, deny_pending]

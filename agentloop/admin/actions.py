"""The chat list's actions: cancel, resume, approve or deny what waits for approval."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..exceptions import ToolCallNotWaitingError
from .filters import holding

__all__ = [
    "DEFAULT_DENY_REASON",
    "approve_pending",
    "cancel_chats",
    "deny_pending",
    "resume_chats",
]

#: the reason a denial from the admin gives the model when the reviewer typed none.
DEFAULT_DENY_REASON = "Denied by a reviewer in the admin."


@admin.action(description=_("Cancel the running step"), permissions=["change"])
def cancel_chats(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    cancelled = idle = 0
    for chat in queryset:
        # Also wakes a run in this process, or any worker when Redis is set.
        if chat.cancel():
            cancelled += 1
            modeladmin.log_change(request, chat, "Cancellation requested.")
        else:
            idle += 1
    modeladmin.message_user(request, gettext("Cancellation requested for %d chat(s).") % cancelled)
    if idle:
        modeladmin.message_user(
            request, gettext("%d chat(s) had no run to cancel.") % idle, messages.WARNING
        )


@admin.action(description=_("Resume in the background"), permissions=["change"])
def resume_chats(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    chats = list(queryset)
    for chat in chats:
        chat.complete_later()
        modeladmin.log_change(request, chat, "Queued to resume in the background.")
    modeladmin.message_user(request, gettext("%d chat(s) queued.") % len(chats))


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

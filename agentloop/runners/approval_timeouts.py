"""``APPROVAL_TIMEOUT``: the sweeper denies tool calls that waited too long for a person."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.apps import apps
from django.db.models.functions import Now

from ..conf import agentloop_settings
from ..exceptions import ToolCallNotWaitingError

__all__ = ["TIMED_OUT_REASON", "deny_timed_out_approvals"]

#: the reason recorded on (and told to the model about) a call denied for waiting too long.
TIMED_OUT_REASON = "approval timed out"


def deny_timed_out_approvals(model_label: str = "agentloop.Chat") -> list[Any]:
    """Deny every call that has waited for approval longer than ``APPROVAL_TIMEOUT`` seconds
    (reason "approval timed out"); background chats they held go on. Returns the calls' pks."""
    timeout = agentloop_settings.APPROVAL_TIMEOUT
    if timeout is None:
        return []
    chat_model: Any = apps.get_model(model_label)
    tool_call_model: Any = chat_model._meta.get_field("tool_calls").related_model
    cutoff = Now() - timedelta(seconds=float(timeout))  # the database's clock, as the wait's
    overdue = tool_call_model._default_manager.filter(
        state="waiting", wait_reason="approval", waiting_since__lt=cutoff
    ).values_list("chat_id", "pk")
    denied = []
    chats: dict[Any, Any] = {}
    for chat_id, call_pk in overdue:
        chat = chats.get(chat_id) or chat_model._default_manager.filter(pk=chat_id).first()
        if chat is None:
            continue
        chats[chat_id] = chat
        try:
            # The same conditional decision a person's deny is, so a person deciding at the
            # same moment wins or loses cleanly; it resumes a chat a worker left waiting.
            chat.deny(call_pk, reason=TIMED_OUT_REASON)
        except ToolCallNotWaitingError:
            continue  # decided (or cancelled) meanwhile
        denied.append(call_pk)
    return denied

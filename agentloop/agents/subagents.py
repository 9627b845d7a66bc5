"""Subagents: the parent/child logic of persisted chats, in one place.

An agent used as a tool runs a child chat, linked to its parent chat and to the parent's tool
call. In-process the call runs the child to its end; in the background the call waits and the
child runs as its own jobs. This module finds or makes the child, reads its answer, settles
the parent's waiting call when the child answers (or is cancelled), and stops children when
their parent is cancelled.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db.models import Q
from django.db.models.functions import Coalesce

from ..exceptions import AgentloopError, DecisionConflictError, ToolCallNotWaitingError
from . import last_answer

__all__ = [
    "SUBAGENT_CANCELLED_RESULT",
    "SUBAGENT_STOPPED_RESULT",
    "cancel_children",
    "cancel_waiting_children",
    "decide",
    "drive_children",
    "pending_in_children",
    "release_parent",
    "settle_parent",
    "stop_children",
]

logger = logging.getLogger("agentloop")

#: a parent's tool result when its subagent's run was cancelled before it answered.
SUBAGENT_CANCELLED_RESULT = "The subagent's run was cancelled before it answered."
#: ... and when a guardrail stopped it ("guardrail <name>: <reason>").
SUBAGENT_STOPPED_RESULT = "The subagent stopped before it answered: {reason}."


def has_children(chat_model: Any) -> bool:
    """Whether chats of this model can have subagent chats (a ``parent`` field)."""
    return any(field.name == "parent" for field in chat_model._meta.get_fields())


def settle_parent(chat: Any, message: Any) -> None:
    """A subagent's final answer becomes its parent's tool result, and the parent goes on."""
    call_id = getattr(chat, "parent_tool_call_id", None)
    if call_id is None or message.role != "assistant" or message.status != "complete":
        return
    if message.tool_calls.exists():
        return
    parent = _parent(chat)
    if parent is not None and parent.conversation.settle_subagent(call_id, last_answer(chat)):
        parent.resume_if_waiting()


def release_parent(chat: Any, result: str = SUBAGENT_CANCELLED_RESULT) -> None:
    """A cancelled subagent (or one a guardrail stopped) releases its parent's waiting call
    with an error result: nothing else would ever settle it, and the parent could take no
    new message."""
    call_id = getattr(chat, "parent_tool_call_id", None)
    if call_id is None:
        return
    parent = _parent(chat)
    if parent is not None and parent.conversation.settle_subagent(call_id, result, is_error=True):
        parent.resume_if_waiting()  # its own cancel, if it was cancelled too, then stops it


def cancel_children(chat_model: Any, parent_pk: Any, now: datetime) -> int:
    """Flag the running subagents of a chat (in the background: queued or running; in this
    process: their parent's call runs). Keeps an earlier request's time."""
    if not has_children(chat_model):
        return 0
    running = Q(state__in=["queued", "running"]) | Q(parent_tool_call__state="running")
    return int(
        chat_model._default_manager.filter(Q(parent_id=parent_pk) & running).update(
            cancel_requested_at=Coalesce("cancel_requested_at", now)
        )
    )


def _waiting_children(chat: Any) -> Any:
    """The subagent chats ``chat``'s calls wait for, that no worker is running now."""
    if not has_children(type(chat)):
        return type(chat)._default_manager.none()
    return (
        type(chat)
        ._default_manager.filter(
            parent=chat, parent_tool_call__state="waiting", parent_tool_call__wait_reason="subagent"
        )
        .exclude(state__in=["queued", "running"])
        .order_by("pk")
    )


def drive_children(chat: Any, calls: list[Any]) -> None:
    """In process: the subagent chats these calls wait for go on where they can (a person
    decided); a child's answer settles its call (``settle_parent``)."""
    keys = [call.key for call in calls]
    for child in _waiting_children(chat).filter(parent_tool_call_id__in=keys):
        try:
            child.complete()
        except AgentloopError:
            # A child that fails or stops (a limit, a cancel) answers for itself: a cancel
            # settles the parent's call (release_parent); anything else leaves it waiting.
            logger.warning("Subagent chat %s could not go on", child.pk, exc_info=True)


def pending_in_children(chat: Any, kind: str) -> list[Any]:
    """The calls waiting for a person (``kind``: "pending_approvals", "pending_questions")
    in the subagent chats ``chat`` waits for, and theirs in turn."""
    return [call for child in _waiting_children(chat) for call in getattr(child, kind)()]


def decide(chat: Any, verb: str, tool_call_id: Any, **kwargs: Any) -> Any:
    """A decision (``verb``: "approve", "deny", "answer", "submit_result") on a call of
    ``chat`` or, when it has no such pending call, of a subagent chat it waits for."""
    try:
        record = getattr(chat.conversation, verb)(tool_call_id, **kwargs)
    except DecisionConflictError:
        raise
    except ToolCallNotWaitingError:
        for child in _waiting_children(chat):
            try:
                return decide(child, verb, tool_call_id, **kwargs)
            except ToolCallNotWaitingError as exc:
                if isinstance(exc, DecisionConflictError):
                    raise
        raise
    chat.resume_if_waiting()
    return record


def cancel_waiting_children(chat: Any) -> None:
    """Cancelling a chat cancels the subagents it waits for that wait for a person (no run
    would ever come back to them): their held calls are cancelled, and each parent's call
    gets the cancelled result (``release_parent``)."""
    for child in _waiting_children(chat):
        cancel_waiting_children(child)
        if child.conversation.cancel_waiting():
            type(child)._default_manager.filter(pk=child.pk, state="waiting").update(state="idle")


def stop_children(chat: Any, calls: list[Any]) -> None:
    """The subagent chats of ``calls`` (calls an edit superseded: they never get a result)
    are cancelled, wherever they run or wait; their answer, if one still comes, settles
    nothing (their parent's call no longer waits)."""
    keys = [call.key for call in calls]
    if not keys or not has_children(type(chat)):
        return
    for child in type(chat)._default_manager.filter(parent=chat, parent_tool_call_id__in=keys):
        child.cancel()


def _parent(chat: Any) -> Any:
    return type(chat)._default_manager.filter(pk=getattr(chat, "parent_id", None)).first()

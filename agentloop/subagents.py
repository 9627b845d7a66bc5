"""Subagents: the parent/child logic of persisted chats, in one place.

An agent used as a tool runs a child chat, linked to its parent chat and to the parent's tool
call. In-process the call runs the child to its end; in the background the call waits and the
child runs as its own jobs. This module finds or makes the child, reads its answer, settles
the parent's waiting call when the child answers (or is cancelled), and stops children when
their parent is cancelled.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db.models import Q
from django.db.models.functions import Coalesce

from .engine.transcript import finished

if TYPE_CHECKING:
    from .agents import Agent

__all__ = [
    "SUBAGENT_CANCELLED_RESULT",
    "cancel_children",
    "child_for",
    "last_answer",
    "release_parent",
    "settle_parent",
]

#: a parent's tool result when its subagent's run was cancelled before it answered.
SUBAGENT_CANCELLED_RESULT = "The subagent's run was cancelled before it answered."


def has_children(chat_model: Any) -> bool:
    """Whether chats of this model can have subagent chats (a ``parent`` field)."""
    return any(field.name == "parent" for field in chat_model._meta.get_fields())


def child_for(parent: Any, call: Any, agent: type[Agent], task: str, inputs: dict[str, Any]) -> Any:
    """The child chat of this call: the existing one (after a crash or a wait) or a new one."""
    chat_model = type(parent)
    child = chat_model._default_manager.filter(parent_tool_call_id=call.key).first()
    if child is None:
        child = agent.create(
            owner=parent.owner, parent=parent, parent_tool_call_id=call.key, **inputs
        )
    if not any(m.role == "user" for m in child.conversation.messages):
        child.ask_later(task)
    return child


def last_answer(child: Any) -> str:
    """The child's latest answer as its parent's tool result (structured output as JSON)."""
    for message in reversed(finished(child.conversation.messages)):
        if message.role == "assistant":
            if message.parsed is not None:
                return json.dumps(message.parsed)
            return message.content
    return ""


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


def release_parent(chat: Any) -> None:
    """A cancelled subagent releases its parent's waiting call with an error result: nothing
    else would ever settle it, and the parent could take no new message."""
    call_id = getattr(chat, "parent_tool_call_id", None)
    if call_id is None:
        return
    parent = _parent(chat)
    if parent is not None and parent.conversation.settle_subagent(
        call_id, SUBAGENT_CANCELLED_RESULT, is_error=True
    ):
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


def _parent(chat: Any) -> Any:
    return type(chat)._default_manager.filter(pk=getattr(chat, "parent_id", None)).first()

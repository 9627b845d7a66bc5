"""What a persisted chat does when its conversation's events fire.

Signals go out, a subagent's final answer settles its parent's waiting tool call, and a
cancelled chat stops its running subagents and releases its parent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db.models.functions import Coalesce
from django.utils import timezone

from .chat import ChatState

if TYPE_CHECKING:
    from ..engine import Conversation
    from .chat import AbstractChat


def _settle_parent(chat: AbstractChat, message: Any) -> None:
    """A subagent's final answer becomes its parent's tool result, and the parent goes on."""
    call_id = getattr(chat, "parent_tool_call_id", None)
    if call_id is None or message.role != "assistant" or message.status != "complete":
        return
    if message.tool_calls.exists():
        return
    parent = type(chat).objects.filter(pk=getattr(chat, "parent_id", None)).first()
    if parent is None:
        return
    from ..agents import _last_answer

    if parent.conversation.settle_subagent(call_id, _last_answer(chat)):
        _resume_parent(parent)


def _resume_parent(parent: AbstractChat) -> None:
    # The state is read after the result is written: a parent whose job is still finishing
    # either reads the result itself (and goes on) or has already released it as waiting.
    parent.refresh_from_db(fields=["state"])
    if parent.state == ChatState.WAITING:
        parent.complete_later()


#: a parent's tool result when its subagent's run was cancelled before it answered.
SUBAGENT_CANCELLED_RESULT = "The subagent's run was cancelled before it answered."


def _release_parent(chat: AbstractChat) -> None:
    """A cancelled subagent releases its parent's waiting call with an error result: nothing
    else would ever settle it, and the parent could take no new message."""
    call_id = getattr(chat, "parent_tool_call_id", None)
    if call_id is None:
        return
    parent = type(chat).objects.filter(pk=getattr(chat, "parent_id", None)).first()
    if parent is None:
        return
    if parent.conversation.settle_subagent(call_id, SUBAGENT_CANCELLED_RESULT, is_error=True):
        _resume_parent(parent)  # its own cancel, if it was cancelled too, then stops it


def _cancel_children(chat: AbstractChat) -> None:
    if any(field.name == "parent" for field in chat._meta.get_fields()):
        children: dict[str, Any] = {"parent_id": chat.pk}
        type(chat).objects.filter(
            state__in=[ChatState.QUEUED, ChatState.RUNNING], **children
        ).update(cancel_requested_at=Coalesce("cancel_requested_at", timezone.now()))


def connect_chat_events(chat: AbstractChat, conversation: Conversation) -> None:
    """Wire the chat's conversation events to the signals and the subagent hooks."""
    from .. import signals

    conversation.on("after_message", lambda m: _settle_parent(chat, m))
    # A cancelled chat's running subagents stop too (their own subagents follow in turn).
    conversation.on("cancelled", lambda: _cancel_children(chat))
    conversation.on("cancelled", lambda: _release_parent(chat))
    sender = type(chat)
    conversation.on("before_message", lambda: signals.model_call_started.send(sender, chat=chat))
    conversation.on(
        "after_message", lambda m: signals.message_added.send(sender, chat=chat, message=m)
    )
    conversation.on(
        "before_tool_call",
        lambda call: signals.tool_call_started.send(sender, chat=chat, tool_call=call),
    )
    conversation.on(
        "after_tool_result",
        lambda m: signals.tool_call_finished.send(sender, chat=chat, message=m),
    )
    conversation.on("cancelled", lambda: signals.chat_cancelled.send(sender, chat=chat))
    conversation.on(
        "stopped", lambda reason: signals.chat_stopped.send(sender, chat=chat, reason=reason)
    )

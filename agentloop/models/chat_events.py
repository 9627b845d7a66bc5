"""What a persisted chat does when its conversation's events fire: the one place its signals,
its live events and its subagent hooks come from.

:class:`ChatEvents` is the conversation's listener (``Conversation(listener=...)``): one
object per chat, with a method per event it hears, so a chat wires nothing per event, and a
signal nobody receives costs Django's check of an empty receiver list. The subagent hooks
(``agentloop.agents.subagents``): a subagent's final answer settles its parent's waiting tool
call; a cancelled chat stops its running subagents and releases its parent; an edit stops the
subagents of the calls it superseded. Live events (``agentloop.live_events``) follow each saved
message, superseded rows and an answer a cancel cut short.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from .. import signals
from ..agents import agent_refresh, subagents
from ..engine._judging import stop_reason
from ..live_events import get_backend, publish_message, publish_superseded


class ChatEvents:
    """The listener of a persisted chat's conversation (``chat`` is an ``AbstractChat``)."""

    __slots__ = ("chat", "sender")

    def __init__(self, chat: Any) -> None:
        self.chat = chat
        self.sender = type(chat)

    def claimed(self) -> None:
        # A chat made by an agent follows the agent's code: each verb applies its configuration.
        agent_refresh.follow_agent(self.chat)

    def before_message(self) -> None:
        signals.model_call_started.send(self.sender, chat=self.chat)

    def after_message(self, message: Any) -> None:
        subagents.settle_parent(self.chat, message)
        signals.message_added.send(self.sender, chat=self.chat, message=message)
        publish_message(self.chat, message)

    def before_tool_call(self, call: Any) -> None:
        signals.tool_call_started.send(self.sender, chat=self.chat, tool_call=call)

    def after_tool_result(self, message: Any) -> None:
        signals.tool_call_finished.send(self.sender, chat=self.chat, message=message)

    def subagents_waiting(self, calls: Any) -> None:
        # In process, a parent's complete() drives on the subagents a person unblocked.
        subagents.drive_children(self.chat, calls)

    def cancelled(self) -> None:
        chat = self.chat
        # Its running subagents stop too (their own subagents follow in turn), its parent is
        # released, and so are the subagents it waits for that wait for a person (no run
        # would come back).
        subagents.cancel_children(self.sender, chat.pk, timezone.now())
        subagents.release_parent(chat)
        subagents.cancel_waiting_children(chat)
        signals.chat_cancelled.send(self.sender, chat=chat)
        # An answer cut short is kept as a ``cancelled`` row, which sends no after_message:
        # live pages hear of it here, to mark the text they streamed (the database backend
        # reads the row itself).
        if get_backend().keeps_events:
            latest = chat.messages.order_by("-id").first()
            if latest is not None and latest.status == "cancelled":
                publish_message(chat, latest)

    def stopped(self, reason: Any) -> None:
        signals.chat_stopped.send(self.sender, chat=self.chat, reason=reason)

    def model_fallback(self, from_model: str, to_model: str, error: Exception) -> None:
        signals.model_fallback.send(
            self.sender, chat=self.chat, from_model=from_model, to_model=to_model, error=error
        )

    def halted(self, reason: Any) -> None:
        signals.chat_halted.send(self.sender, chat=self.chat, reason=reason)

    def budget_exceeded(self, error: Any) -> None:
        signals.budget_exceeded.send(
            self.sender,
            chat=self.chat,
            reason=error.reason,
            subject=error.subject,
            limit=error.limit,
        )
        # A subagent its budget stopped releases its parent's call with an error (the parent,
        # of the same owner, then stops at its own next model call, and goes on with the rest
        # once under quota again).
        subagents.release_parent(
            self.chat, subagents.SUBAGENT_STOPPED_RESULT.format(reason=error.reason)
        )

    def handed_off(self, record: dict[str, Any], call: Any) -> None:
        signals.chat_handed_off.send(
            self.sender,
            chat=self.chat,
            from_agent=record["from"],
            to_agent=record["to"],
            inputs=record["inputs"],
            tool_call=call,
        )

    def guardrail_blocked(self, outcome: Any, stops: bool) -> None:
        signals.guardrail_blocked.send(self.sender, chat=self.chat, outcome=outcome, stops=stops)
        # A subagent a guardrail stopped will not answer: its parent's call gets an error.
        if stops:
            result = subagents.SUBAGENT_STOPPED_RESULT.format(reason=stop_reason(outcome))
            subagents.release_parent(self.chat, result)

    def superseded(self, marked: Any) -> None:
        # An edit or a regenerated answer: the subagents its superseded calls wait for stop.
        subagents.stop_children(self.chat, marked.open_calls)
        message_ids = list(marked.keys)
        signals.messages_superseded.send(
            self.sender,
            chat=self.chat,
            message_ids=message_ids,
            tool_call_ids=[call.id for call in marked.open_calls],
        )
        publish_superseded(self.chat, message_ids)

    def forked(self, fork: Any, message: Any) -> None:
        signals.chat_forked.send(self.sender, chat=self.chat, fork=fork, message=message)

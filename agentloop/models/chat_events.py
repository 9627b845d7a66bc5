"""What a persisted chat does when its conversation's events fire.

Signals go out, and the subagent hooks run (``agentloop.agents.subagents``): a subagent's final
answer settles its parent's waiting tool call; a cancelled chat stops its running subagents
and releases its parent; an edit stops the subagents of the calls it superseded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.utils import timezone

from .. import signals
from ..agents import agent_refresh, subagents
from ..engine._judging import stop_reason

if TYPE_CHECKING:
    from ..engine import Conversation


def connect_chat_events(chat: Any, conversation: Conversation) -> None:
    """Wire the conversation events of ``chat`` (an ``AbstractChat``) to the signals and the
    subagent hooks."""
    conversation.on("after_message", lambda m: subagents.settle_parent(chat, m))
    # A chat made by an agent follows the agent's code: each verb applies its configuration.
    conversation.on("claimed", lambda: agent_refresh.follow_agent(chat))
    # In process, a parent's complete() drives on the subagents a person unblocked.
    conversation.on("subagents_waiting", lambda calls: subagents.drive_children(chat, calls))
    # A cancelled chat's running subagents stop too (their own subagents follow in turn).
    conversation.on(
        "cancelled", lambda: subagents.cancel_children(type(chat), chat.pk, timezone.now())
    )
    conversation.on("cancelled", lambda: subagents.release_parent(chat))
    # ... and the subagents it waits for that wait for a person (no run would come back).
    conversation.on("cancelled", lambda: subagents.cancel_waiting_children(chat))
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
    conversation.on(
        "model_fallback",
        lambda from_model, to_model, error: signals.model_fallback.send(
            sender, chat=chat, from_model=from_model, to_model=to_model, error=error
        ),
    )
    conversation.on(
        "halted", lambda reason: signals.chat_halted.send(sender, chat=chat, reason=reason)
    )
    conversation.on(
        "budget_exceeded",
        lambda error: signals.budget_exceeded.send(
            sender, chat=chat, reason=error.reason, subject=error.subject, limit=error.limit
        ),
    )
    conversation.on(
        "handed_off",
        lambda record, call: signals.chat_handed_off.send(
            sender,
            chat=chat,
            from_agent=record["from"],
            to_agent=record["to"],
            inputs=record["inputs"],
            tool_call=call,
        ),
    )
    conversation.on(
        "guardrail_blocked",
        lambda outcome, stops: signals.guardrail_blocked.send(
            sender, chat=chat, outcome=outcome, stops=stops
        ),
    )

    def release_parent(outcome: Any, stops: bool) -> None:
        # A subagent a guardrail stopped will not answer: its parent's call gets an error.
        if stops:
            result = subagents.SUBAGENT_STOPPED_RESULT.format(reason=stop_reason(outcome))
            subagents.release_parent(chat, result)

    conversation.on("guardrail_blocked", release_parent)
    # ... and so does a subagent its budget stopped (its parent, of the same owner, then
    # stops at its own next model call, and goes on with the rest once under quota again).
    conversation.on(
        "budget_exceeded",
        lambda error: subagents.release_parent(
            chat, subagents.SUBAGENT_STOPPED_RESULT.format(reason=error.reason)
        ),
    )
    # An edit or a regenerated answer: the subagents its superseded calls wait for stop.
    conversation.on("superseded", lambda marked: subagents.stop_children(chat, marked.open_calls))
    conversation.on(
        "superseded",
        lambda marked: signals.messages_superseded.send(
            sender,
            chat=chat,
            message_ids=list(marked.keys),
            tool_call_ids=[call.id for call in marked.open_calls],
        ),
    )
    conversation.on(
        "forked",
        lambda fork, message: signals.chat_forked.send(
            sender, chat=chat, fork=fork, message=message
        ),
    )

"""Reading a transcript: what is pending, whether it is settled, where the turn began, and
what a step returns (the move it made, and the move a next step would make).

Pure functions over a list of messages, shared by every verb. Partial and
cancelled answers are skipped everywhere: they are records, not moves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..messages import Message, MessageStatus, ToolCall, ToolCallState

__all__ = [
    "MessageT",
    "Round",
    "StepResult",
    "TOOL_LIMIT_RESULT",
    "counted_tool_results",
    "finished",
    "handoffs_in_turn",
    "is_complete",
    "is_waiting",
    "next_move",
    "pending_round",
    "turn_start",
]


#: the result of a call that ``max_tool_calls`` kept from running.
TOOL_LIMIT_RESULT = "not run: the tool call limit was reached"


def finished(transcript: list[Message]) -> list[Message]:
    """The messages that count: no partial or cancelled answers."""
    # ``is_finished`` spelled out: every model call filters the whole history.
    complete = MessageStatus.COMPLETE
    return [message for message in transcript if message.status == complete]


@dataclass
class Round:
    """The latest assistant message that asked for tools, and its calls without a result."""

    message: Message | None = None
    unanswered: list[ToolCall] = field(default_factory=list)


def pending_round(transcript: list[Message]) -> Round:
    """The open tool round, if the latest answer asked for tools not yet answered."""
    # From the end: only the messages after the latest answer are looked at (not O(history)).
    answered: set[str | None] = set()
    for message in reversed(transcript):
        if not message.is_finished:
            continue
        if message.role == "user":
            return Round()
        if message.role == "tool":
            answered.add(message.tool_call_id)
        elif message.role == "assistant":
            if not message.tool_calls:
                return Round()
            unanswered = [call for call in message.tool_calls if call.id not in answered]
            return Round(message=message, unanswered=unanswered)
    return Round()


def is_complete(transcript: list[Message]) -> bool:
    """Settled: no messages, or the latest is an answer that asked for no tools."""
    for message in reversed(transcript):
        if not message.is_finished or message.role in ("system", "summary"):
            continue
        if message.role == "assistant":
            return not message.tool_calls
        return False
    return True


def is_waiting(transcript: list[Message]) -> bool:
    """A pending call is held by a person or a subagent."""
    return any(call.state == ToolCallState.WAITING for call in pending_round(transcript).unanswered)


def next_move(transcript: list[Message]) -> str:
    """What ``step()`` would do: "done", "wait", "tools" or "generate".

    Calls that can run are run even while others wait for a person; the model is
    called only when every call of the round has a result.
    """
    if is_complete(transcript):
        return "done"
    round_ = pending_round(transcript)
    if round_.unanswered:
        if any(call.state != ToolCallState.WAITING for call in round_.unanswered):
            return "tools"
        return "wait"
    return "generate"


def turn_start(transcript: list[Message]) -> int:
    """Index of the latest user message (0 when there is none)."""
    for index in range(len(transcript) - 1, -1, -1):
        if transcript[index].role == "user":
            return index
    return 0


def counted_tool_results(transcript: list[Message]) -> int:
    """The turn's tool results that count towards ``max_tool_calls``: every result except
    those of calls the limit kept from running (raising the limit lets the turn go on)."""
    return sum(
        1
        for message in finished(transcript[turn_start(transcript) :])
        if message.role == "tool"
        and not (message.is_error and message.content == TOOL_LIMIT_RESULT)
    )


def handoffs_in_turn(transcript: list[Message]) -> int:
    """The handoffs the turn's tool calls made (``AGENTLOOP["MAX_HANDOFFS"]`` bounds them)."""
    return sum(
        1
        for message in finished(transcript[turn_start(transcript) :])
        if message.role == "assistant"
        for call in message.tool_calls
        if call.handoff
    )


#: the message type a conversation's verbs return: ``agentloop.Message`` in memory, the
#: message model (``agentloop.models.Message``) for a persisted chat.
MessageT = TypeVar("MessageT")


@dataclass(frozen=True)
class StepResult:
    """What one step did and what comes next."""

    #: the last message the step added (the store's record), or None when it did nothing.
    message: Any
    #: "done", "wait", "tools" or "generate": the move a next step would make.
    next_move: str

"""Handoffs made in a tool round: the chat handed over to another agent by the call that asked
for it (a handoff tool, or any tool calling ``ToolContext.hand_off``), in the transaction that
saves the call's result, so the very next model call is the new agent's, in this run or in a
worker's next job, and a crash never leaves one without the other.

At most one handoff per round: the first handoff tool in the answer's call order runs, later
ones get an error result; a handoff asked for when the round already made one is not made.
At most ``AGENTLOOP["MAX_HANDOFFS"]`` per turn (A to B to A...): past it a handoff is refused
with an error result and the current agent goes on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..conf import agentloop_settings
from ..exceptions import ConfigurationError
from ..messages import ToolCall
from ..tools import ToolOutcome
from .store import ChatStore

__all__ = ["RoundHandoffs", "agent_label", "hands_off"]


def hands_off(tool_class: Any) -> bool:
    """A handoff tool (``Agent.as_handoff()``): running it only asks for the handoff."""
    return getattr(tool_class, "handoff_agent", None) is not None


def agent_label(path: str) -> str:
    """``Billing`` for ``myapp.agents.Billing``; "" for no agent."""
    return path.rpartition(".")[2]


class RoundHandoffs:
    """The handoffs of one tool round: which may be made, and making them."""

    def __init__(
        self, store: ChatStore, emit: Callable[..., None], owner: Any, *, made_in_turn: int
    ) -> None:
        self.store = store
        self.emit = emit
        #: what the new agent configures: the persisted chat, or the in-memory Conversation.
        self.owner = owner
        self.limit = int(agentloop_settings.MAX_HANDOFFS)
        self.made_in_turn = made_in_turn
        #: the handoff this round made: (the call's id, its record).
        self.made: tuple[str, dict[str, Any]] | None = None
        #: the call whose handoff is made and not yet announced ("handed_off").
        self._unannounced: ToolCall | None = None

    def refusal(self) -> str | None:
        """Why a handoff can't be made now; None when it can."""
        if self.store.handoffs is None:
            return (
                f"Not handed off: {type(self.store).__name__} keeps no handoffs "
                "(store.handoffs is None)."
            )
        if self.made is not None:
            call_id, record = self.made
            return (
                f"Not handed off: call {call_id} of this answer already handed the "
                f"conversation to {agent_label(record['to'])}."
            )
        if self.made_in_turn >= self.limit:
            return (
                f"Not handed off: this turn already handed the conversation over "
                f"{self.made_in_turn} times, the limit (AGENTLOOP['MAX_HANDOFFS'])."
            )
        return None

    def refusals(self, calls: list[ToolCall], tools: dict[str, Any]) -> dict[str, ToolOutcome]:
        """Before the round runs: the handoff tools' calls that won't run (all but the
        answer's first, or all of them when no handoff can be made), with their results."""
        refused: dict[str, ToolOutcome] = {}
        first = True
        for call in calls:
            if not hands_off(tools.get(call.name)):
                continue
            reason = self.refusal()
            if reason is None and not first:
                reason = (
                    "Not handed off: an answer hands the conversation to one agent; "
                    "an earlier call of this answer does."
                )
            first = False
            if reason is not None:
                refused[call.id] = ToolOutcome(reason, is_error=True, error=reason)
        return refused

    def save(
        self,
        call: ToolCall,
        outcome: ToolOutcome,
        tool_class: Any,
        write: Callable[[ToolOutcome], Any],
    ) -> tuple[ToolOutcome, Any]:
        """Write ``call``'s result (``write``), its outcome asking for a handoff: the handoff
        made in the same transaction (the new agent's configuration applied, the chat's agent
        recorded, the call marked); when it can't be made, the result says why. Returns the
        outcome written and what ``write`` returned; :meth:`announce` once committed."""
        request = outcome.handoff
        assert request is not None  # noqa: S101 - the runner routes only handoffs here
        reason = self.refusal()
        if reason is None:
            try:
                with self.store.atomic():
                    # The new agent checks everything (inputs, model) before it writes.
                    record = request.agent.take_over(self.owner, request.inputs)
                    call.handoff = record
                    assert self.store.handoffs is not None  # refusal() said so
                    self.store.handoffs.record_handoff(call, record)
                    result = write(outcome)
            except ConfigurationError as exc:
                call.handoff = None
                target = getattr(request.agent, "__name__", str(request.agent))
                reason = f"Not handed off to {target}: {exc}"
            else:
                self.made = (call.id, record)
                self.made_in_turn += 1
                self._unannounced = call
                return outcome, result
        if hands_off(tool_class):
            refused = ToolOutcome(reason, is_error=True, error=reason)
        else:
            # Any other tool ran and has its own result: kept, with why no handoff was made.
            refused = ToolOutcome(f"{outcome.content}\n\n[{reason}]")
        return refused, write(refused)

    def announce(self) -> None:
        """Once the handoff's transaction committed: "handed_off" for it (once), so what
        listens sees the chat under its new agent."""
        call, self._unannounced = self._unannounced, None
        if call is not None and call.handoff is not None:
            self.emit("handed_off", call.handoff, self.store.tool_calls.native_tool_call(call))

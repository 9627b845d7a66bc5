"""Control beyond cancel: halting a run before its next model call, driving subagents a
person unblocked, and cancelling calls no run will come back to."""

from __future__ import annotations

from ..messages import ToolCallState
from .callbacks import Callbacks
from .runs import HaltedRelease, Run
from .store import ChatStore
from .transcript_reading import next_move, pending_round

__all__ = ["CANCELLED_TOOL_RESULT", "HALTED_PREFIX", "Control", "halt_text"]

#: how a halted chat's ``stop_reason`` begins.
HALTED_PREFIX = "halted: "
#: the result given to calls a cancel left unanswered (when the user moves on) or held.
CANCELLED_TOOL_RESULT = "Cancelled by the user before this tool ran."


def halt_text(reason: str) -> str:
    """A halt's reason as it is stored: on one line, at most 240 characters."""
    text = " ".join(str(reason).split()) or "no reason given"
    return text[:240]


class Control:
    """Halts, subagents driven in process, held calls cancelled, for one chat's store."""

    def __init__(self, store: ChatStore, callbacks: Callbacks) -> None:
        self.store = store
        self._callbacks = callbacks

    def halt_if_requested(self, run: Run) -> bool:
        """Before a model call: a pending halt stops the run (recorded, "halted" sent; the
        verb's release marks the chat stopped)."""
        reason = self.store.stopping.halt_requested()
        if not reason:
            return False
        stop_reason = HALTED_PREFIX + reason
        self.store.stopping.record_stop(stop_reason)
        run.next_move, run.halted = "done", HaltedRelease(stop_reason)
        self._callbacks.emit("halted", reason)
        return True

    def drive_subagents(self, run: Run) -> bool:
        """In process, held by subagents: "subagents_waiting" lets the chats they run go on
        where a person unblocked them. True when a call was settled and the run can go on."""
        if self.store.runs.background or not self._callbacks.listens("subagents_waiting"):
            return False
        held = [
            call
            for call in pending_round(run.transcript or []).unanswered
            if call.state == ToolCallState.WAITING and call.wait_reason == "subagent"
        ]
        if not held:
            return False
        self._callbacks.emit("subagents_waiting", held)
        run.transcript = self.store.transcript.load_transcript()
        run.next_move = next_move(run.transcript)
        return run.next_move != "wait"

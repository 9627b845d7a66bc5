"""A verb's run: the chat's claim taken and released around it, the transcript read once with
the cancel flag (the start checkpoint), and a cancel recorded wherever the run sees it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..conf import agentloop_settings
from ..exceptions import CancelledError, LimitReachedError
from ..messages import Message, ToolCall, ToolCallState
from . import tracing
from .callbacks import Callbacks
from .checkpoints import Checkpoints
from .store import ChatStore, UsageRecord
from .transcript_reading import pending_round

__all__ = ["HaltedRelease", "Run", "Runs"]


class HaltedRelease(LimitReachedError):  # noqa: N818 - a release record, never raised
    """How a halted run is released: like a limit (the chat is ``stopped``, a job reports
    "stopped"); never raised, since a halt is asked for, not an error."""


@dataclass
class Run:
    """One verb's state: its checkpoints, and the transcript read once and kept up to date."""

    checkpoints: Checkpoints
    #: one move (``step()``, ``generate()``...), not a loop: its last write releases the claim.
    single: bool
    transcript: list[Message] | None = None
    next_move: str | None = None
    #: set when a halt stopped the run: the release records it as the chat's stop.
    halted: HaltedRelease | None = None


class Runs:
    """Opens one chat's runs and records what stops them."""

    def __init__(self, store: ChatStore, callbacks: Callbacks) -> None:
        self.store = store
        self._callbacks = callbacks

    @contextmanager
    def scope(self, *, single: bool) -> Iterator[Run]:
        """A verb under the chat's claim: taken first (``ChatBusyError`` when another process
        holds the chat), released by the verb's last write or at its end, with how it ended.
        A CancelledError is recorded on the way out."""
        owns = self.store.runs.claim()
        if owns:
            try:
                # A verb took the chat: configuration that follows code (agents) applies now.
                self._callbacks.emit("claimed")
            except BaseException as exc:
                self.store.runs.release(None, failure=exc)
                raise
        run = Run(Checkpoints(self.store, agentloop_settings.CANCEL_POLL_INTERVAL), single)
        try:
            with tracing.verb(self.store, single):
                yield run
        except BaseException as exc:
            if isinstance(exc, CancelledError) and not exc.recorded:
                self.record_cancel(exc)
            if owns:
                # How it ended goes on the chat: cancelled, stopped by a limit, or failed
                # (one line; a lost lease writes nothing).
                self.store.runs.release(None, failure=exc)
            raise
        if owns:
            if run.halted is not None:
                self.store.runs.release(None, failure=run.halted)
            else:
                self.store.runs.release(run.next_move)

    def record_cancel(
        self,
        exc: CancelledError,
        *,
        partial: Message | None = None,
        partial_key: Any = None,
        usage: UsageRecord | None = None,
        unanswered: list[ToolCall] | None = None,
    ) -> None:
        """Record a cancel: the flag cleared, the attempt cut short (its partial answer and
        usage), the calls it left unanswered; "cancelled" is sent."""
        requested_at = exc.requested_at if isinstance(exc.requested_at, datetime) else None
        self.store.stopping.record_cancellation(
            requested_at,
            partial=partial,
            partial_key=partial_key,
            usage=usage,
            unanswered=unanswered or [],
        )
        exc.recorded = True
        self._callbacks.emit("cancelled")

    def read(self, run: Run) -> list[Message]:
        """The transcript, read once per verb together with the cancel flag (the start
        checkpoint); later steps of the run keep it up to date in memory."""
        if run.transcript is None:
            transcript = self.store.transcript.load_transcript()
            requested_at = self.store.stopping.cancel_requested_at()
            run.transcript = transcript
            self.observe(run, requested_at)
        else:
            try:
                run.checkpoints.check()
            except CancelledError as exc:
                self._cancel_held(run, exc)
        return run.transcript

    def observe(self, run: Run, requested_at: Any) -> None:
        """The start checkpoint with the cancel flag read with the transcript."""
        try:
            run.checkpoints.observe(requested_at)
        except CancelledError as exc:
            self._cancel_held(run, exc)

    def _cancel_held(self, run: Run, exc: CancelledError) -> None:
        """Stop here: a round not yet run, and its calls held for a person, are marked
        cancelled, so the next ``ask_later`` answers its calls instead of refusing."""
        transcript = run.transcript or []
        unanswered = [
            call
            for call in pending_round(transcript).unanswered
            # A call held for a subagent is settled by the subagent's own cancel.
            if call.state != ToolCallState.WAITING or call.wait_reason != "subagent"
        ]
        self.record_cancel(exc, unanswered=unanswered)
        raise exc

"""A verb's run: the chat's claim taken and released around it, the transcript read once with
the cancel flag (the start checkpoint), a cancel recorded wherever the run sees it, the
cancellation checkpoints (where a run looks at the cancel flag, and how often), and the
chat's callbacks by event (what ``Conversation.on`` registers and the run's parts send).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..conf import agentloop_settings
from ..exceptions import CancelledError, ConfigurationError, LimitReachedError
from ..messages import Message, ToolCall, ToolCallState
from . import tracing
from ._transcript_reading import pending_round
from .store import ChatStore, UsageRecord

__all__ = ["Callbacks", "Checkpoints", "EVENTS", "HaltedRelease", "Run", "Runs"]


#: the events a callback can be registered for.
EVENTS = (
    "before_message",
    "after_message",
    "before_tool_call",
    "after_tool_result",
    "cancelled",
    "stopped",
    "budget_exceeded",
    "model_fallback",
    "halted",
    "handed_off",
    "claimed",
    "subagents_waiting",
    "guardrail_blocked",
    "superseded",
    "forked",
)


#: the events each listener class defines a method for (worked out once per class).
_HEARD: dict[type, frozenset[str]] = {}


def _heard_by(kind: type) -> frozenset[str]:
    heard = _HEARD.get(kind)
    if heard is None:
        heard = _HEARD[kind] = frozenset(
            event for event in EVENTS if callable(getattr(kind, event, None))
        )
    return heard


class Callbacks:
    """A conversation's events, heard by its listener and by the callbacks registered per
    event, in that order.

    The listener is one object whose methods are named after :data:`EVENTS` (a persisted
    chat's signals, live events and subagent hooks: ``agentloop.models.chat_events``): given
    once, it costs nothing per event it doesn't define, and a conversation with no listener
    and no callbacks wires nothing.
    """

    def __init__(self, listener: object | None = None) -> None:
        self._by_event: dict[str, list[Callable[..., Any]]] = {}
        self._listener = listener
        self._heard = _heard_by(type(listener)) if listener is not None else frozenset()
        #: called with every event and its arguments while a stream iterates a run
        #: (``listening``); the engine's own events for it ("answer_saved") included.
        self._taps: list[Callable[..., Any]] = []

    def add(self, event: str, callback: Callable[..., Any]) -> None:
        """Register ``callback`` for ``event`` (``ConfigurationError`` for an unknown event)."""
        if event not in EVENTS:
            raise ConfigurationError(f"Unknown event {event!r}; choose from {', '.join(EVENTS)}")
        self._by_event.setdefault(event, []).append(callback)

    def emit(self, event: str, *args: Any) -> None:
        """Call the listener's method and the callbacks of ``event`` with ``args``."""
        if event in self._heard:
            getattr(self._listener, event)(*args)
        for callback in self._by_event.get(event, ()):
            callback(*args)
        for tap in self._taps:
            tap(event, *args)

    @contextmanager
    def listening(self, tap: Callable[..., Any]) -> Iterator[None]:
        """Call ``tap(event, *args)`` for every event sent within the block."""
        self._taps.append(tap)
        try:
            yield
        finally:
            self._taps.remove(tap)

    def listens(self, event: str) -> bool:
        """Whether the listener or any callback waits for ``event``."""
        return event in self._heard or bool(self._by_event.get(event))


#: how often a throttled checkpoint reads the flag while the store's notices cover the run
#: (``store.stopping.notices_cover``): only a backstop then, for a notice lost in a way the
#: subscription didn't notice.
COVERED_INTERVAL = 5.0


class Checkpoints:
    """Reads the store's cancel flag; throttled reads cost nothing between polls.

    Forced checks (start of a verb, around each tool) always read. Throttled ones
    (before the model request, between streamed chunks) read at most once per
    ``interval`` seconds, so a fast stream does not cost a query per chunk; while the
    store's notices cover the run (a worker's Redis subscription), at most once per
    ``COVERED_INTERVAL``: a cancel sets the notice, and the next checkpoint reads at once.
    """

    def __init__(self, store: ChatStore, interval: float) -> None:
        self.store = store
        self.interval = interval
        self._last_read = float("-inf")

    def observe(self, requested_at: object) -> None:
        """A flag value read by someone else just now (with the transcript): count it as
        this checkpoint's read."""
        self._last_read = time.monotonic()
        if requested_at is not None:
            raise CancelledError("The run was cancelled.", requested_at=requested_at)

    def due(self) -> bool:
        """A throttled check would read the flag now (an async stream then reads it on the
        database's thread; otherwise the check costs nothing and is skipped)."""
        notice = self.store.cancel_notice
        # A notice (same process, or a Redis message) makes the next check read at once.
        if notice is not None and notice.is_set():
            return True
        elapsed = time.monotonic() - self._last_read
        if elapsed < self.interval:
            return False
        return elapsed >= COVERED_INTERVAL or not self.store.stopping.notices_cover(self._last_read)

    def check(self, *, force: bool = True) -> None:
        """Raise :class:`CancelledError` if cancellation was requested."""
        if not force and not self.due():
            return
        notice = self.store.cancel_notice
        noticed = notice is not None and notice.is_set()
        self._last_read = time.monotonic()
        requested_at = self.store.stopping.cancel_requested_at()
        if noticed and notice is not None:
            notice.clear()  # after the read, which saw the flag the notice announced
        if requested_at is not None:
            raise CancelledError("The run was cancelled.", requested_at=requested_at)


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

"""Every model call bounded: a total deadline, and a cancel that closes the response at once.

The driver of a verb runs each model call inside :func:`watching`; one watchdog thread per
process looks at every call in flight a few times a second and, when a call's deadline has
passed or its run's cancel notice is set, aborts it: the response's socket is shut down (a
read stuck waiting for bytes returns at once, whatever the server sends or doesn't: SSE
keep-alive comments never extend a call), and an awaited call's task is cancelled.
``HTTPProvider`` hands its responses to :func:`watch_response`; its per-read timeouts are cut
to what is left of the deadline (:func:`remaining`), so a response whose headers never come
ends in time too.
"""

from __future__ import annotations

import contextvars
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

from ..process.per_process import PerProcess

__all__ = ["CallWatch", "current", "remaining", "watch_response", "watching"]

logger = logging.getLogger(__name__)

#: a call past its deadline, its run cancelled, or abandoned for a guardrail's verdict.
Reason = Literal["deadline", "cancel", "guardrail"]

#: seconds between two looks of the watchdog at the calls in flight.
INTERVAL = 0.05


class CallWatch:
    """One model call in flight: its deadline, its run's cancel notice, how to abort it."""

    def __init__(
        self,
        deadline: float | None,
        notice: threading.Event | None,
        abandon: threading.Event | None = None,
    ) -> None:
        #: ``time.monotonic()`` value the call must end by (None: no deadline).
        self.deadline = deadline
        self.notice = notice
        #: set when the call's answer will not be used (input guardrails judging meanwhile
        #: did not pass it): the call is aborted as a cancel would be.
        self.abandon = abandon
        #: why the call was aborted (None: it was not).
        self.reason: Reason | None = None
        self._aborts: list[Callable[[], object]] = []
        self._lock = threading.Lock()

    def on_abort(self, action: Callable[[], object]) -> None:
        """Run ``action`` when the call is aborted (at once if it already was)."""
        with self._lock:
            if self.reason is None:
                self._aborts.append(action)
                return
        _run(action)

    def abort(self, reason: Reason) -> None:
        """Stop the call: its abort actions run (from the watchdog's thread)."""
        with self._lock:
            if self.reason is not None:
                return
            self.reason = reason
            actions, self._aborts = self._aborts, []
        for action in actions:
            _run(action)

    def due(self, now: float) -> Reason | None:
        """Why the call should be aborted now, if it should."""
        # A notice set by a halt only (``cancelling`` False) lets the call finish.
        if self.notice is not None and self.notice.is_set():
            if getattr(self.notice, "cancelling", True):
                return "cancel"
        if self.abandon is not None and self.abandon.is_set():
            return "guardrail"
        if self.deadline is not None and now >= self.deadline:
            return "deadline"
        return None


def _run(action: Callable[[], object]) -> None:
    try:
        action()
    except Exception:  # an abort is best effort: the deadline still ends the call
        logger.debug("Aborting a model call failed", exc_info=True)


_current: contextvars.ContextVar[CallWatch | None] = contextvars.ContextVar(
    "agentloop_call_watch", default=None
)


def current() -> CallWatch | None:
    """The watch of the model call this thread (or task) is making, if any."""
    return _current.get()


def remaining() -> float | None:
    """Seconds left before the current call's deadline (None: no deadline, or no call)."""
    watch = _current.get()
    if watch is None or watch.deadline is None:
        return None
    return max(0.0, watch.deadline - time.monotonic())


@contextmanager
def watching(watch: CallWatch) -> Iterator[CallWatch]:
    """Make the call inside this block under ``watch`` (the watchdog aborts it when due)."""
    token = _current.set(watch)
    _the_watchdog.get().add(watch)
    try:
        yield watch
    finally:
        _the_watchdog.get().discard(watch)
        _current.reset(token)


def watch_response(response: Any) -> None:
    """Let the current call's abort shut ``response``'s connection (an httpx response)."""
    watch = _current.get()
    if watch is None:
        return
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if sock is not None:
        watch.on_abort(lambda: _shut(sock))


def _shut(sock: Any) -> None:
    # shutdown (not close) wakes a read blocked on the socket in another thread (or greenlet);
    # the plain socket's method, so a TLS socket's state is left to the thread that reads it.
    socket.socket.shutdown(sock, socket.SHUT_RDWR)


class _Watchdog:
    """The one thread that looks at every call in flight in this process."""

    def __init__(self) -> None:
        self._watches: set[CallWatch] = set()
        self._lock = threading.Lock()
        self._busy = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="agentloop-call-watchdog", daemon=True
        )
        self._thread.start()

    def add(self, watch: CallWatch) -> None:
        with self._lock:
            self._watches.add(watch)
            self._busy.set()

    def discard(self, watch: CallWatch) -> None:
        with self._lock:
            self._watches.discard(watch)

    def _run(self) -> None:
        while True:
            self._busy.wait()
            with self._lock:
                watches = list(self._watches)
                if not watches:
                    self._busy.clear()
                    continue
            now = time.monotonic()
            for watch in watches:
                reason = watch.reason is None and watch.due(now)
                if reason:
                    watch.abort(reason)
            time.sleep(INTERVAL)


#: this process's watchdog, started by its first call (a forked child starts its own).
_the_watchdog = PerProcess(_Watchdog)

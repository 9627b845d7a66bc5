"""One bounded publisher of live events per process: a step hands an event over and goes on.

``agentloop.live_events`` puts each event on this process's queue; one thread sends what is
queued, a batch at a time (one Redis pipeline), so a slow or hung Redis holds that thread
and never a step. One queue and one sender keep order: the events of a chat reach Redis in
the order this process made them.

The queue holds at most ``AGENTLOOP["EVENTS_QUEUE_SIZE"]`` events. When it is full (Redis is
slow or away) a text chunk is added to its chat's latest queued chunk (no text is lost, the
pieces get larger), any other chunk is dropped, and a message pushes out the oldest queued
event: pages need the messages more, and every message is in the database whatever happens
here (a page that reloads shows it). Drops are counted and logged, a warning at most once a
minute.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from .per_process import PerProcess

__all__ = ["Publisher", "publisher"]

logger = logging.getLogger("agentloop.live_events")

#: most events sent in one pipeline.
BATCH = 500
#: seconds the sender waits after the first event of a batch, so a burst (the chunks of many
#: steps at once) goes in one pipeline: a pipeline of one event costs about four times the
#: CPU per event of one of ten (redis-py), and a page sees its text 2 ms later.
LINGER = 0.002
#: seconds between two warnings about dropped events.
WARN_EVERY = 60.0


@dataclass(eq=False)
class _Event:
    backend: Any  # an agentloop.live_events.EventBackend (imported there; this module is below it)
    destination: str  # the backend's name for the chat's events (a Redis stream)
    type: str
    data: dict[str, Any]
    number: int = 0


class Publisher:
    """A bounded queue of events and the one thread that sends them."""

    def __init__(self) -> None:
        self._events: deque[_Event] = deque()
        #: the latest queued event of each chat (to add text chunks to when full).
        self._latest: dict[tuple[int, str], _Event] = {}
        self._condition = threading.Condition()
        self._numbers = itertools.count(1)
        self._queued = 0  # number of the latest event queued
        self._sent = 0  # number of the latest event sent (or given up on)
        self._in_flight: list[_Event] = []
        self._thread: threading.Thread | None = None
        self.dropped = 0
        self._dropped_unreported = 0
        self._warned_at = float("-inf")

    def put(
        self, backend: Any, destination: str, type_: str, data: dict[str, Any], size: int
    ) -> None:
        """Queue one event for ``destination``; never waits for Redis."""
        with self._condition:
            self._start()
            if len(self._events) >= size:
                latest = self._latest.get((id(backend), destination))
                if type_ == "chunk" and latest is not None and latest.type == "chunk":
                    latest.data = {"text": latest.data["text"] + data["text"]}
                    return
                if type_ != "message":
                    self._drop(1)
                    return
                self._forget(self._events.popleft())
                self._drop(1)
            event = _Event(backend, destination, type_, data, next(self._numbers))
            self._queued = event.number
            self._events.append(event)
            self._latest[(id(backend), destination)] = event
            self._condition.notify_all()

    def flush(self, timeout: float) -> bool:
        """Wait until what was queued before this call is sent (or given up on); False
        when ``timeout`` seconds passed first."""
        deadline = time.monotonic() + timeout
        with self._condition:
            if self._thread is None or not self._thread.is_alive():
                return not self._events  # a forked child's copy: its sender is the parent's
            target = self._queued
            while self._sent < target and (self._events or self._in_flight):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._condition.wait(left)
            return True

    def discard(self, backend: Any, destination: str, timeout: float = 10.0) -> None:
        """Forget the queued events for ``destination`` (its chat was deleted), and wait for
        a batch holding one of them to be sent, so none lands after this."""
        deadline = time.monotonic() + timeout
        ours = (backend, destination)
        with self._condition:
            self._events = deque(e for e in self._events if (e.backend, e.destination) != ours)
            self._latest.pop((id(backend), destination), None)
            while any((e.backend, e.destination) == ours for e in self._in_flight):
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._condition.wait(left)

    # -- the sending thread ------------------------------------------------------------------
    def _start(self) -> None:
        # a sender that died (a bug, not Redis: send errors are caught) is started again,
        # so one fault can't stop a process's live events for good
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(
                target=self._run, name="agentloop-event-publisher", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._condition:
                while not self._events:
                    self._condition.wait()
            time.sleep(LINGER)
            with self._condition:
                batch = [self._events.popleft() for _ in range(min(BATCH, len(self._events)))]
                if not batch:  # discarded meanwhile (their chat was deleted)
                    continue
                for event in batch:
                    self._forget(event)
                self._in_flight = batch
            try:
                self._send(batch)
            except Exception:
                with self._condition:
                    self._drop(len(batch), exc_info=True)
            with self._condition:
                self._sent = batch[-1].number
                self._in_flight = []
                self._condition.notify_all()

    @staticmethod
    def _send(batch: list[_Event]) -> None:
        groups: dict[int, tuple[Any, list[tuple[str, str, dict[str, Any]]]]] = {}
        for event in batch:
            groups.setdefault(id(event.backend), (event.backend, []))[1].append(
                (event.destination, event.type, event.data)
            )
        for backend, events in groups.values():
            backend.publish_batch(events)

    def _forget(self, event: _Event) -> None:
        """``event`` left the queue: it can't take more text (called with the lock held)."""
        if self._latest.get((id(event.backend), event.destination)) is event:
            del self._latest[(id(event.backend), event.destination)]

    def _drop(self, count: int, *, exc_info: bool = False) -> None:
        """Count lost events; warn at most once per WARN_EVERY (called with the lock held)."""
        self.dropped += count
        self._dropped_unreported += count
        now = time.monotonic()
        if now - self._warned_at >= WARN_EVERY:
            logger.warning(
                "Dropped %d live events: Redis is slow or unreachable (the messages are in the "
                "database; pages show them when they reload)",
                self._dropped_unreported,
                exc_info=exc_info,
            )
            self._warned_at = now
            self._dropped_unreported = 0


def _new_publisher() -> Publisher:
    made = Publisher()
    atexit.register(made.flush, 2.0)  # a script's last events still go out
    return made


_publisher = PerProcess(_new_publisher)


def publisher() -> Publisher:
    """This process's publisher, made on first use (a forked child makes its own)."""
    return _publisher.get()

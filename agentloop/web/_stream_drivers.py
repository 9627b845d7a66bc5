"""Driving a stream written as a generator of steps: one sync driver, one async.

A live stream (the event stream of :mod:`agentloop.web._live`, the useChat stream of
:mod:`agentloop.web._ui_live`) is written once, as a generator that yields ``(kind, value)`` steps
and is sent each step's answer. A :data:`SEND` step carries bytes for the client and a
:data:`SLEEP` step waits; any other kind is done by the driver's handler of that name: in
place by :func:`drive` (a WSGI response holds its thread), awaited by :func:`adrive` (an
ASGI response holds none).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Generator,
    Hashable,
    Iterator,
    Mapping,
)
from typing import Any, TypeVar

__all__ = [
    "KEEPALIVE",
    "SEND",
    "SLEEP",
    "Pace",
    "SharedReads",
    "Step",
    "adrive",
    "drive",
    "shared_reads",
]

T = TypeVar("T")

#: the step that writes its bytes to the client.
SEND = "send"
#: the step that waits this many seconds.
SLEEP = "sleep"
#: an SSE comment sent after a quiet spell, which keeps proxies from closing the stream.
KEEPALIVE = b": keep-alive\n\n"
Step = tuple[str, Any]


class Pace:
    """A stream's sends: what was read, else a keep-alive once it has been quiet for
    ``keepalive`` seconds; then, for a source that keeps no events, a sleep to the next poll."""

    def __init__(self, keepalive: float) -> None:
        self.keepalive = keepalive
        self.quiet_since = time.monotonic()

    def send(
        self, frames: list[bytes], next_poll: float, keeps_events: bool
    ) -> Generator[Step, Any, None]:
        """The steps that send ``frames`` (or a keep-alive) and wait for the next poll."""
        if frames or time.monotonic() - self.quiet_since >= self.keepalive:
            yield SEND, b"".join(frames) if frames else KEEPALIVE
            self.quiet_since = time.monotonic()
        if not keeps_events:
            yield SLEEP, max(0.0, next_poll - time.monotonic())


class SharedReads:
    """What the open streams of a process read of the same chat, read once for all of them
    while it is younger than ``max_age`` seconds: a hundred streams of one chat make the
    queries of one. Values are shared: readers must not change them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[Hashable, tuple[float, Any]] = {}

    def get(self, key: Hashable, max_age: float, read: Callable[[], T], since: float) -> T:
        """The value read under ``key`` less than ``max_age`` seconds ago and not before
        ``since`` (a ``time.monotonic()``: a stream takes nothing read before it began, such
        as a state from before the message it follows), else ``read()``'s (two streams may
        read at once; the later one is kept)."""
        started = time.monotonic()
        with self._lock:
            found = self._values.get(key)
        if found is not None and found[0] >= since and started - found[0] < max_age:
            value: T = found[1]
            return value
        value = read()
        with self._lock:
            # Timed from before the read: it shows the chat as it was then, at the latest.
            self._values[key] = (started, value)
            if len(self._values) > 1000:  # streams come and go: drop what has aged
                for old in [k for k, (at, _) in self._values.items() if started - at >= max_age]:
                    del self._values[old]
        return value


#: the reads this process's streams share.
shared_reads = SharedReads()


def _advance(steps: Generator[Step, Any, None], answer: Any) -> Step | None:
    """The stream's next step, or None when it ends."""
    try:
        return steps.send(answer)
    except StopIteration:
        return None


def drive(
    steps: Generator[Step, Any, None], handlers: Mapping[str, Callable[[Any], Any]]
) -> Iterator[bytes]:
    """The stream's bytes, each other step done in this thread."""
    answer = None
    while (step := _advance(steps, answer)) is not None:
        if step[0] == SEND:
            yield step[1]
            answer = None
        elif step[0] == SLEEP:
            time.sleep(step[1])
            answer = None
        else:
            answer = handlers[step[0]](step[1])


async def adrive(
    steps: Generator[Step, Any, None], handlers: Mapping[str, Callable[[Any], Awaitable[Any]]]
) -> AsyncIterator[bytes]:
    """The stream's bytes, each other step awaited on the event loop."""
    answer = None
    while (step := _advance(steps, answer)) is not None:
        if step[0] == SEND:
            yield step[1]
            answer = None
        elif step[0] == SLEEP:
            await asyncio.sleep(step[1])
            answer = None
        else:
            answer = await handlers[step[0]](step[1])

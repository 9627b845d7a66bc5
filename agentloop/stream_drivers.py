"""Driving a stream written as a generator of steps: one sync driver, one async.

A live stream (the event stream of :mod:`agentloop.sse`, the useChat stream of
:mod:`agentloop.ui_live`) is written once, as a generator that yields ``(kind, value)`` steps
and is sent each step's answer. A :data:`SEND` step carries bytes for the client; any other
kind is done by the driver's handler of that name: in place by :func:`drive` (a WSGI
response holds its thread), awaited by :func:`adrive` (an ASGI response holds none).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator, Mapping
from typing import Any

__all__ = ["SEND", "Step", "adrive", "drive"]

#: the step that writes its bytes to the client.
SEND = "send"
Step = tuple[str, Any]


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
        else:
            answer = await handlers[step[0]](step[1])

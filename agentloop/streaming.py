"""Iterable runs: what ``chat.stream()`` and ``chat.astream()`` hand out (docs/streaming.md).

A run's events are a small union of frozen dataclasses, :data:`StreamEvent`:

- :class:`TextDeltaEvent`, :class:`ThinkingDeltaEvent`, :class:`ToolCallDeltaEvent`: a
  piece of a model answer as it streams in (the ``stream=`` callback's chunks);
- :class:`PartialOutputEvent`: a ``with_schema`` answer's structured output as it grows;
- :class:`ToolCallEvent`: a tool call the model asked for, once its answer is saved;
- :class:`ToolResultEvent`: a tool call's result, once it is saved;
- :class:`FinalMessageEvent`: the run's last message (what ``ask()``/``complete()``
  return), always the last event of a run that ended well.

A new kind of event is a dataclass here, added to :data:`StreamEvent` and made by
:class:`EventTap` (the one place the run's chunks and callbacks become events).

:class:`EventStream` and :class:`AsyncEventStream` wrap one run: iterate them, or use them
as (async) context managers, which close them on the way out. Closing one before its run
ended stops the run as ``cancel()`` would. No Django here: the engine imports this module.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Generator,
    Iterator,
)
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, TypeAlias, TypeVar

from .exceptions import CancelledError
from .messages import (
    Message,
    MessageStatus,
    PartialOutput,
    StreamUpdate,
    TextDelta,
    ThinkingDelta,
    ToolCall,
)

__all__ = [
    "AsyncEventStream",
    "EventStream",
    "EventTap",
    "FinalMessageEvent",
    "PartialOutputEvent",
    "StreamEvent",
    "TextDeltaEvent",
    "ThinkingDeltaEvent",
    "ToolCallDeltaEvent",
    "ToolCallEvent",
    "ToolResultEvent",
]

#: what the chat's verbs return: ``agentloop.Message`` in memory, a ``Message`` row when
#: persisted.
M = TypeVar("M")


@dataclass(frozen=True, slots=True)
class TextDeltaEvent:
    """A piece of a model answer's text, as it streams in."""

    text: str


@dataclass(frozen=True, slots=True)
class ThinkingDeltaEvent:
    """A piece of the model's readable thinking (``with_thinking``), apart from its text."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolCallDeltaEvent:
    """A piece of a tool call as the model writes it: ``id`` and ``name`` on a call's first
    piece, then its arguments' JSON text, piece by piece (``index`` tells calls apart)."""

    index: int
    id: str | None
    name: str | None
    arguments: str


@dataclass(frozen=True, slots=True)
class PartialOutputEvent:
    """A ``with_schema`` answer's structured output so far (``agentloop.messages.PartialOutput``:
    parsed and, with a pydantic model, valid as far as it goes), after the text piece that
    changed it; the final message's ``parsed`` is the validated whole."""

    value: Any


@dataclass(frozen=True, slots=True)
class ToolCallEvent:
    """A tool call the model asked for, once its answer is saved (before the call runs, or
    waits for a person): ``call.id``, ``call.name``, ``call.arguments``; ``call.key`` is the
    store's key (the ``ToolCall`` row's primary key for a persisted chat)."""

    call: ToolCall


@dataclass(frozen=True, slots=True)
class ToolResultEvent(Generic[M]):
    """A tool call's result, once it is saved: the tool message ``after_tool_result``
    callbacks get (an ``agentloop.Message`` in memory, a ``Message`` row when persisted)."""

    message: M


@dataclass(frozen=True, slots=True)
class FinalMessageEvent(Generic[M]):
    """The run's last message, what ``ask()`` or ``complete()`` would have returned: the
    answer, or (a run that now waits for a person) the last message it added."""

    message: M


#: one event of a run.
StreamEvent: TypeAlias = (
    TextDeltaEvent
    | ThinkingDeltaEvent
    | ToolCallDeltaEvent
    | PartialOutputEvent
    | ToolCallEvent
    | ToolResultEvent[M]
    | FinalMessageEvent[M]
)


def _chunk_event(chunk: StreamUpdate) -> Any:
    if isinstance(chunk, TextDelta):
        return TextDeltaEvent(chunk.text)
    if isinstance(chunk, ThinkingDelta):
        return ThinkingDeltaEvent(chunk.text)
    if isinstance(chunk, PartialOutput):
        return PartialOutputEvent(chunk.value)
    return ToolCallDeltaEvent(chunk.index, chunk.id, chunk.name, chunk.arguments)


class EventTap:
    """Turns one run's streamed chunks and callbacks into events, in the order they happen.

    ``on_chunk`` is the run's ``stream=`` callback; ``listen`` gets every callback of the
    chat (``Callbacks.listening``). A database phase of an async run may call them on
    another thread: the events wait in a thread-safe deque, and ``wake`` (when set) is
    called after each one is added."""

    def __init__(self) -> None:
        self.events: deque[Any] = deque()
        self.wake: Callable[[], None] | None = None
        #: the consumer left: the run's events are dropped from now on.
        self.closed = False

    def add(self, event: Any) -> None:
        """Keep ``event`` for the consumer."""
        if self.closed:
            return
        self.events.append(event)
        if self.wake is not None:
            self.wake()

    def on_chunk(self, chunk: StreamUpdate) -> None:
        """The run's stream callback: each chunk (and partial output), as an event."""
        self.add(_chunk_event(chunk))

    def listen(self, event: str, *args: Any) -> None:
        """Every callback of the run: answers that ask for tools, tool results."""
        if event == "answer_saved":
            message: Message = args[0]
            if message.status != MessageStatus.BLOCKED:  # a blocked answer's calls never run
                for call in message.tool_calls:
                    # A copy: the engine's goes on changing (running, succeeded).
                    self.add(ToolCallEvent(call.model_copy(deep=True)))
        elif event == "after_tool_result":
            self.add(ToolResultEvent(args[0]))

    def close(self) -> None:
        """The consumer left: drop what it didn't take, and what comes from now on."""
        self.closed = True
        self.wake = None
        self.events.clear()

    def take(self) -> list[Any]:
        """The events so far, oldest first; they are handed out once."""
        taken = []
        while self.events:
            taken.append(self.events.popleft())
        return taken


class EventStream(Generic[M]):
    """One run, as an iterator of its events (``for event in chat.stream(...)``).

    The run starts at the first ``next()`` and goes on in this thread between two events:
    your loop's body runs while the run waits for it. An error of the run is raised from
    the iterator after the events that came before it. ``result`` is the last message once
    the run ended. ``close()`` (or leaving a ``with`` block, or breaking out of a ``for``
    loop over the call) stops a run that hasn't ended as ``cancel()`` would. Iterate it from
    one thread: the run's database work is done on the thread that iterates.
    """

    def __init__(self, events: Generator[Any, None, Any]) -> None:
        self._events = events
        #: the run's last message, once it ended (None before, or when it failed).
        self.result: M | None = None

    def __iter__(self) -> Iterator[StreamEvent[M]]:
        return self

    def __next__(self) -> StreamEvent[M]:
        event: StreamEvent[M] = next(self._events)
        if isinstance(event, FinalMessageEvent):
            self.result = event.message
        return event

    def close(self) -> None:
        """Stop the run (a cancel, recorded as ``cancel()`` records one) if it hasn't ended;
        a no-op after its end."""
        self._events.close()

    def __enter__(self) -> EventStream[M]:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class AsyncEventStream(Generic[M]):
    """One run, as an async iterator of its events (``async for event in chat.astream(...)``).

    The run starts at the first ``__anext__`` and goes on as a task of this event loop while
    you handle its events; at each streamed chunk it waits until you took the events so far,
    so it is never more than a chunk ahead of you. ``aclose()`` (or leaving an ``async
    with`` block) stops a run that hasn't ended as ``cancel()`` would; a stream dropped
    unfinished (a ``break`` out of ``async for``) is closed by the event loop soon after,
    like any async generator.
    """

    def __init__(
        self,
        start: Callable[[EventTap, Callable[[StreamUpdate], Awaitable[None]]], Awaitable[M]],
        stop: Callable[[], Awaitable[Any]],
    ) -> None:
        # A function of its own, not a method: the generator holds no reference to this
        # object, so dropping the stream (a ``break``) lets the event loop close it.
        self._generator: AsyncGenerator[Any, None] = _run_async(start, stop)
        #: the run's last message, once it ended (None before, or when it failed).
        self.result: M | None = None

    def __aiter__(self) -> AsyncIterator[StreamEvent[M]]:
        return self

    async def __anext__(self) -> StreamEvent[M]:
        event: StreamEvent[M] = await self._generator.__anext__()
        if isinstance(event, FinalMessageEvent):
            self.result = event.message
        return event

    async def aclose(self) -> None:
        """``EventStream.close()`` for async code."""
        await self._generator.aclose()

    async def __aenter__(self) -> AsyncEventStream[M]:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()


async def _run_async(
    start: Callable[[EventTap, Callable[[StreamUpdate], Awaitable[None]]], Awaitable[Any]],
    stop: Callable[[], Awaitable[Any]],
) -> AsyncGenerator[Any, None]:
    """An async run's events: the run as a task, each chunk waiting until they were taken."""
    tap = EventTap()
    loop = asyncio.get_running_loop()
    arrived = asyncio.Event()  # events came, or the run ended
    taken = asyncio.Event()  # the consumer took the events so far

    def wake() -> None:
        # A database phase may run on a thread of its own (the Django store's).
        loop.call_soon_threadsafe(arrived.set)

    async def on_chunk(chunk: StreamUpdate) -> None:
        tap.on_chunk(chunk)
        while tap.events and not tap.closed:
            taken.clear()
            await taken.wait()

    tap.wake = wake
    run: asyncio.Future[Any] = asyncio.ensure_future(start(tap, on_chunk))
    run.add_done_callback(lambda _: arrived.set())
    try:
        while True:
            arrived.clear()
            events = tap.take()
            for event in events:
                yield event
            taken.set()
            if not events:
                if run.done():
                    break
                await arrived.wait()
        yield FinalMessageEvent(run.result())  # the run's error, after the events before it
    finally:
        tap.close()
        taken.set()
        if not run.done():
            await stop()
            try:
                await run
            except CancelledError:
                pass  # the cancel that closing asked for
        elif not run.cancelled():
            run.exception()  # seen (the consumer left before it was raised)

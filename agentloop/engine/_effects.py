"""The I/O a verb asks its driver for, streamed answers, and the one backoff policy.

The verbs' decisions and database phases are written once, as generators that yield these
effects; a sync driver and an async driver perform them (:mod:`._drivers`). A verb's
generator runs its database phases itself (between two yields) and hands out only the
waiting: a model request, a backoff sleep, a tool run. What an effect returns is sent back
into the generator; what it raises is thrown into it, at the ``yield``, so the verb's own
``try``/``except`` handle it exactly as if the call had been made in place.

A streamed answer is collected here: chunks forwarded, cancellation checked, partials saved;
a ``with_schema`` answer's JSON parsed as it grows (:class:`OutputParser`), its
``PartialOutput`` forwarded after the chunk that changed it.
While input guardrails judge the message during the call (``run_in_parallel``), chunks are
held: not forwarded, no partial saved, so nothing of an answer to a message they block is
shown or kept. They go out once the guardrails pass.

The backoff policy (how long to wait before trying a failed model call again) is used twice
with the same rules: between the retries of one model call inside a step
(``MODEL_RETRIES``), and by background jobs between attempts of a step (``STEP_RETRIES``).
"""

from __future__ import annotations

import inspect
import random
import time
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic_core import from_json

from ..conf import agentloop_settings
from ..exceptions import ProviderError
from ..messages import Chunk, ModelRequest, PartialOutput, StreamUpdate, TextDelta, ToolCall
from ..providers.base import Provider
from ._runs import Checkpoints
from .store import ChatStore

if TYPE_CHECKING:
    from ._judging import Judging, Panel
    from ._runs import Checkpoints

__all__ = [
    "AwaitJudging",
    "Effects",
    "Judge",
    "Launch",
    "OutputParser",
    "Pause",
    "RunTool",
    "Send",
    "Sleep",
    "StartJudging",
    "StreamCallback",
    "StreamState",
    "WaitAny",
    "backoff",
    "retry_delay",
]


def backoff(
    attempt: int,
    retry_after: float | None = None,
    *,
    cap: float | None = None,
    outage: bool = False,
) -> float:
    """Seconds to wait before retry number ``attempt + 1``.

    The provider's ``Retry-After`` wins, up to ``RETRY_AFTER_MAX``; otherwise exponential
    from ``RETRY_BACKOFF`` with full jitter (spreads many workers hitting the same limit),
    up to ``cap`` (default ``RETRY_BACKOFF_MAX``). ``outage`` (the database can't be
    reached): at least half the exponential wait, so a few tries span an outage of seconds
    (full jitter alone can spend them all within one).
    """
    if retry_after is not None:
        return max(0.0, min(float(retry_after), agentloop_settings.RETRY_AFTER_MAX))
    limit = agentloop_settings.RETRY_BACKOFF_MAX if cap is None else cap
    base = agentloop_settings.RETRY_BACKOFF * (2**attempt)
    return min(random.uniform(base / 2 if outage else 0, base), limit)  # noqa: S311


def retry_delay(attempt: int, error: BaseException) -> float | None:
    """Within a step: the wait before retrying ``error`` (None when it is not transient).

    Capped at ``RETRY_BACKOFF_MAX`` so one step never sleeps long; between background jobs
    :func:`backoff` honours ``Retry-After`` up to ``RETRY_AFTER_MAX`` instead.
    """
    if not isinstance(error, ProviderError) or not error.retryable:
        return None
    return min(backoff(attempt, error.retry_after), agentloop_settings.RETRY_BACKOFF_MAX)


#: called with each chunk of a streamed answer, and a ``with_schema`` answer's partials
#: (``PartialOutput``); for async verbs it may be ``async def``.
StreamCallback = Callable[[StreamUpdate], Any]

#: a streamed answer is parsed again only once it grew by this fraction (1/N) of its length
#: since the last parse: the parses of an answer cost about N times its length in all, not
#: one parse of the whole text per delta (quadratic: seconds for a 20 KB answer).
REPARSE_FRACTION = 32
#: up to this many characters every delta is parsed (short answers show every change).
ALWAYS_PARSED = 512
#: what a number may be written with: one at the very end may not be finished.
_NUMBER_CHARACTERS = frozenset("0123456789+-.eE")
#: no value parsed (not JSON yet, or not valid against the model).
_NOTHING: Any = object()


@lru_cache(maxsize=64)
def _adapter(model: type[BaseModel]) -> TypeAdapter[Any]:
    return TypeAdapter(model)


def _settled(text: str) -> str:
    """``text`` without a number it ends with (``{"age": 3`` may go on as 30)."""
    start = len(text)
    while start > 0 and text[start - 1] in _NUMBER_CHARACTERS:
        start -= 1
    if start == len(text) or not text[:start].rstrip().endswith((":", ",", "[")):
        return text
    return text[:start]


class OutputParser:
    """A ``with_schema`` answer's JSON, parsed as its text streams in.

    pydantic-core's partial mode reads the text so far (open objects and lists closed, the
    last string cut where it is); with a pydantic model, the value is validated in pydantic's
    partial mode and kept only when nothing but fields still to come is missing. A value is
    reported only when it differs from the last one reported. Text that isn't JSON (yet, or
    at all) reports nothing and never raises: the final answer is parsed and validated as
    always once it is complete.
    """

    def __init__(self, model: type[BaseModel] | None) -> None:
        self.adapter = _adapter(model) if model is not None else None
        self.parts: list[str] = []
        self.size = 0
        self.parsed_size = 0
        self.last: Any = _NOTHING

    def feed(self, text: str) -> PartialOutput | None:
        """A delta's text; the new partial when it is parsed now and changed."""
        if not text:
            return None
        self.parts.append(text)
        self.size += len(text)
        grown = self.size - self.parsed_size
        if self.size > ALWAYS_PARSED and grown * REPARSE_FRACTION < self.size:
            return None  # parsed again once it has grown enough (or at the end)
        return self.flush()

    def flush(self, *, ended: bool = False) -> PartialOutput | None:
        """Parse what came since the last parse; the new partial. ``ended``: the stream is
        over, so a number the text ends with is finished too."""
        if self.parsed_size == self.size and not ended:
            return None
        self.parsed_size = self.size
        text = "".join(self.parts)
        self.parts = [text]
        value = self._value(text if ended else _settled(text))
        if value is _NOTHING or value == self.last:
            return None
        self.last = value
        return PartialOutput(value=value)

    def _value(self, text: str) -> Any:
        try:
            value = from_json(text, allow_partial="trailing-strings")
        except ValueError:
            return _NOTHING  # not JSON (yet): a blank start, prose before the object
        if self.adapter is None:
            return value
        try:
            self.adapter.validate_python(value, experimental_allow_partial="trailing-strings")
        except ValidationError as exc:
            if any(error["type"] != "missing" for error in exc.errors()):
                return _NOTHING  # wrong already: the final validation says so
        return value


#: runs a database phase of an async verb (``ChatStore.run_phase``).
Phase = Callable[..., Awaitable[Any]]


class StreamState:
    """Collects a streamed answer: forwards chunks, checks cancellation, saves partials."""

    def __init__(
        self,
        store: ChatStore,
        checkpoints: Checkpoints,
        stream: StreamCallback | None,
        model: str,
        judging: Judging | None = None,
        output: OutputParser | None = None,
    ) -> None:
        self.store = store
        self.checkpoints = checkpoints
        self.stream = stream
        self.model = model
        self.parts: list[str] = []
        self.partial_key: Any = None
        self.interval = agentloop_settings.PARTIAL_SAVE_INTERVAL
        #: when the text was last saved; None until the first chunk: the interval counts
        #: seconds of streaming, not the wait for the model's first byte.
        self._last_save: float | None = None
        #: input guardrails judging meanwhile: chunks are held until they pass.
        self.judging = judging
        self.held: list[StreamUpdate] = []
        #: a ``with_schema`` answer's JSON, parsed as it grows (None: no schema).
        self.output = output

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def _holding(self) -> bool:
        """Chunks wait while guardrails judge; once they passed, the held ones go first."""
        if self.judging is None:
            return False
        if not self.judging.passed:
            return True
        self.judging = None
        return False

    def on_chunk(self, chunk: Chunk) -> None:
        """A chunk of a sync request: forwarded (with the partial output it makes), kept,
        then the checkpoint."""
        holding = self._holding()
        if not holding:
            self.release()
        save = self._collect(chunk)
        events = self._events(chunk)
        if holding:
            self.held += events
            self.checkpoints.check(force=False)
            return
        self._forward(events)
        self._after(save)

    async def aon_chunk(self, chunk: Chunk, phase: Phase) -> None:
        """A chunk of an async request: the callback (sync or ``async def``) runs on the
        loop; the partial save and the checkpoint, when due, run as a database phase."""
        holding = self._holding()
        if not holding:
            await self.arelease()
        save = self._collect(chunk)
        events = self._events(chunk)
        if holding:
            self.held += events
            if self.checkpoints.due():
                await phase(partial(self.checkpoints.check, force=False))
            return
        await self._aforward(events)
        if save or self.checkpoints.due():
            await phase(self._after, save)

    def finish(self) -> None:
        """The stream ended: the last partial output, when the last parse was skipped."""
        self._forward(self._last_output())

    async def afinish(self) -> None:
        """``finish`` for an async verb."""
        await self._aforward(self._last_output())

    def _last_output(self) -> list[StreamUpdate]:
        """The partial output still to send when the stream ends: none when the last parse
        ran, held (and none now) while a guardrail judges."""
        last = self.output.flush(ended=True) if self.output is not None else None
        if last is None:
            return []
        if self._holding():
            self.held.append(last)
            return []
        return [last]

    def release(self) -> None:
        """The guardrails passed: the chunks held meanwhile go out, in order."""
        self.judging = None
        held, self.held = self.held, []
        self._forward(held)

    async def arelease(self) -> None:
        """``release`` for an async verb (the callback may be ``async def``)."""
        self.judging = None
        held, self.held = self.held, []
        await self._aforward(held)

    def _events(self, chunk: Chunk) -> list[StreamUpdate]:
        """The chunk, and the partial output its text changed."""
        if self.output is None or not isinstance(chunk, TextDelta):
            return [chunk]
        grown = self.output.feed(chunk.text)
        return [chunk] if grown is None else [chunk, grown]

    def _forward(self, events: list[StreamUpdate]) -> None:
        if self.stream is not None:
            for event in events:
                self.stream(event)

    async def _aforward(self, events: list[StreamUpdate]) -> None:
        if self.stream is not None:
            for event in events:
                result = self.stream(event)
                if inspect.isawaitable(result):
                    await result

    def _collect(self, chunk: Chunk) -> bool:
        """Keep the chunk's text; True when a partial save is due."""
        if self._last_save is None:
            self._last_save = time.monotonic()
        if isinstance(chunk, TextDelta) and chunk.text:
            self.parts.append(chunk.text)
            return time.monotonic() - self._last_save >= self.interval
        return False

    def _after(self, save: bool) -> None:
        if save:
            # Long answers become visible (and survive a crash) as a marked partial.
            self.partial_key = self.store.transcript.save_partial(
                self.text, self.partial_key, self.model
            )
            self._last_save = time.monotonic()
        self.checkpoints.check(force=False)
        # The save or the cancel read took a connection again: the answer still streams.
        self.store.before_wait()


T = TypeVar("T")


#: a verb (or a part of one) written as a generator of effects, returning ``T``.
Effects = Generator[Any, Any, T]


@dataclass
class Send:
    """One provider request; with ``state`` it streams into it. Returns the ModelResponse.

    The driver bounds it (:mod:`._drivers`): a slot of the provider's concurrency limit, a
    total deadline, and ``checkpoints`` to stop it at a cancel."""

    provider: Provider
    request: ModelRequest
    state: StreamState | None
    checkpoints: Checkpoints | None = None
    #: the name the provider is registered under (limits and timeouts are set by it).
    provider_name: str = ""
    #: input guardrails judging meanwhile: the call is abandoned when their verdict won't
    #: let it stand (``CallAbandoned``), and its stream is held until they pass.
    judging: Judging | None = None


@dataclass
class Pause:
    """A point where a run iterated by ``chat.stream()`` hands its events out before going on:
    a tool round, before any of its calls is started (so leaving the stream at a call the
    model asked for keeps it from running). The other drivers go on at once. Returns None;
    a stream closed meanwhile raises the run's cancel here (``checkpoints``)."""

    checkpoints: Checkpoints


@dataclass
class Sleep:
    """A backoff between two attempts."""

    seconds: float


@dataclass
class RunTool:
    """Run one tool call (validated, errors turned into outcomes). Returns a ToolOutcome."""

    tool_class: Any
    call: ToolCall
    chat: Any
    background: bool
    cancel_check: Callable[[], bool]
    #: wraps work run on a thread of its own (the Django store closes its connections).
    wrap: Callable[[Callable[[], Any]], Callable[[], Any]]


@dataclass
class Launch:
    """Start ``tool`` alongside others (at most ``size`` at once). Returns a handle."""

    tool: RunTool
    size: int


@dataclass
class WaitAny:
    """Wait until one of the launched ``handles`` finishes. Returns ``[(handle, outcome)]``."""

    handles: list[Any]


@dataclass
class Judge:
    """Run guardrails on ``panels`` (:mod:`._judging`), in order, each within its time
    limit. Returns their verdicts; a cancel seen meanwhile (``checkpoints``) raises."""

    panels: list[Panel]
    #: wraps a sync check run on a thread of its own (the Django store closes connections).
    wrap: Callable[[Callable[[], Any]], Callable[[], Any]]
    #: the run's checkpoints, looked at while a check decides (None: no cancel is watched).
    checkpoints: Checkpoints | None = None


@dataclass
class StartJudging:
    """Start ``judge`` while the verb goes on (the model call). Returns ``judging``."""

    judge: Judge
    judging: Judging


@dataclass
class AwaitJudging:
    """Wait for ``judging``'s verdicts; when they pass, a stream ``state`` held meanwhile
    gets its chunks. Returns the verdicts; a cancel seen meanwhile (``checkpoints``)
    raises."""

    judging: Judging
    state: StreamState | None = None
    checkpoints: Checkpoints | None = None

"""The I/O a verb asks its driver for, streamed answers, and the one backoff policy.

The verbs' decisions and database phases are written once, as generators that yield these
effects; a sync driver and an async driver perform them (:mod:`._drivers`). A verb's
generator runs its database phases itself (between two yields) and hands out only the
waiting: a model request, a backoff sleep, a tool run. What an effect returns is sent back
into the generator; what it raises is thrown into it, at the ``yield``, so the verb's own
``try``/``except`` handle it exactly as if the call had been made in place.

A streamed answer is collected here: chunks forwarded, cancellation checked, partials saved.
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
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from ..conf import agentloop_settings
from ..exceptions import ProviderError
from ..messages import Chunk, ModelRequest, TextDelta, ToolCall
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


#: called with each chunk of a streamed answer; for async verbs it may be ``async def``.
StreamCallback = Callable[[Chunk], Any]


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
        self.held: list[Chunk] = []

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
        """A chunk of a sync request: forwarded, kept, then the checkpoint."""
        if self._holding():
            self.held.append(chunk)
            self._collect(chunk)
            self.checkpoints.check(force=False)
            return
        self.release()
        if self.stream is not None:
            self.stream(chunk)
        self._after(self._collect(chunk))

    async def aon_chunk(self, chunk: Chunk, phase: Phase) -> None:
        """A chunk of an async request: the callback (sync or ``async def``) runs on the
        loop; the partial save and the checkpoint, when due, run as a database phase."""
        if self._holding():
            self.held.append(chunk)
            self._collect(chunk)
            if self.checkpoints.due():
                await phase(partial(self.checkpoints.check, force=False))
            return
        await self.arelease()
        if self.stream is not None:
            result = self.stream(chunk)
            if inspect.isawaitable(result):
                await result
        save = self._collect(chunk)
        if save or self.checkpoints.due():
            await phase(self._after, save)

    def release(self) -> None:
        """The guardrails passed: the chunks held meanwhile go out, in order."""
        self.judging = None
        held, self.held = self.held, []
        if self.stream is not None:
            for chunk in held:
                self.stream(chunk)

    async def arelease(self) -> None:
        """``release`` for an async verb (the callback may be ``async def``)."""
        self.judging = None
        held, self.held = self.held, []
        if self.stream is not None:
            for chunk in held:
                result = self.stream(chunk)
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

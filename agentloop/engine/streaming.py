"""Collecting a streamed answer: forwarding chunks, checking cancellation, saving partials.

While input guardrails judge the message during the call (``run_in_parallel``), chunks are
held: not forwarded, no partial saved, so nothing of an answer to a message they block is
shown or kept. They go out once the guardrails pass.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from ..conf import agentloop_settings
from ..messages import Chunk, TextDelta
from .checkpoints import Checkpoints
from .store import ChatStore

if TYPE_CHECKING:  # the judging's type only (guarding imports the store too)
    from .judging import Judging

__all__ = ["StreamCallback", "StreamState"]

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

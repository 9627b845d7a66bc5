"""Collecting a streamed answer: forwarding chunks, checking cancellation, saving partials."""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ..conf import agentloop_settings
from ..messages import Chunk, TextDelta
from .checkpoints import Checkpoints
from .store import ChatStore

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

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def on_chunk(self, chunk: Chunk) -> None:
        """A chunk of a sync request: forwarded, kept, then the checkpoint."""
        if self.stream is not None:
            self.stream(chunk)
        self._after(self._collect(chunk))

    async def aon_chunk(self, chunk: Chunk, phase: Phase) -> None:
        """A chunk of an async request: the callback (sync or ``async def``) runs on the
        loop; the partial save and the checkpoint, when due, run as a database phase."""
        if self.stream is not None:
            result = self.stream(chunk)
            if inspect.isawaitable(result):
                await result
        save = self._collect(chunk)
        if save or self.checkpoints.due():
            await phase(self._after, save)

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
            self.partial_key = self.store.save_partial(self.text, self.partial_key, self.model)
            self._last_save = time.monotonic()
        self.checkpoints.check(force=False)
        # The save or the cancel read took a connection again: the answer still streams.
        self.store.before_wait()

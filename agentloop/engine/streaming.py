"""Collecting a streamed answer: forwarding chunks, checking cancellation, saving partials."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..conf import agentloop_settings
from ..messages import Chunk, TextDelta
from .checkpoints import Checkpoints
from .store import ChatStore

__all__ = ["StreamCallback", "StreamState"]

StreamCallback = Callable[[Chunk], None]


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
        self._last_save = time.monotonic()

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def on_chunk(self, chunk: Chunk) -> None:
        if self.stream is not None:
            self.stream(chunk)
        if isinstance(chunk, TextDelta) and chunk.text:
            self.parts.append(chunk.text)
            now = time.monotonic()
            if now - self._last_save >= self.interval:
                # Long answers become visible (and survive a crash) as a marked partial.
                self.partial_key = self.store.save_partial(self.text, self.partial_key, self.model)
                self._last_save = now
        self.checkpoints.check(force=False)

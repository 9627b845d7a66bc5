"""The provider interface: one request method, with an optional chunk callback.

A provider turns a :class:`~agentloop.messages.ModelRequest` into a
:class:`~agentloop.messages.ModelResponse`. When ``on_chunk`` is given the
provider streams and calls it with each :data:`~agentloop.messages.Chunk` as it
arrives; the engine uses those calls as cancellation checkpoints, so a provider
must let exceptions raised by ``on_chunk`` propagate (after closing its stream).

``arequest`` is the same call for async verbs; by default it runs ``request`` on a thread
of its own, so every provider works there unchanged (``HTTPProvider`` speaks async HTTP).
"""

from __future__ import annotations

import asyncio
import threading
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from decimal import Decimal

from asgiref.sync import sync_to_async

from ..exceptions import CancelledError
from ..messages import Chunk, ModelRequest, ModelResponse, TokenUsage

__all__ = ["AsyncChunkCallback", "ChunkCallback", "Provider"]

ChunkCallback = Callable[[Chunk], None]
AsyncChunkCallback = Callable[[Chunk], Awaitable[None]]


class Provider(ABC):
    """Base class of model providers."""

    #: the name used in "provider:model" strings and usage rows.
    name: str = ""

    @abstractmethod
    def request(
        self, request: ModelRequest, *, on_chunk: ChunkCallback | None = None
    ) -> ModelResponse:
        """Make one model call (stream it when ``on_chunk`` is given) and return the answer."""

    async def arequest(
        self, request: ModelRequest, *, on_chunk: AsyncChunkCallback | None = None
    ) -> ModelResponse:
        """``request()`` for async verbs; ``on_chunk`` is awaited for each chunk.

        This default runs ``request`` on a thread (never on the event loop: it blocks) and
        brings each chunk back to the loop, where ``on_chunk`` runs; what ``on_chunk``
        raises (a cancel) is raised inside ``request`` at that chunk, as in a sync call."""
        call = sync_to_async(self.request, thread_sensitive=False)
        if on_chunk is None:
            return await call(request)
        loop = asyncio.get_running_loop()
        abandoned = threading.Event()

        async def forward(chunk: Chunk) -> None:
            await on_chunk(chunk)

        def each(chunk: Chunk) -> None:
            if abandoned.is_set():
                # No one awaits the answer any more: stop streaming it (closes the stream).
                raise CancelledError("The task awaiting this request was cancelled.")
            # Run on this loop, in the verb's context (not asgiref's async_to_sync, which
            # would make the verb's database phases run on this request's thread).
            asyncio.run_coroutine_threadsafe(forward(chunk), loop).result()

        try:
            return await call(request, on_chunk=each)
        except asyncio.CancelledError:
            abandoned.set()
            raise

    def cost(self, model: str, usage: TokenUsage) -> Decimal | None:
        """The price of ``usage`` on ``model``, or None when it is not known."""
        return None

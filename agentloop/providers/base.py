"""The provider interface: one request method, with an optional chunk callback.

A provider turns a :class:`~agentloop.messages.ModelRequest` into a
:class:`~agentloop.messages.ModelResponse`. When ``on_chunk`` is given the
provider streams and calls it with each :data:`~agentloop.messages.Chunk` as it
arrives; the engine uses those calls as cancellation checkpoints, so a provider
must let exceptions raised by ``on_chunk`` propagate (after closing its stream).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from decimal import Decimal

from ..messages import Chunk, ModelRequest, ModelResponse, TokenUsage

__all__ = ["ChunkCallback", "Provider"]

ChunkCallback = Callable[[Chunk], None]


class Provider(ABC):
    """Base class of model providers."""

    #: the name used in "provider:model" strings and usage rows.
    name: str = ""

    @abstractmethod
    def request(
        self, request: ModelRequest, *, on_chunk: ChunkCallback | None = None
    ) -> ModelResponse:
        """Make one model call (stream it when ``on_chunk`` is given) and return the answer."""

    def cost(self, model: str, usage: TokenUsage) -> Decimal | None:
        """The price of ``usage`` on ``model``, or None when it is not known."""
        return None

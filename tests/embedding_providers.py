"""Embedding providers for tests: the offline hash embeddings, refused after a number of
requests (a provider gone bad mid-run), at the provider's edge as a real one fails."""

from __future__ import annotations

from typing import Any

from agentloop.embeddings.vendors import OfflineEmbeddingProvider, OfflineWire
from agentloop.exceptions import BadRequestError


class FlakyEmbeddings(OfflineEmbeddingProvider):
    """The offline embeddings, refused after ``allowed`` requests (a provider gone bad
    mid-run: BadRequestError is not retried)."""

    def __init__(self, allowed: int) -> None:
        super().__init__(name="flaky")
        self.allowed = allowed
        self.requests = 0

    def embedding_wire(self, model: str) -> Any:
        provider = self

        class Wire(OfflineWire):
            max_batch = 3

            def call(self, inputs: Any, dimensions: Any, single: bool) -> Any:
                provider.requests += 1
                if provider.requests > provider.allowed:
                    raise BadRequestError("the provider refused this batch", status=400)
                return super().call(inputs, dimensions, single)

        return Wire("hash-embedding")

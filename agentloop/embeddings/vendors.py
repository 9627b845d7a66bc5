"""Providers that ``agentloop.embed`` knows beyond the chat families: Cohere, Mistral and
Perplexity by name, and ``offline``'s deterministic hash embeddings (tests, the demo).

They are made on first use when no provider of that name is registered or configured
(:data:`EMBEDDING_BUILTINS`); a provider registered or configured under the name wins.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from ..exceptions import ConfigurationError
from ..messages import ModelRequest, ModelResponse, TokenUsage
from ..providers.base import ChunkCallback, Provider
from ..providers.http import HTTPProvider
from ..providers.openai import OpenAIProvider
from .wires import CohereWire, Parsed, Parts, Wire

__all__ = [
    "EMBEDDING_BUILTINS",
    "CohereProvider",
    "MistralProvider",
    "OfflineEmbeddingProvider",
    "PerplexityProvider",
    "hash_embedding",
]


class _EmbeddingsOnly:
    """A provider agentloop uses for embeddings only: a chat on it is a clear error."""

    name: str

    def request(
        self, request: ModelRequest, *, on_chunk: ChunkCallback | None = None
    ) -> ModelResponse:
        raise ConfigurationError(
            f"Provider {self.name!r} serves embeddings only in agentloop (agentloop.embed); "
            "a chat needs another provider."
        )


class CohereProvider(_EmbeddingsOnly, HTTPProvider):
    """Cohere's API (``https://api.cohere.com``), for ``embed``: ``cohere:embed-v4.0``."""

    name = "cohere"
    default_base_url = "https://api.cohere.com"
    api_key_env = ("COHERE_API_KEY", "CO_API_KEY")

    def embedding_wire(self, model: str) -> Wire:
        return CohereWire(self, model)


class MistralProvider(OpenAIProvider):
    """Mistral's OpenAI-compatible API (``https://api.mistral.ai/v1``)."""

    name = "mistral"
    default_base_url = "https://api.mistral.ai/v1"
    api_key_env = ("MISTRAL_API_KEY",)
    base_url_env = ()


class PerplexityProvider(OpenAIProvider):
    """Perplexity's OpenAI-compatible API (``https://api.perplexity.ai/v1``); its embeddings
    come as base64 int8 vectors, read as numbers from -128 to 127."""

    name = "perplexity"
    default_base_url = "https://api.perplexity.ai/v1"
    api_key_env = ("PERPLEXITY_API_KEY", "PPLX_API_KEY")
    base_url_env = ()


# -- offline ---------------------------------------------------------------------------------------
#: the offline model's dimensions unless ``dimensions`` asks for others.
OFFLINE_DIMENSIONS = 256
_WORDS = re.compile(r"\w+", re.UNICODE)


def _slot(feature: str, dimensions: int) -> tuple[int, float]:
    """The coordinate a feature adds to and its sign, from a stable hash (the same in every
    process, unlike ``hash()``)."""
    digest = hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest()
    number = int.from_bytes(digest, "big")
    return number % dimensions, (1.0 if number >> 63 else -1.0)


def hash_embedding(text: str, dimensions: int = OFFLINE_DIMENSIONS) -> tuple[list[float], int]:
    """A deterministic unit vector for ``text`` and its word count: each lower-cased word,
    and each of its character trigrams (at half weight, so "recall" and "recalls" are
    near), is hashed into one of ``dimensions`` coordinates with a sign. Texts sharing words
    point the same way; a text without words is the zero vector."""
    vector = [0.0] * dimensions
    words = _WORDS.findall(text.lower())
    for word in words:
        index, sign = _slot("w:" + word, dimensions)
        vector[index] += sign
        padded = f"<{word}>"
        for start in range(len(padded) - 2):
            index, sign = _slot("t:" + padded[start : start + 3], dimensions)
            vector[index] += 0.5 * sign
    norm = math.sqrt(sum(value * value for value in vector))
    return ([value / norm for value in vector] if norm else vector), len(words)


class OfflineWire(Wire):
    """Hash embeddings computed here: no network, no key, the same vector every time."""

    max_batch = 2048

    def call(self, inputs: list[Parts], dimensions: int | None, single: bool) -> Parsed:
        size = OFFLINE_DIMENSIONS if dimensions is None else dimensions
        if size < 1 or size > 16_000:
            raise ConfigurationError(
                f"offline:{self.model} makes vectors of 1 to 16000 dimensions, not {size}"
            )
        vectors, tokens = [], 0
        for parts in inputs:
            if any(not isinstance(part, str) for part in parts):
                raise ConfigurationError(f"offline:{self.model} embeds text only")
            vector, words = hash_embedding("".join(str(part) for part in parts), size)
            vectors.append(vector)
            tokens += words
        return Parsed(vectors, tokens, Decimal(0))

    async def acall(self, inputs: list[Parts], dimensions: int | None, single: bool) -> Parsed:
        return self.call(inputs, dimensions, single)


class OfflineEmbeddingProvider(_EmbeddingsOnly, Provider):
    """``offline:hash-embedding``: deterministic embeddings made in this process (free)."""

    name = "offline"
    #: the models it makes (one: the hash embedding).
    models = ("hash-embedding",)

    def __init__(self, *, name: str | None = None, **options: Any) -> None:
        if name:
            self.name = name

    def embedding_wire(self, model: str) -> Wire:
        if model not in self.models:
            raise ConfigurationError(
                f"The offline provider's embedding model is 'hash-embedding', not {model!r}."
            )
        return OfflineWire(model)

    def cost(self, model: str, usage: TokenUsage) -> Decimal | None:
        return Decimal(0)


#: embedding providers made on first use by name, when none is registered or configured.
EMBEDDING_BUILTINS: dict[str, Callable[..., Provider]] = {
    "cohere": CohereProvider,
    "mistral": MistralProvider,
    "perplexity": PerplexityProvider,
    "offline": OfflineEmbeddingProvider,
}

"""Embeddings: ``agentloop.embed(texts, model=..., dimensions=None)`` and ``aembed``.

Every provider family that has embeddings is spoken to over the HTTP client of its chat
provider (same keys, endpoints, errors and retries): OpenAI and compatible servers
(OpenRouter, Ollama, Mistral, Perplexity), Gemini, Vertex AI, Bedrock (Titan, Nova and
Cohere bodies), Azure AI Foundry and Cohere, plus ``offline:hash-embedding``, computed here
(deterministic, free: tests and the demo). Inputs are sent in batches of each API's limit
(:mod:`.wires`); each request is a usage row with its cost (:mod:`.recording`), counted by
budgets and the usage charts. See docs/embeddings.md.
"""

from __future__ import annotations

from typing import Any

from ..engine.rate_limiting import memory_limiter
from .calls import Embedding, Embeddings, Recorder, inputs_of
from .vendors import OfflineEmbeddingProvider, hash_embedding
from .wires import Parsed, Wire

__all__ = [
    "DEFAULT_MODEL",
    "Embedding",
    "Embeddings",
    "OfflineEmbeddingProvider",
    "Parsed",
    "Wire",
    "aembed",
    "embed",
    "hash_embedding",
]

#: the model ``embed()`` uses unless told another.
DEFAULT_MODEL = "openai:text-embedding-3-small"


def _plan(
    model: str, dimensions: int | None, provider: str | None, owner: Any, chat: Any, record: bool
) -> Embedding:
    """The call's plan; with ``record``, its usage rows and the fleet's rate limits."""
    recorder: Recorder | None = None
    limiter = None
    if record:
        # App loading: the usage rows are the ORM's; importing agentloop loads no models.
        from .recording import UsageRows

        rows = UsageRows(owner=owner, chat=chat)
        recorder, limiter = rows, rows.limiter()
    else:
        limiter = memory_limiter()  # this process's buckets: none shared without the database
    return Embedding(model, dimensions, provider=provider, record=recorder, limiter=limiter)


def embed(
    texts: Any,
    model: str = DEFAULT_MODEL,
    dimensions: int | None = None,
    *,
    provider: str | None = None,
    owner: Any = None,
    chat: Any = None,
    record: bool = True,
) -> Embeddings:
    """The embeddings of ``texts`` (a string, or a list of them) from ``model``
    (``"provider:model"``), in the order given.

    ``dimensions`` asks for shorter vectors where the model can make them. Each request
    (inputs go in batches of the API's limit) is retried on transient errors and paced by
    ``AGENTLOOP["RATE_LIMITS"]``; with ``record`` each attempt is a ``Usage`` row charged to
    ``owner`` (or ``chat``'s owner and budget subjects), as a model call's is. Raises
    ``ValueError`` for inputs that can't be embedded, ``ConfigurationError`` for a model
    without embeddings, and ``ProviderError`` when the provider fails for good.
    """
    inputs, single = inputs_of(texts)
    return _plan(model, dimensions, provider, owner, chat, record).run(inputs, single)


async def aembed(
    texts: Any,
    model: str = DEFAULT_MODEL,
    dimensions: int | None = None,
    *,
    provider: str | None = None,
    owner: Any = None,
    chat: Any = None,
    record: bool = True,
) -> Embeddings:
    """:func:`embed` for async code: the requests go over ``httpx.AsyncClient``; the usage
    rows are written on a thread."""
    inputs, single = inputs_of(texts)
    return await _plan(model, dimensions, provider, owner, chat, record).arun(inputs, single)

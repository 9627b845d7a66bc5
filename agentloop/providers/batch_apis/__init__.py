"""Provider batch APIs: many requests sent at once, answered within a day, at about half price.

A :class:`BatchAPI` has four methods: ``submit`` a list of ``(custom_id, ModelRequest)``,
read a batch's ``status``, fetch its ``results`` (``{custom_id: ModelResponse |
ProviderError}``) once it has ended, and ``cancel`` it. Each request body is built by the
provider's own ``build_body`` and each answer parsed by its own ``parse_response``, so a
batched call maps exactly like a direct one. :func:`batch_api` finds a provider's:

- OpenAI Batch API (Chat Completions and Responses): a JSONL file uploaded to ``/files``
  (purpose ``batch``), ``POST /batches``; results in the output and error files;
- Anthropic Message Batches: ``POST /v1/messages/batches``; results as JSONL; one batch
  may mix models;
- Gemini batch mode: ``POST /{version}/models/{model}:batchGenerateContent`` with inline
  requests; the batch is a long-running operation whose ``response`` holds the answers.

A provider of your own can offer batches with a ``batch_api()`` method returning a
:class:`BatchAPI`. Vendors don't report a price per batched request: :meth:`BatchAPI.cost`
is the catalog price times :attr:`BatchAPI.price_factor` (one half, the vendors' batch
discount).

The package: ``base`` (the statuses, ``BatchInfo``, ``BatchAPI``, ``HTTPBatchAPI``) and one
module per vendor (``openai``, ``anthropic``, ``gemini``); ``batch_api`` is the lookup.
"""

from __future__ import annotations

from urllib.parse import urlparse

from ..anthropic import AnthropicProvider
from ..base import Provider
from ..gemini import GeminiProvider
from ..openai import OllamaProvider, OpenAIProvider, OpenRouterProvider
from ..openai_responses import OpenAIResponsesProvider
from .anthropic import AnthropicBatchAPI
from .base import (
    CANCELLED,
    CANCELLING,
    ENDED,
    EXPIRED,
    FAILED,
    FINISHED,
    IN_PROGRESS,
    BatchAPI,
    BatchInfo,
    BatchResult,
    HTTPBatchAPI,
)
from .gemini import GeminiBatchAPI
from .openai import OpenAIBatchAPI

__all__ = [
    "CANCELLED",
    "CANCELLING",
    "ENDED",
    "EXPIRED",
    "FAILED",
    "FINISHED",
    "IN_PROGRESS",
    "AnthropicBatchAPI",
    "BatchAPI",
    "BatchInfo",
    "BatchResult",
    "GeminiBatchAPI",
    "HTTPBatchAPI",
    "OpenAIBatchAPI",
    "batch_api",
]


def batch_api(provider: Provider) -> BatchAPI | None:
    """``provider``'s batch API, or None when it has none.

    A provider's own ``batch_api()`` method wins; the built-in providers of OpenAI (both
    APIs), Anthropic and Gemini have one; OpenRouter, Ollama and other OpenAI-compatible
    servers don't, unless ``AGENTLOOP["PROVIDERS"][name]["batches"]`` is True.
    """
    hook = getattr(provider, "batch_api", None)
    if callable(hook):
        found: BatchAPI | None = hook()
        return found
    if isinstance(provider, OpenAIResponsesProvider):
        return OpenAIBatchAPI(provider, "/responses")
    if isinstance(provider, OpenRouterProvider | OllamaProvider):
        return None
    if isinstance(provider, OpenAIProvider):
        # Compatible servers (vLLM, LM Studio...) have no Batch API: api.openai.com does, and
        # a server that copies it says so with AGENTLOOP["PROVIDERS"][name]["batches"] = True.
        offered = provider._setting("batches")
        if offered is None:
            offered = urlparse(provider.base_url).hostname == "api.openai.com"
        return OpenAIBatchAPI(provider, "/chat/completions") if offered else None
    if isinstance(provider, AnthropicProvider):
        return AnthropicBatchAPI(provider)
    if isinstance(provider, GeminiProvider):
        return GeminiBatchAPI(provider)
    return None

"""Embedding wire formats, one per API: where a batch goes, its JSON body, how the answer
parses, and how many inputs one request takes.

Each family's requests go through its chat provider's HTTP machinery
(:meth:`~agentloop.providers.http.HTTPProvider.post_json`): the same key or credentials,
endpoint, proxy, signing, size cap and error mapping as its model calls. :func:`wire_for`
picks the wire for a provider instance and a model id.

- OpenAI and compatible servers (OpenRouter, Ollama, Mistral, Perplexity):
  ``POST {base}/embeddings``, 2,048 inputs a request;
- Azure AI Foundry: ``POST {resource}/openai/v1/embeddings``, 96 (Cohere models) or 2,048;
- the Gemini API: ``:batchEmbedContents``, 100;
- Vertex AI: ``:predict``, 250 (``gemini-embedding-*``: 1);
- Bedrock ``/model/{id}/invoke``: Titan and Nova 1, Cohere 96;
- Cohere: ``POST /v2/embed``, 96.
"""

from __future__ import annotations

import base64
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from urllib.parse import quote

from ..attachments import Attachment
from ..exceptions import ConfigurationError, InvalidResponseError, ProviderError
from ..messages import token_count
from ..providers.base import Provider
from ..providers.bedrock import base_model
from ..providers.http import HTTPProvider

__all__ = ["Parsed", "Parts", "Wire", "batches", "no_embeddings", "wire_for"]

#: one input: its parts (text, and for multimodal models images), embedded as one vector.
Parts = tuple[str | Attachment, ...]


@dataclass(frozen=True)
class Parsed:
    """What one request's answer gives: a vector per input, in order; the input tokens the
    API reported (None: it reports none); the cost it reported (None: none)."""

    vectors: list[list[float]]
    input_tokens: int | None = None
    cost: Decimal | None = None


class Wire(ABC):
    """How one model's embeddings are asked for. ``single``: the caller gave one input, not
    a list (the OpenAI wire then sends a string, as the recorded clients do)."""

    #: inputs one request may carry.
    max_batch: int = 1

    def __init__(self, model: str) -> None:
        self.model = model

    @abstractmethod
    def call(self, inputs: list[Parts], dimensions: int | None, single: bool) -> Parsed:
        """Embed ``inputs`` (at most ``max_batch``) in one request."""

    @abstractmethod
    async def acall(self, inputs: list[Parts], dimensions: int | None, single: bool) -> Parsed:
        """:meth:`call` for ``aembed``."""


class HTTPWire(Wire):
    """A wire spoken over a provider's HTTP client: subclasses give ``url``, ``body`` and
    ``parse``."""

    #: whether an input may hold images beside its text.
    multimodal = False

    def __init__(self, provider: HTTPProvider, model: str) -> None:
        super().__init__(model)
        self.provider = provider

    @abstractmethod
    def url(self) -> str:
        """The path (under the provider's base URL) or URL to POST to."""

    @abstractmethod
    def body(self, inputs: list[Parts], dimensions: int | None, single: bool) -> dict[str, Any]:
        """The JSON body for ``inputs``."""

    @abstractmethod
    def parse(self, data: Any) -> Parsed:
        """The vectors, tokens and cost of an answer."""

    def call(self, inputs: list[Parts], dimensions: int | None, single: bool) -> Parsed:
        body = self.body(self._checked(inputs), dimensions, single)
        return self._parsed(self.provider.post_json(self.url(), body), len(inputs))

    async def acall(self, inputs: list[Parts], dimensions: int | None, single: bool) -> Parsed:
        body = self.body(self._checked(inputs), dimensions, single)
        return self._parsed(await self.provider.apost_json(self.url(), body), len(inputs))

    def _checked(self, inputs: list[Parts]) -> list[Parts]:
        if not self.multimodal and any(not isinstance(p, str) for parts in inputs for p in parts):
            raise ConfigurationError(
                f"{self.provider.name}:{self.model} embeds text only: pass strings, not "
                "attachments (Gemini's multimodal embedding models take images)."
            )
        return inputs

    def _parsed(self, data: Any, count: int) -> Parsed:
        """``parse(data)``, its shape and numbers checked: a parser tripping over the answer,
        a vector count other than the inputs', or a value that is not a finite number is an
        InvalidResponseError."""
        name = f"{self.provider.name}:{self.model}"
        try:
            parsed = self.parse(data)
        except ProviderError:
            raise
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise InvalidResponseError(
                f"{name} answered embeddings in an unexpected shape: {type(exc).__name__}: {exc}"
            ) from exc
        if len(parsed.vectors) != count:
            raise InvalidResponseError(
                f"{name} answered {len(parsed.vectors)} embeddings for {count} inputs"
            )
        vectors = [_vector(values, name) for values in parsed.vectors]
        tokens = None if parsed.input_tokens is None else token_count(parsed.input_tokens)
        return Parsed(vectors, tokens, parsed.cost)


def _vector(values: Any, name: str) -> list[float]:
    """``values`` as floats; InvalidResponseError unless each is a finite number."""
    if not isinstance(values, list) or not values:
        raise InvalidResponseError(f"{name} answered an embedding that is not a list of numbers")
    out = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidResponseError(f"{name} answered a non-number in an embedding: {value!r}")
        number = float(value)
        if not math.isfinite(number):
            raise InvalidResponseError(f"{name} answered a non-finite number in an embedding")
        out.append(number)
    return out


def _texts(inputs: list[Parts]) -> list[str]:
    """Each input's text (the text-only wires: inputs were checked to be text)."""
    return ["".join(str(part) for part in parts) for parts in inputs]


def _reported_cost(usage: Any) -> Decimal | None:
    """A cost the API reported in ``usage``: OpenRouter's number, Perplexity's
    ``{"total_cost": ...}``; None when there is none (a bad one is made safe later)."""
    if not isinstance(usage, dict):
        return None
    cost = usage.get("cost")
    if isinstance(cost, dict):
        cost = cost.get("total_cost")
    if cost is None or isinstance(cost, bool):
        return None
    try:
        return Decimal(str(cost))
    except ArithmeticError:
        return None


# -- OpenAI and the servers that speak its API --------------------------------------------------
class OpenAIWire(HTTPWire):
    """``POST /embeddings``: ``input`` a string or a list, ``dimensions``; vectors as lists of
    floats, or base64 int8 (Perplexity's default)."""

    max_batch = 2048

    def url(self) -> str:
        return "/embeddings"

    def body(self, inputs: list[Parts], dimensions: int | None, single: bool) -> dict[str, Any]:
        texts = _texts(inputs)
        body: dict[str, Any] = {"model": self.model, "input": texts[0] if single else texts}
        if dimensions is not None:
            body["dimensions"] = dimensions
        return body

    def parse(self, data: Any) -> Parsed:
        items = sorted(data["data"], key=lambda item: item.get("index", 0))
        usage = data.get("usage") or {}
        return Parsed(
            [_decoded(item["embedding"]) for item in items],
            usage.get("prompt_tokens", usage.get("total_tokens")),
            _reported_cost(usage),
        )


def _decoded(embedding: Any) -> Any:
    """A vector sent as base64 text holds signed bytes (int8: Perplexity); a list is as is."""
    if isinstance(embedding, str):
        return [byte - 256 if byte > 127 else byte for byte in base64.b64decode(embedding)]
    return embedding


class AzureWire(OpenAIWire):
    """Azure AI Foundry's OpenAI v1 route, ``{resource}/openai/v1/embeddings``: always a list
    of inputs; Cohere deployments take 96 a request."""

    def __init__(self, provider: HTTPProvider, model: str) -> None:
        super().__init__(provider, model)
        self.max_batch = 96 if "cohere" in model.lower() else 2048

    def url(self) -> str:
        return f"{self.provider._root()}/openai/v1/embeddings"  # type: ignore[attr-defined]

    def body(self, inputs: list[Parts], dimensions: int | None, single: bool) -> dict[str, Any]:
        return super().body(inputs, dimensions, single=False)


# -- Google ---------------------------------------------------------------------------------------
class GeminiWire(HTTPWire):
    """The Gemini API's ``:batchEmbedContents``: one request per input, each a content of
    parts (text, and images for multimodal models), ``outputDimensionality`` on each."""

    max_batch = 100
    multimodal = True

    def _model(self) -> str:
        return self.model.removeprefix("models/")

    def url(self) -> str:
        version = self.provider.api_version  # type: ignore[attr-defined]
        return f"/{version}/models/{self._model()}:batchEmbedContents"

    def body(self, inputs: list[Parts], dimensions: int | None, single: bool) -> dict[str, Any]:
        requests = []
        for parts in inputs:
            request: dict[str, Any] = {
                "model": f"models/{self._model()}",
                "content": {"parts": [_gemini_part(part) for part in parts]},
            }
            if dimensions is not None:
                request["outputDimensionality"] = dimensions
            requests.append(request)
        return {"requests": requests}

    def parse(self, data: Any) -> Parsed:
        usage = data.get("usageMetadata") or {}
        return Parsed(
            [item["values"] for item in data["embeddings"]], usage.get("promptTokenCount")
        )


def _gemini_part(part: str | Attachment) -> dict[str, Any]:
    if isinstance(part, str):
        return {"text": part}
    if part.data is not None:
        return {"inline_data": {"mime_type": part.media_type, "data": part.base64()}}
    return {"file_data": {"mime_type": part.media_type, "file_uri": part.url}}


class VertexWire(HTTPWire):
    """Vertex AI's ``:predict``: ``instances`` of ``content``, ``outputDimensionality`` in
    ``parameters``; ``gemini-embedding-*`` models take one instance a request."""

    def __init__(self, provider: HTTPProvider, model: str) -> None:
        super().__init__(provider, model)
        self.max_batch = 1 if "gemini-embedding" in model else 250

    def url(self) -> str:
        provider: Any = self.provider
        return f"/{provider.api_version}/{provider._resource(self.model)}:predict"

    def body(self, inputs: list[Parts], dimensions: int | None, single: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"instances": [{"content": text} for text in _texts(inputs)]}
        if dimensions is not None:
            body["parameters"] = {"outputDimensionality": dimensions}
        return body

    def parse(self, data: Any) -> Parsed:
        predictions = data["predictions"]
        counts = [(p["embeddings"].get("statistics") or {}).get("token_count") for p in predictions]
        tokens = None if any(c is None for c in counts) else sum(token_count(c) for c in counts)
        return Parsed([p["embeddings"]["values"] for p in predictions], tokens)


# -- Bedrock and Cohere -------------------------------------------------------------------------
class BedrockWire(HTTPWire):
    """Bedrock's ``InvokeModel`` (``/model/{id}/invoke``, SigV4-signed by the provider)."""

    def url(self) -> str:
        # Percent-encoded as the Converse path is: the path signed is the path the service reads.
        return f"/model/{quote(self.model, safe='')}/invoke"


class TitanWire(BedrockWire):
    """Amazon Titan Text Embeddings: one text a request, normalised."""

    def body(self, inputs: list[Parts], dimensions: int | None, single: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"inputText": _texts(inputs)[0], "normalize": True}
        if dimensions is not None:
            body["dimensions"] = dimensions
        return body

    def parse(self, data: Any) -> Parsed:
        return Parsed([data["embedding"]], data.get("inputTextTokenCount"))


class NovaWire(BedrockWire):
    """Amazon Nova multimodal embeddings: one text a request (``SINGLE_EMBEDDING``); the
    dimension is always sent (3,072 unless asked: the model's largest)."""

    def body(self, inputs: list[Parts], dimensions: int | None, single: bool) -> dict[str, Any]:
        return {
            "taskType": "SINGLE_EMBEDDING",
            "singleEmbeddingParams": {
                "embeddingPurpose": "GENERIC_INDEX",
                "text": {"truncationMode": "END", "value": _texts(inputs)[0]},
                "embeddingDimension": dimensions or 3072,
            },
        }

    def parse(self, data: Any) -> Parsed:
        return Parsed([item["embedding"] for item in data["embeddings"]])


def _cohere_vectors(data: Any) -> list[Any]:
    """Cohere's ``embeddings``: by type (``{"float": [...]}``, v4) or a plain list (v3)."""
    embeddings = data["embeddings"]
    return embeddings["float"] if isinstance(embeddings, dict) else embeddings


class BedrockCohereWire(BedrockWire):
    """Cohere Embed on Bedrock: up to 96 texts a request, as documents to search."""

    max_batch = 96

    def body(self, inputs: list[Parts], dimensions: int | None, single: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"input_type": "search_document", "texts": _texts(inputs)}
        if dimensions is not None:
            body["output_dimension"] = dimensions
        return body

    def parse(self, data: Any) -> Parsed:
        return Parsed(_cohere_vectors(data))


class CohereWire(HTTPWire):
    """Cohere's own ``POST /v2/embed``: up to 96 texts, float vectors, ``output_dimension``."""

    max_batch = 96

    def url(self) -> str:
        return "/v2/embed"

    def body(self, inputs: list[Parts], dimensions: int | None, single: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "input_type": "search_document",
            "embedding_types": ["float"],
            "texts": _texts(inputs),
        }
        if dimensions is not None:
            body["output_dimension"] = dimensions
        return body

    def parse(self, data: Any) -> Parsed:
        billed = (data.get("meta") or {}).get("billed_units") or {}
        return Parsed(_cohere_vectors(data), billed.get("input_tokens"))


def bedrock_wire(provider: HTTPProvider, model: str) -> Wire:
    """The body dialect of a Bedrock model: Titan, Nova or Cohere (a geographic inference
    profile, ``us.cohere.embed-v4:0``, speaks its base model's)."""
    base = base_model(model)
    if base.startswith("amazon.titan-embed"):
        return TitanWire(provider, model)
    if base.startswith("amazon.nova") and "embed" in base:
        return NovaWire(provider, model)
    if base.startswith("cohere.embed"):
        return BedrockCohereWire(provider, model)
    raise ConfigurationError(
        f"bedrock:{model} has no known embeddings body: agentloop speaks Amazon Titan "
        "(amazon.titan-embed-*), Amazon Nova (amazon.nova-*-embeddings-*) and Cohere "
        "(cohere.embed-*) on Bedrock."
    )


# -- which wire ---------------------------------------------------------------------------------
#: a provider class (by import path, so no family's extra is imported to ask) -> its wire.
_FAMILIES: dict[str, Callable[[Any, str], Wire]] = {
    "agentloop.providers.azure.AzureProvider": lambda p, m: AzureWire(p.chat, m),
    "agentloop.providers.azure._AzureConnection": AzureWire,
    "agentloop.providers.bedrock.provider.BedrockProvider": bedrock_wire,
    "agentloop.providers.vertex.provider.VertexAIProvider": VertexWire,
    "agentloop.providers.gemini.provider.GeminiProvider": GeminiWire,
    "agentloop.providers.openai.OpenAIProvider": OpenAIWire,
}


def wire_for(provider: Provider, model: str) -> Wire | None:
    """The wire for ``model`` on ``provider``: the provider's own ``embedding_wire(model)``
    when it has one (a project's provider may), else its family's; None when the provider
    has no embeddings."""
    own = getattr(provider, "embedding_wire", None)
    if callable(own):
        wire: Wire = own(model)
        return wire
    for klass in type(provider).__mro__:
        family = _FAMILIES.get(f"{klass.__module__}.{klass.__qualname__}")
        if family is not None:
            return family(provider, model)
    return None


def no_embeddings(name: str, provider: Provider) -> ConfigurationError:
    """The error for the provider ``name`` without embeddings, naming those that have them."""
    return ConfigurationError(
        f"Provider {name!r} ({type(provider).__name__}) has no embeddings: use "
        "OpenAI or a compatible server, Gemini, Vertex AI, Bedrock, Azure, Cohere, or "
        'offline:hash-embedding (see "Embeddings" in the agentloop docs).'
    )


def batches(inputs: Sequence[Parts], size: int) -> list[list[Parts]]:
    """``inputs`` in runs of at most ``size``, in order."""
    return [list(inputs[start : start + size]) for start in range(0, len(inputs), size)]

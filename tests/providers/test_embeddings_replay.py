"""Replays every recorded embeddings request (../shared/fixtures/providers-embeddings/, read
in place) through ``agentloop.embed``.

For each cassette (test ids are the cassette names), the inputs the recorded requests carry
(their texts, images and dimensions: this module's own reading of each family's body) are
given to ``embed`` with the recorded model, on a provider answered by the recording. Then:

1. the requests we send are the recorded ones: the same bodies, to the same paths, as many
   (a Bedrock Titan model takes one text a request: three texts, three requests);
2. the vectors are the recorded ones, parsed by this module's own reading of each answer
   (Perplexity's base64 int8 included), with the tokens the API reported and, where it
   reported one (OpenRouter, Perplexity), its cost;
3. the async twin sends and reads the same.

Not replayed here, each for its reason (:data:`NOT_EMBEDDINGS`): the five
``moderation_*`` cassettes are OpenAI's ``/v1/moderations`` (a classification, not an
embedding: no vectors), and ``batch_with_openai_*_embeddings`` is OpenAI's Batch API
carrying embedding requests (a day-long job through file upload and polling, which
``agentloop.batch`` does for chats, not yet for embeddings). A test checks that exactly
those are left out, so a new recording can't be skipped unnoticed.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from urllib.parse import unquote, urlsplit

import httpx
import pytest

import agentloop
from agentloop import providers
from agentloop.attachments import Attachment
from agentloop.embeddings.vendors import CohereProvider, MistralProvider, PerplexityProvider
from agentloop.providers.azure import AzureProvider
from agentloop.providers.bedrock import BedrockProvider
from agentloop.providers.gemini import GeminiProvider
from agentloop.providers.openai import OpenAIProvider, OpenRouterProvider
from agentloop.providers.vertex import VertexAIProvider
from tests.providers import cassettes
from tests.providers import vertex_wire as vertex
from tests.providers.aws import REGION
from tests.providers.cassettes import Cassette, Interaction

EMBEDDINGS = cassettes.FIXTURES.parent / "providers-embeddings"
#: the recordings of this folder that are not embedding calls (see the module docstring).
NOT_EMBEDDINGS = (
    "moderation_moderate_with_openai_provider",
    "batch_with_openai_text-embedding-3-small_embeddings",
)
CASSETTES = [
    name for name in cassettes.names("", EMBEDDINGS) if not name.startswith(NOT_EMBEDDINGS)
]
AZURE_ENDPOINT = "https://rubyllm.services.ai.azure.com"

_pass_counts = cassettes.pass_counts(__name__, "embeddings replay", "providers-embeddings")


def test_every_recording_is_replayed_or_said_why_not() -> None:
    everything = cassettes.names("", cassettes.require_fixtures(EMBEDDINGS))
    assert len(everything) == 44
    left_out = sorted(set(everything) - set(CASSETTES))
    assert [name for name in left_out if name.startswith(NOT_EMBEDDINGS[0])] == [
        name for name in everything if "moderation" in name
    ]
    assert len(left_out) == 6  # five moderation cassettes, one batch
    assert len(CASSETTES) == 38


# -- this module's reading of the recordings -----------------------------------------------------
@dataclass
class Call:
    """One ``embed()`` call a recording's requests came from."""

    model: str  # "provider:model"
    texts: Any  # what embed() is given
    dimensions: int | None
    requests: list[Interaction]


def family(interaction: Interaction) -> str:
    host = urlsplit(interaction.uri).hostname or ""
    path = unquote(urlsplit(interaction.uri).path)
    for marker, name in (
        ("openrouter.ai", "openrouter"),
        ("api.openai.com", "openai"),
        ("api.mistral.ai", "mistral"),
        ("api.perplexity.ai", "perplexity"),
        ("api.cohere.com", "cohere"),
        ("azure.com", "azure"),
        ("generativelanguage", "gemini"),
        ("aiplatform", "vertexai"),
        ("bedrock-runtime", "bedrock"),
    ):
        if marker in host:
            return name
    raise AssertionError(f"unknown host {host} ({path})")


def bedrock_model(interaction: Interaction) -> str:
    return unquote(urlsplit(interaction.uri).path).split("/")[2]


def read_request(interaction: Interaction) -> tuple[str, list[Any], bool, int | None]:
    """The model, the inputs, whether one input was given (not a list), and the dimensions
    of a recorded request."""
    kind, body = family(interaction), interaction.request_body
    if kind in ("openai", "openrouter", "mistral", "perplexity", "azure"):
        given = body["input"]
        single = isinstance(given, str)
        return body["model"], [given] if single else given, single, body.get("dimensions")
    if kind == "gemini":
        inputs = []
        for request in body["requests"]:
            parts: list[Any] = []
            for part in request["content"]["parts"]:
                if "text" in part:
                    parts.append(part["text"])
                else:
                    inline = part["inline_data"]
                    parts.append(Attachment.from_bytes(
                        base64.b64decode(inline["data"]), inline["mime_type"]
                    ))  # fmt: skip
            inputs.append(parts[0] if len(parts) == 1 else parts)
        model = body["requests"][0]["model"].removeprefix("models/")
        dimensions = body["requests"][0].get("outputDimensionality")
        return model, inputs, False, dimensions
    if kind == "vertexai":
        model = urlsplit(interaction.uri).path.rsplit("/", 1)[1].partition(":")[0]
        texts = [instance["content"] for instance in body["instances"]]
        return model, texts, False, (body.get("parameters") or {}).get("outputDimensionality")
    if kind == "cohere":
        return body["model"], body["texts"], False, body.get("output_dimension")
    model = bedrock_model(interaction)
    if "inputText" in body:  # Titan
        return model, [body["inputText"]], True, body.get("dimensions")
    if "singleEmbeddingParams" in body:  # Nova
        params = body["singleEmbeddingParams"]
        return model, [params["text"]["value"]], True, params["embeddingDimension"]
    return model, body["texts"], False, body.get("output_dimension")  # Cohere on Bedrock


def calls_of(cassette: Cassette) -> list[Call]:
    """The embed() calls behind a cassette's requests: each request is one call, except
    consecutive one-text requests to one Bedrock model, which are one call of those texts."""
    calls: list[Call] = []
    for interaction in cassette.interactions:
        if interaction.uri == vertex.TOKEN_URI:
            continue
        kind = family(interaction)
        model, inputs, single, dimensions = read_request(interaction)
        name = f"{kind}:{model}"
        last = calls[-1] if calls else None
        if (
            kind == "bedrock"
            and single
            and last is not None
            and last.model == name
            and last.dimensions == dimensions
        ):
            earlier = last.texts if isinstance(last.texts, list) else [last.texts]
            last.texts = [*earlier, *inputs]
            last.requests.append(interaction)
            continue
        calls.append(Call(name, inputs[0] if single else inputs, dimensions, [interaction]))
    return calls


def _int8(text: str) -> list[float]:
    raw = base64.b64decode(text)
    return [float(value) for value in memoryview(raw).cast("b")]


def recorded_vectors(interaction: Interaction) -> list[list[float]]:
    """The vectors of a recorded answer, as this module reads each family's."""
    data = interaction.response_json()
    if "data" in data:
        items = sorted(data["data"], key=lambda item: item.get("index", 0))
        return [
            _int8(item["embedding"]) if isinstance(item["embedding"], str) else item["embedding"]
            for item in items
        ]
    if "predictions" in data:
        return [p["embeddings"]["values"] for p in data["predictions"]]
    if "embedding" in data:
        return [data["embedding"]]
    embeddings = data["embeddings"]
    if isinstance(embeddings, dict):
        return embeddings["float"]
    if embeddings and "values" in embeddings[0]:
        return [item["values"] for item in embeddings]
    return [item["embedding"] for item in embeddings]


def recorded_tokens(interaction: Interaction) -> int | None:
    data = interaction.response_json()
    usage = data.get("usage") or {}
    if "prompt_tokens" in usage:
        return int(usage["prompt_tokens"])
    if "inputTextTokenCount" in data:
        return int(data["inputTextTokenCount"])
    if "usageMetadata" in data:
        return int(data["usageMetadata"]["promptTokenCount"])
    billed = (data.get("meta") or {}).get("billed_units") or {}
    if "input_tokens" in billed:
        return int(billed["input_tokens"])
    if "predictions" in data:
        return sum(p["embeddings"]["statistics"]["token_count"] for p in data["predictions"])
    return None


def recorded_cost(interaction: Interaction) -> Decimal | None:
    cost = (interaction.response_json().get("usage") or {}).get("cost")
    if isinstance(cost, dict):
        cost = cost["total_cost"]
    return None if cost is None else Decimal(str(cost))


# -- serving a cassette --------------------------------------------------------------------------
_CLASSES: dict[str, type[Any]] = {
    "openai": OpenAIProvider,
    "openrouter": OpenRouterProvider,
    "mistral": MistralProvider,
    "perplexity": PerplexityProvider,
    "cohere": CohereProvider,
    "gemini": GeminiProvider,
}


@pytest.fixture
def serving(aws_env: pytest.MonkeyPatch) -> Iterator[Any]:
    """``serving(cassette)``: each family of the cassette registered over one server that
    answers its requests in order (token exchanges from their own queue); the server."""
    names: list[str] = []

    def serve(cassette: Cassette) -> vertex.VertexServer:
        server = vertex.VertexServer.of(cassette.interactions)
        transport = httpx.MockTransport(server)
        for kind in dict.fromkeys(
            family(i) for i in cassette.interactions if i.uri != vertex.TOKEN_URI
        ):
            provider: Any
            if kind == "azure":
                provider = AzureProvider(
                    endpoint=AZURE_ENDPOINT, api_key="test-key", transport=transport
                )
            elif kind == "bedrock":
                provider = BedrockProvider(transport=transport)
            elif kind == "vertexai":
                provider = VertexAIProvider(
                    project=vertex.PROJECT, location=vertex.LOCATION,
                    credentials=vertex.user_credentials(), transport=transport,
                )  # fmt: skip
            else:
                provider = _CLASSES[kind](api_key="test-key", transport=transport)
            providers.register(kind, provider)
            names.append(kind)
        return server

    yield serve
    for name in names:
        providers.unregister(name)


def recorded_path(interaction: Interaction) -> str:
    return unquote(
        vertex.recorded_url(interaction).split("?")[0].split("://", 1)[1].partition("/")[2]
    )


def check_replay(cassette: Cassette, server: vertex.VertexServer, results: list[Any]) -> None:
    calls = calls_of(cassette)
    api = [i for i in cassette.interactions if i.uri != vertex.TOKEN_URI]
    # 1. the requests: same bodies, same paths, as many
    assert server.api_bodies() == [i.request_body for i in api]
    assert [unquote(r.url.path).lstrip("/") for r in server.api_requests] == [
        recorded_path(i) for i in api
    ]
    # 2. the answers: the recorded vectors, tokens and cost
    for call, result in zip(calls, results, strict=True):
        expected = [v for i in call.requests for v in recorded_vectors(i)]
        assert result.vectors == expected
        assert result.model == call.model
        assert all(len(v) == len(expected[0]) for v in result.vectors)
        if call.dimensions is not None:
            assert result.dimensions == call.dimensions
        tokens = [recorded_tokens(i) for i in call.requests]
        if None not in tokens:
            assert result.input_tokens == sum(t for t in tokens if t is not None)
        costs = [recorded_cost(i) for i in call.requests]
        if None not in costs:
            assert result.cost == sum((c for c in costs if c is not None), Decimal(0))


@pytest.mark.parametrize("name", CASSETTES, ids=CASSETTES)
def test_recorded_embeddings_replay(name: str, serving: Any) -> None:
    cassette = cassettes.load(name, EMBEDDINGS)
    server = serving(cassette)
    results = [
        agentloop.embed(call.texts, model=call.model, dimensions=call.dimensions, record=False)
        for call in calls_of(cassette)
    ]
    check_replay(cassette, server, results)


@pytest.mark.parametrize("name", CASSETTES, ids=CASSETTES)
def test_recorded_embeddings_replay_async(name: str, serving: Any) -> None:
    cassette = cassettes.load(name, EMBEDDINGS)
    server = serving(cassette)

    async def run() -> list[Any]:
        return [
            await agentloop.aembed(
                call.texts, model=call.model, dimensions=call.dimensions, record=False
            )
            for call in calls_of(cassette)
        ]

    check_replay(cassette, server, asyncio.run(run()))


def test_the_recorded_cost_is_the_one_openrouter_reported(serving: Any) -> None:
    cassette = cassettes.load(
        "embedding_provider-reported_cost_openrouter_openai_text-embedding-3-small_returns_the_"
        "exact_cost_the_provider_reported",
        EMBEDDINGS,
    )
    serving(cassette)
    result = agentloop.embed(
        "Ruby is a programmer's best friend",
        model="openrouter:openai/text-embedding-3-small",
        record=False,
    )
    assert result.cost == Decimal("1.4E-7")
    assert result.input_tokens == 7
    assert json.loads(cassette.interactions[0].response_text)["usage"]["cost"] == 1.4e-07


def test_bedrock_requests_are_signed_for_the_region(serving: Any) -> None:
    cassette = cassettes.load(
        "embedding_basic_functionality_bedrock_amazon_titan-embed-text-v2_0_can_handle_"
        "multiple_texts",
        EMBEDDINGS,
    )
    server = serving(cassette)
    agentloop.embed(
        ["Ruby", "Python", "JavaScript"], model="bedrock:amazon.titan-embed-text-v2:0", record=False
    )
    assert len(server.api_requests) == 3
    for sent in server.api_requests:
        assert sent.url.host == f"bedrock-runtime.{REGION}.amazonaws.com"
        assert sent.headers["authorization"].startswith("AWS4-HMAC-SHA256 Credential=")
        assert f"/{REGION}/bedrock/aws4_request" in sent.headers["authorization"]

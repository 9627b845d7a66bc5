"""``agentloop.embed`` and ``aembed``: the offline model, inputs, batching, retries, rate limits,
usage rows and budgets (the recorded wire formats: tests/providers/test_embeddings_replay.py)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import httpx
import pytest
from asgiref.sync import async_to_sync

import agentloop
from agentloop import providers
from agentloop.budgets import spend_of
from agentloop.embeddings import hash_embedding
from agentloop.exceptions import (
    AuthenticationError,
    ConfigurationError,
    RateLimitError,
    UnknownProviderError,
)
from agentloop.models import Chat, Usage
from agentloop.providers.anthropic import AnthropicProvider
from agentloop.providers.openai import OpenAIProvider

OFFLINE = "offline:hash-embedding"
KEY = "sk-test-embeddings-key-1234567890"


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


# -- the offline model ----------------------------------------------------------------------------
def test_offline_vectors_are_unit_length_and_the_same_every_time() -> None:
    first = agentloop.embed("The owner's name is Ada", model=OFFLINE, record=False)
    again = agentloop.embed("The owner's name is Ada", model=OFFLINE, record=False)
    assert first.vector == again.vector
    assert first.dimensions == 256
    assert math.isclose(math.sqrt(sum(v * v for v in first.vector)), 1.0)
    assert (
        first.model == OFFLINE and first.cost == Decimal(0) and first.input_tokens == 6
    )  # owner, s


def test_offline_vectors_of_similar_texts_are_nearer_than_unrelated_ones() -> None:
    query, near, far = agentloop.embed(
        ["Which editor does the owner prefer?", "The owner prefers the Vim editor",
         "Quarterly revenue grew by eight percent"],
        model=OFFLINE,
        record=False,
    )  # fmt: skip
    assert cosine(query, near) > 0.3
    assert cosine(query, near) > cosine(query, far) + 0.2


def test_offline_vectors_take_the_dimensions_asked_for() -> None:
    result = agentloop.embed(["a b c", "d e"], model=OFFLINE, dimensions=64, record=False)
    assert len(result) == 2 and result.dimensions == 64
    assert [len(v) for v in result] == [64, 64]


def test_hash_embedding_is_independent_of_the_process() -> None:
    # The vector is a function of the text alone (blake2b, not Python's salted hash()):
    # this is the vector every process makes for "memory".
    vector, words = hash_embedding("memory", 8)
    assert words == 1
    assert [round(v, 6) for v in vector] == [round(v, 6) for v in hash_embedding("Memory", 8)[0]]
    assert sum(1 for v in vector if v) >= 2


def test_offline_embeddings_beside_a_chat_provider_named_offline() -> None:
    # tests/settings.py configures "offline" as the chat OfflineProvider: it has no
    # embeddings, so the embedding built-in of that name serves them.
    assert "offline" in providers.available()
    assert agentloop.embed("hello", model=OFFLINE, record=False).dimensions == 256


# -- what embed() refuses -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("texts", "message"),
    [
        ([], "embed() was given no inputs"),
        (42, "embed() takes a string or a list of strings, not int"),
        (["fine", 4], "embed() input 1 is not a string, an Attachment or a list of them"),
        (["fine", "  "], "embed() input 1 is empty"),
        ("", "embed() input 0 is empty"),
    ],
)
def test_inputs_that_cannot_be_embedded_are_refused_in_one_line(texts: Any, message: str) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        agentloop.embed(texts, model=OFFLINE, record=False)


@pytest.mark.parametrize("dimensions", [0, -3, True, 2.5, "256"])
def test_dimensions_must_be_a_positive_whole_number(dimensions: Any) -> None:
    with pytest.raises(ConfigurationError, match="dimensions must be a whole number"):
        agentloop.embed("text", model=OFFLINE, dimensions=dimensions, record=False)


def test_a_provider_without_embeddings_says_which_have_them() -> None:
    providers.register("claude", AnthropicProvider(api_key="k"))
    try:
        with pytest.raises(ConfigurationError, match="'claude' .* has no embeddings: use OpenAI"):
            agentloop.embed("text", model="claude:claude-haiku-4-5", record=False)
    finally:
        providers.unregister("claude")


def test_an_unknown_provider_is_named() -> None:
    with pytest.raises(UnknownProviderError, match="'nowhere'"):
        agentloop.embed("text", model="nowhere:model", record=False)


def test_images_go_only_to_models_that_embed_them(embedding_server: Any) -> None:
    embedding_server(lambda body: _vectors(len(body["input"])))
    image = agentloop.Attachment.from_bytes(b"\x89PNG....", "image/png")
    with pytest.raises(ConfigurationError, match="embeds text only"):
        agentloop.embed([["A logo", image]], model="fake:text-embedding-3-small", record=False)


# -- an OpenAI-compatible server answering from a function ----------------------------------------
def _vectors(count: int, tokens: int = 3, start: int = 0) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"index": i, "embedding": [float(start + i), 1.0]} for i in range(count)],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


@pytest.fixture
def embedding_server() -> Iterator[Callable[..., list[httpx.Request]]]:
    """``embedding_server(answer)``: an OpenAI provider registered as "fake" whose server
    answers each request with ``answer(body)`` (a dict: 200 JSON, or an httpx.Response);
    returns the list the requests are kept in."""

    def serve(answer: Callable[[dict[str, Any]], Any]) -> list[httpx.Request]:
        sent: list[httpx.Request] = []

        def handle(request: httpx.Request) -> httpx.Response:
            sent.append(request)
            found = answer(json.loads(request.content))
            return found if isinstance(found, httpx.Response) else httpx.Response(200, json=found)

        providers.register(
            "fake", OpenAIProvider(name="fake", api_key=KEY, transport=httpx.MockTransport(handle))
        )
        return sent

    yield serve
    providers.unregister("fake")


def test_inputs_go_in_batches_of_the_apis_limit_and_come_back_in_order(
    embedding_server: Any,
) -> None:
    offsets = iter([0, 2048])
    sent = embedding_server(lambda body: _vectors(len(body["input"]), start=next(offsets)))
    texts = [f"text {i}" for i in range(2050)]
    result = agentloop.embed(texts, model="fake:text-embedding-3-small", record=False)
    assert [len(json.loads(r.content)["input"]) for r in sent] == [2048, 2]
    assert [v[0] for v in result] == [float(i) for i in range(2050)]
    assert result.input_tokens == 6


def test_a_transient_error_is_retried_and_each_attempt_is_a_usage_row(
    embedding_server: Any, db: Any, user: Any
) -> None:
    answers = iter([
        httpx.Response(429, headers={"retry-after": "0"}, json={"error": {"message": "slow down"}}),
        _vectors(1, tokens=1_000_000),
    ])  # fmt: skip
    sent = embedding_server(lambda body: next(answers))
    result = agentloop.embed("hello", model="fake:text-embedding-3-small", owner=user)
    assert len(sent) == 2 and result.vector == [0.0, 1.0]
    rows = list(Usage.objects.order_by("id").values("status", "input_tokens", "cost", "owner"))
    assert [(r["status"], r["input_tokens"], r["owner"]) for r in rows] == [
        ("failed", 0, user.pk),
        ("succeeded", 1_000_000, user.pk),
    ]
    # text-embedding-3-small: 0.02 dollars per million tokens
    assert rows[1]["cost"] == Decimal("0.02") == result.cost


def test_retries_stop_after_model_retries(embedding_server: Any, settings: Any) -> None:
    settings.AGENTLOOP = {**settings.AGENTLOOP, "MODEL_RETRIES": 1}
    sent = embedding_server(
        lambda body: httpx.Response(429, headers={"retry-after": "0"}, json={"error": {}})
    )
    with pytest.raises(RateLimitError):
        agentloop.embed("hello", model="fake:text-embedding-3-small", record=False)
    assert len(sent) == 2


def test_a_permanent_error_is_not_retried_and_its_row_keeps_no_key(
    embedding_server: Any, db: Any
) -> None:
    sent = embedding_server(
        lambda body: httpx.Response(401, json={"error": {"message": f"bad key {KEY}"}})
    )
    with pytest.raises(AuthenticationError) as raised:
        agentloop.embed("hello", model="fake:text-embedding-3-small")
    assert len(sent) == 1
    assert KEY not in str(raised.value)
    (row,) = Usage.objects.all()
    assert row.status == "failed" and row.error.startswith("AuthenticationError: ")
    assert KEY not in row.error


def test_rate_limits_pace_embedding_requests(embedding_server: Any, settings: Any) -> None:
    settings.AGENTLOOP = {
        **settings.AGENTLOOP,
        "RATE_LIMITS": {"fake": {"requests_per_minute": 120}},
    }
    embedding_server(lambda body: _vectors(1))
    started = time.monotonic()
    for _ in range(121):  # a bucket holds a minute's worth: the 121st waits half a second
        agentloop.embed("hello", model="fake:text-embedding-3-small", record=False)
    assert time.monotonic() - started >= 0.4


# -- usage rows and budgets -----------------------------------------------------------------------
@pytest.mark.django_db
def test_each_request_is_a_usage_row_of_the_owner(user: Any) -> None:
    agentloop.embed(["one two", "three"], model=OFFLINE, owner=user)
    (row,) = Usage.objects.all()
    assert (row.provider, row.model, row.status) == ("offline", "hash-embedding", "succeeded")
    assert (row.input_tokens, row.output_tokens, row.cost) == (3, 0, Decimal(0))
    assert row.owner == user and row.chat is None and row.duration_ms is not None
    assert Usage.objects.for_owner(user).totals()["input_tokens"] == 3


@pytest.mark.django_db
def test_a_chats_embeddings_are_its_usage_rows(user: Any) -> None:
    chat = Chat.objects.create(model="offline:any", owner=user)
    agentloop.embed("remember this", model=OFFLINE, chat=chat)
    (row,) = chat.usage_records.all()
    assert row.owner == user and row.model == "hash-embedding"


@pytest.mark.django_db
def test_record_false_writes_nothing() -> None:
    agentloop.embed("nothing kept", model=OFFLINE, record=False)
    assert not Usage.objects.exists()


@pytest.mark.django_db
def test_embeddings_count_against_the_owners_budget(
    embedding_server: Any, user: Any, settings: Any
) -> None:
    settings.AGENTLOOP = {**settings.AGENTLOOP, "BUDGETS": {"cost_per_day": "5"}}
    embedding_server(lambda body: _vectors(len(body["input"]), tokens=2_000_000))
    agentloop.embed(["a", "b"], model="fake:text-embedding-3-small", owner=user)
    spend = spend_of(user)
    assert spend.cost_per_day == Decimal("0.04")  # 2M tokens at 0.02 per million
    assert spend.tokens_per_day == 2_000_000


@pytest.mark.django_db
def test_aembed_writes_the_same_rows(embedding_server: Any, user: Any) -> None:
    sent = embedding_server(lambda body: _vectors(len(body["input"]), tokens=4))
    # async_to_sync: the rows go on this test's connection (the ORM's thread in this context)
    result = async_to_sync(agentloop.aembed)(
        ["x", "y"], model="fake:text-embedding-3-small", owner=user
    )
    assert len(sent) == 1 and result.vectors == [[0.0, 1.0], [1.0, 1.0]]
    (row,) = Usage.objects.all()
    assert row.owner_id == user.pk and row.input_tokens == 4

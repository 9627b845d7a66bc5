"""Replays of the recorded prompt-cache traffic (../shared/fixtures/providers-next/).

``chat_prompt_cache_round-trip_*``: two chats with the same long instructions ask the same
question; the first call writes the prompt cache (Anthropic) or fills it (OpenAI), the
second reads it. Each chat uses ``with_caching``; we check that the requests carry the
recorded breakpoint / cache key, and that the usage rows carry the recorded cache token
counts and the cost computed from the catalog's prices (written out here, per million
tokens, from the vendors' price pages the catalog cites).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest

from agentloop import providers
from agentloop.models import Chat, Usage
from agentloop.providers.anthropic import AnthropicProvider
from agentloop.providers.openai_responses import OpenAIResponsesProvider
from tests.providers import cassettes

NEXT = cassettes.NEXT
ANTHROPIC = (
    "chat_prompt_cache_round-trip_anthropic_claude-haiku-4-5_writes_then_reads_the_prompt_cache"
)
OPENAI = "chat_prompt_cache_round-trip_openai_gpt-5_2_reuses_the_prompt_cache_with_a_shared_key"
MILLION = Decimal(1_000_000)

_pass_counts = cassettes.pass_counts(
    __name__, "Prompt cache replay (providers-next)", lambda name: name.split("_")[4]
)


@pytest.fixture(autouse=True)
def _fixtures() -> Iterator[None]:
    cassettes.require_fixtures(NEXT)
    yield
    for name in ("anthropic", "openai-responses"):
        providers.unregister(name)


def ask_in_two_chats(
    name: str, provider_class: type[Any], model: str, instructions: str, **caching: Any
) -> tuple[cassettes.Cassette, list[Chat]]:
    """Each recorded request's question, asked in a chat of its own with ``with_caching``."""
    cassette = cassettes.load(name, NEXT)
    providers.register(
        provider_class.name, provider_class(api_key="test-key", transport=cassette.transport())
    )
    chats = []
    for _ in cassette.interactions:
        chat = Chat.objects.create(model=model)
        chat.with_instructions(instructions).with_caching(**caching)
        chat.ask("Reply with exactly: OK")
        chats.append(chat)
    return cassette, chats


def usage_of(chat: Chat) -> Usage:
    (usage,) = Usage.objects.filter(chat=chat)
    return usage


# -- Anthropic ---------------------------------------------------------------------------------
@pytest.mark.django_db
@pytest.mark.parametrize("name", [ANTHROPIC], ids=[ANTHROPIC])
def test_anthropic_requests_carry_the_recorded_breakpoints(name: str) -> None:
    recorded = [i.request_body for i in cassettes.load(name, NEXT).interactions]
    instructions = recorded[0]["system"][0]["text"]

    cassette, _ = ask_in_two_chats(
        name, AnthropicProvider, f"anthropic:{recorded[0]['model']}", instructions, ttl="5m"
    )

    for ours, theirs in zip(cassette.sent_bodies(), recorded, strict=True):
        assert ours["system"][-1]["cache_control"] == {"type": "ephemeral"}
        # Ours also marks the latest message (breakpoints: tools, system, latest message);
        # the recording marked the system prompt only.
        latest = copy.deepcopy(ours)
        assert latest["messages"][-1]["content"][-1].pop("cache_control") == {"type": "ephemeral"}
        assert latest == theirs


@pytest.mark.django_db
@pytest.mark.parametrize("name", [ANTHROPIC], ids=[ANTHROPIC])
def test_anthropic_usage_rows_count_and_price_cache_writes_and_reads(name: str) -> None:
    recorded = cassettes.load(name, NEXT).interactions
    instructions = recorded[0].request_body["system"][0]["text"]

    _, chats = ask_in_two_chats(
        name, AnthropicProvider, "anthropic:claude-haiku-4-5-20251001", instructions, ttl="5m"
    )

    written, read = usage_of(chats[0]), usage_of(chats[1])
    # Recorded: 10 plain input tokens and 7351 written to the cache, then 7351 read back.
    assert (written.input_tokens, written.cache_write_tokens, written.cache_read_tokens) == (
        7361,
        7351,
        0,
    )
    assert (read.input_tokens, read.cache_write_tokens, read.cache_read_tokens) == (7361, 0, 7351)
    assert written.output_tokens == read.output_tokens == 4
    # claude-haiku-4-5: $1 input, $1.25 5-minute writes, $0.10 reads, $5 output per million.
    assert written.cost == (10 * Decimal(1) + 7351 * Decimal("1.25") + 4 * 5) / MILLION
    assert read.cost == (10 * Decimal(1) + 7351 * Decimal("0.10") + 4 * 5) / MILLION
    assert written.cost == Decimal("0.00921875")
    assert read.cost == Decimal("0.0007651")


# -- OpenAI Responses --------------------------------------------------------------------------
@pytest.mark.django_db
@pytest.mark.parametrize("name", [OPENAI], ids=[OPENAI])
def test_openai_requests_carry_the_recorded_cache_key(name: str) -> None:
    recorded = [i.request_body for i in cassettes.load(name, NEXT).interactions]

    cassette, _ = ask_in_two_chats(
        name,
        OpenAIResponsesProvider,
        f"openai-responses:{recorded[0]['model']}",
        recorded[0]["instructions"],
        key="rubyllm-test",
    )

    assert cassette.sent_bodies() == recorded
    assert {body["prompt_cache_key"] for body in cassette.sent_bodies()} == {"rubyllm-test"}


@pytest.mark.django_db
@pytest.mark.parametrize("name", [OPENAI], ids=[OPENAI])
def test_openai_usage_rows_count_and_price_cached_input(name: str) -> None:
    recorded = cassettes.load(name, NEXT).interactions

    _, chats = ask_in_two_chats(
        name,
        OpenAIResponsesProvider,
        "openai-responses:gpt-5.2",
        recorded[0].request_body["instructions"],
        key="rubyllm-test",
    )

    first, second = usage_of(chats[0]), usage_of(chats[1])
    assert (first.input_tokens, first.cache_read_tokens, first.cache_write_tokens) == (6165, 0, 0)
    assert (second.input_tokens, second.cache_read_tokens) == (6165, 6016)
    # gpt-5.2: $1.75 input, $0.175 cached input, $14 output per million.
    assert first.cost == (6165 * Decimal("1.75") + 5 * 14) / MILLION
    assert second.cost == (149 * Decimal("1.75") + 6016 * Decimal("0.175") + 5 * 14) / MILLION
    assert second.cost == Decimal("0.00138355")

"""Prompt caching: ``with_caching`` on the wire (Anthropic breakpoints, OpenAI's cache key),
cache token counts, and their prices."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import httpx
import pytest

from agentloop import chat as memory_chat
from agentloop.exceptions import ConfigurationError
from agentloop.messages import Caching, Message, ModelRequest, TokenUsage, ToolDefinition
from agentloop.models import Chat
from agentloop.providers.anthropic import AnthropicProvider
from agentloop.providers.caching import add_anthropic_breakpoints
from agentloop.providers.catalog import price_of
from agentloop.providers.openai import OpenAIProvider, OpenRouterProvider
from agentloop.providers.openai_responses import OpenAIResponsesProvider
from tests.providers.wire import answering, chat_completion

TOOL = ToolDefinition(name="lookup", description="Looks up", parameters={"type": "object"})
EPHEMERAL = {"type": "ephemeral"}


def request(caching: Caching | None, **fields: Any) -> ModelRequest:
    return ModelRequest(
        model="claude-haiku-4-5",
        messages=[
            Message(role="system", content="Be brief."),
            Message(role="user", content="Hi"),
            Message(role="assistant", content="Hello"),
            Message(role="user", content="Again"),
        ],
        tools=[TOOL, TOOL.model_copy(update={"name": "other"})],
        caching=caching,
        **fields,
    )


def anthropic_body(caching: Caching | None, **fields: Any) -> dict[str, Any]:
    return AnthropicProvider(api_key="k").build_body(request(caching, **fields), stream=False)


def marked(body: dict[str, Any]) -> list[str]:
    """Where the body's breakpoints are."""
    places = [f"tool {t['name']}" for t in body.get("tools", []) if "cache_control" in t]
    places += [f"system {b['text']}" for b in body.get("system", []) if "cache_control" in b]
    for number, message in enumerate(body["messages"]):
        for block in message["content"]:
            if "cache_control" in block:
                places.append(f"message {number} {block.get('text') or block['type']}")
    return places


# -- cost: the worked check of issue 13 ------------------------------------------------------
def test_5000_cache_write_tokens_cost_the_5m_and_1h_write_rates():
    # claude-sonnet-4-5: $3 per million input tokens; writes cost 1.25x (5m) or 2x (1h).
    plain = TokenUsage(input_tokens=5000)
    five_minutes = TokenUsage(input_tokens=5000, cache_write_tokens=5000)
    one_hour = TokenUsage(input_tokens=5000, cache_write_tokens=5000, cache_write_1h_tokens=5000)

    assert price_of("claude-sonnet-4-5", plain) == Decimal("0.015")
    assert price_of("claude-sonnet-4-5", five_minutes) == Decimal("0.01875")
    assert price_of("claude-sonnet-4-5", one_hour) == Decimal("0.03")


def test_cache_reads_cost_a_tenth_of_input_on_anthropic_and_the_catalog_price_on_openai():
    usage = TokenUsage(input_tokens=10_000, cache_read_tokens=10_000)

    assert price_of("claude-sonnet-4-5", usage) == Decimal("0.003")  # $0.30 per million
    assert price_of("gpt-5-mini", usage) == Decimal("0.00025")  # $0.025 per million


def test_openai_cache_writes_are_priced_as_input():
    usage = TokenUsage(input_tokens=1000, cache_write_tokens=1000)

    assert price_of("gpt-5-mini", usage) == price_of("gpt-5-mini", TokenUsage(input_tokens=1000))


def test_cached_tokens_is_the_old_name_of_cache_read_tokens():
    usage = TokenUsage(input_tokens=10, cached_tokens=4)

    assert usage.cache_read_tokens == usage.cached_tokens == 4


def test_anthropic_usage_splits_one_hour_writes_and_prices_them_at_twice_input():
    provider, _ = answering(
        AnthropicProvider,
        httpx.Response(
            200,
            json={
                "id": "msg_1",
                "model": "claude-sonnet-4-5",
                "content": [{"type": "text", "text": "OK"}],
                "stop_reason": "end_turn",
                "usage": {
                    "input_tokens": 0,
                    "cache_creation_input_tokens": 5000,
                    "cache_read_input_tokens": 0,
                    "cache_creation": {
                        "ephemeral_5m_input_tokens": 0,
                        "ephemeral_1h_input_tokens": 5000,
                    },
                    "output_tokens": 0,
                },
            },
        ),
        api_key="k",
    )

    response = provider.request(request(Caching(ttl="1h")))

    assert (response.usage.cache_write_tokens, response.usage.cache_write_1h_tokens) == (
        5000,
        5000,
    )
    assert provider.cost("claude-sonnet-4-5", response.usage) == Decimal("0.03")


# -- Anthropic breakpoints ---------------------------------------------------------------------
def test_anthropic_marks_the_last_tool_the_system_prompt_and_the_latest_message():
    body = anthropic_body(Caching())

    assert marked(body) == ["tool other", "system Be brief.", "message 2 Again"]
    assert body["system"][0]["cache_control"] == EPHEMERAL


def test_an_hour_long_cache_says_so_on_every_breakpoint():
    body = anthropic_body(Caching(ttl="1h"))

    assert body["tools"][-1]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    assert body["messages"][-1]["content"][-1]["cache_control"] == {
        "type": "ephemeral",
        "ttl": "1h",
    }


def test_without_caching_nothing_is_marked():
    assert marked(anthropic_body(None)) == []


def test_breakpoints_set_by_hand_count_towards_the_limit_of_four():
    by_hand = [{"type": "text", "text": f"part {n}", "cache_control": EPHEMERAL} for n in range(3)]

    body = anthropic_body(Caching(), provider_options={"system": by_hand})

    assert marked(body) == ["tool other", "system part 0", "system part 1", "system part 2"]


def test_a_thinking_block_is_never_marked():
    body = {
        "messages": [
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Sure"},
                    {"type": "thinking", "thinking": "hm", "signature": "s"},
                ],
            }
        ]
    }

    add_anthropic_breakpoints(body, Caching())

    assert body["messages"][0]["content"][0]["cache_control"] == EPHEMERAL
    assert "cache_control" not in body["messages"][0]["content"][1]


# -- OpenAI's cache key ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("provider_class", "sends_key"),
    [(OpenAIProvider, True), (OpenRouterProvider, False)],
)
def test_chat_completions_sends_the_key_to_api_openai_com_only(provider_class, sends_key):
    provider, recorder = answering(provider_class, chat_completion(), api_key="k")

    provider.request(request(Caching(key="chat-7")).model_copy(update={"model": "gpt-5-mini"}))

    assert ("prompt_cache_key" in recorder.bodies[0]) is sends_key
    if sends_key:
        assert recorder.bodies[0]["prompt_cache_key"] == "chat-7"


def test_responses_sends_the_key_and_nothing_without_caching():
    provider = OpenAIResponsesProvider(api_key="k")

    cached = provider.build_body(request(Caching(key="chat-7")), stream=False)
    plain = provider.build_body(request(None), stream=False)

    assert cached["prompt_cache_key"] == "chat-7"
    assert "prompt_cache_key" not in plain


# -- with_caching ------------------------------------------------------------------------------
@pytest.mark.django_db
def test_each_chat_gets_a_stable_cache_key_of_its_own():
    first = Chat.objects.create(model="anthropic:claude-haiku-4-5").with_caching()
    second = Chat.objects.create(model="anthropic:claude-haiku-4-5").with_caching("1h")
    key = first.conversation.store.config.get_config().caching.key

    again = Chat.objects.get(pk=first.pk).with_caching("1h")

    assert key and key.startswith("agentloop-")
    assert again.conversation.store.config.get_config().caching == Caching(ttl="1h", key=key)
    assert second.conversation.store.config.get_config().caching.key != key


def test_with_caching_none_turns_it_off_and_a_bad_ttl_is_one_clear_line():
    conversation = memory_chat("anthropic:claude-haiku-4-5").with_caching(key="shared")

    with pytest.raises(ConfigurationError) as caught:
        conversation.with_caching("2h")

    assert "ttl='5m' or ttl='1h'" in str(caught.value) and "\n" not in str(caught.value)
    assert conversation.store.config.get_config().caching == Caching(key="shared")
    assert conversation.with_caching(None).store.config.get_config().caching is None

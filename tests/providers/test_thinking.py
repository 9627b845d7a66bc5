"""Thinking: ``with_thinking`` mapped per provider, thinking text and deltas parsed, and
replay data sent back only to the provider that made it."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import pytest

from agentloop import chat as memory_chat
from agentloop.exceptions import ConfigurationError
from agentloop.messages import Message, ModelRequest, TextDelta, Thinking, ThinkingDelta
from agentloop.providers.anthropic import AnthropicProvider
from agentloop.providers.gemini import GeminiProvider
from agentloop.providers.gemini.mapping import PARTS_KEY
from agentloop.providers.openai import DeepSeekProvider, OpenAIProvider, OpenRouterProvider
from agentloop.providers.openai_responses import OpenAIResponsesProvider
from agentloop.providers.thinking import REPLAY_PROVIDER
from tests.providers.wire import answering, event_stream


def ask(model: str, thinking: Thinking | None, *earlier: Message) -> ModelRequest:
    messages = [*earlier, Message(role="user", content="What is 5 + 3?")]
    return ModelRequest(model=model, messages=messages, thinking=thinking)


def body(provider: Any, model: str, thinking: Thinking | None) -> dict[str, Any]:
    built: dict[str, Any] = provider.build_body(ask(model, thinking), stream=False)
    return built


# -- the request fields, per provider ------------------------------------------------------------
@pytest.mark.parametrize(
    ("thinking", "expected"),
    [
        (Thinking(effort="low"), {"type": "enabled", "budget_tokens": 1024}),
        (Thinking(effort="high"), {"type": "enabled", "budget_tokens": 16384}),
        (Thinking(effort="low", budget_tokens=3000), {"type": "enabled", "budget_tokens": 3000}),
        (Thinking(effort=None), {"type": "disabled"}),
    ],
)
def test_anthropic_takes_a_budget(thinking, expected):
    assert (
        body(AnthropicProvider(api_key="k"), "claude-haiku-4-5", thinking)["thinking"] == expected
    )


@pytest.mark.parametrize(
    ("provider", "model", "thinking", "expected"),
    [
        (OpenAIProvider, "gpt-5-mini", Thinking(effort="low"), {"reasoning_effort": "low"}),
        (OpenAIProvider, "gpt-5-mini", Thinking(effort=None), {}),
        (
            OpenRouterProvider,
            "anthropic/claude-haiku-4.5",
            Thinking(effort="medium"),
            {"reasoning": {"effort": "medium"}},
        ),
        (
            OpenRouterProvider,
            "anthropic/claude-haiku-4.5",
            Thinking(effort="medium", budget_tokens=2000),
            {"reasoning": {"max_tokens": 2000}},
        ),
        (
            OpenRouterProvider,
            "anthropic/claude-haiku-4.5",
            Thinking(effort=None),
            {"reasoning": {"enabled": False}},
        ),
        (
            DeepSeekProvider,
            "deepseek-v4-flash",
            Thinking(effort="high"),
            {"reasoning_effort": "high", "thinking": {"type": "enabled"}},
        ),
        (
            DeepSeekProvider,
            "deepseek-v4-flash",
            Thinking(effort=None),
            {"thinking": {"type": "disabled"}},
        ),
        (
            DeepSeekProvider,
            "deepseek-reasoner",
            Thinking(effort="medium"),
            {"reasoning_effort": "medium"},
        ),
    ],
)
def test_chat_completions_servers_each_read_their_own_fields(provider, model, thinking, expected):
    built = body(provider(api_key="k"), model, thinking)
    plain = body(provider(api_key="k"), model, None)

    assert {key: value for key, value in built.items() if key not in plain} == expected


def test_responses_asks_for_an_effort_and_a_readable_summary():
    provider = OpenAIResponsesProvider(api_key="k")

    assert body(provider, "gpt-5-mini", Thinking(effort="high"))["reasoning"] == {
        "effort": "high",
        "summary": "auto",
    }
    assert "reasoning" not in body(provider, "gpt-5-mini", Thinking(effort=None))
    assert "reasoning" not in body(provider, "gpt-5-mini", None)


@pytest.mark.parametrize(
    ("model", "thinking", "expected"),
    [
        (
            "gemini-2.5-flash",
            Thinking(effort="low"),
            {"includeThoughts": True, "thinkingBudget": 1024},
        ),
        ("gemini-2.5-flash", Thinking(effort=None), {"thinkingBudget": 0}),
        (
            "gemini-3-pro-preview",
            Thinking(effort="high"),
            {"includeThoughts": True, "thinkingLevel": "high"},
        ),
    ],
)
def test_gemini_takes_a_budget_or_a_level(model, thinking, expected):
    built = body(GeminiProvider(api_key="k"), model, thinking)

    assert built["generationConfig"]["thinkingConfig"] == expected


def test_without_with_thinking_no_provider_sends_a_thinking_field():
    for provider, model in [
        (AnthropicProvider, "claude-haiku-4-5"),
        (DeepSeekProvider, "deepseek-v4-flash"),
        (OpenRouterProvider, "anthropic/claude-haiku-4.5"),
        (GeminiProvider, "gemini-2.5-flash"),
    ]:
        built = json.dumps(body(provider(api_key="k"), model, None))
        assert "thinking" not in built and "reasoning" not in built, provider


@pytest.mark.parametrize(
    ("provider", "model"),
    [
        (OpenAIProvider, "gpt-4.1-mini"),
        (OpenAIProvider, "gpt-4o-2024-08-06"),
        (OpenAIResponsesProvider, "gpt-4.1-mini"),
        (AnthropicProvider, "claude-3-5-haiku"),
        (GeminiProvider, "gemini-2.0-flash"),
    ],
)
@pytest.mark.parametrize("thinking", [Thinking(effort="medium"), Thinking(effort=None),
                                      Thinking(budget_tokens=2048)])  # fmt: skip
def test_a_model_the_catalog_lists_without_thinking_gets_no_thinking_field(
    provider, model, thinking, caplog
):
    caplog.set_level(logging.DEBUG, logger="agentloop.providers.model_options")

    built = json.dumps(body(provider(api_key="k"), model, thinking))

    assert "thinking" not in built.lower() and "reasoning" not in built, built
    (line,) = caplog.messages
    assert f"not sent to {model}: the model catalog lists it without thinking" in line
    assert line.startswith(f"{provider.name}: with_thinking(effort=")


@pytest.mark.parametrize(
    ("provider", "model", "field"),
    [
        (OpenAIProvider, "our-reasoner", "reasoning_effort"),
        (OpenAIResponsesProvider, "our-reasoner", "reasoning"),
        (AnthropicProvider, "claude-next", "thinking"),
    ],
)
def test_a_model_the_catalog_does_not_list_gets_what_was_asked_for(provider, model, field):
    assert field in body(provider(api_key="k"), model, Thinking(effort="low"))


def test_with_thinking_rejects_an_unknown_effort_in_one_line():
    conversation = memory_chat("anthropic:claude-haiku-4-5")

    with pytest.raises(ConfigurationError) as caught:
        conversation.with_thinking("extreme")

    assert "effort 'low', 'medium', 'high' or None" in str(caught.value)
    assert "\n" not in str(caught.value)
    assert conversation.with_thinking("low").store.config.get_config().thinking == Thinking(
        effort="low"
    )


# -- answers: thinking text and deltas -----------------------------------------------------------
def test_responses_reasoning_summaries_become_thinking_and_stream_as_thinking_deltas():
    events = [
        {"type": "response.reasoning_summary_text.delta", "delta": "Add "},
        {"type": "response.reasoning_summary_text.delta", "delta": "them."},
        {"type": "response.output_text.delta", "delta": "8"},
        {
            "type": "response.completed",
            "response": {
                "id": "resp_1",
                "model": "gpt-5-mini",
                "status": "completed",
                "output": [
                    {
                        "type": "reasoning",
                        "id": "rs_1",
                        "summary": [{"type": "summary_text", "text": "Add them."}],
                        "encrypted_content": "enc",
                    },
                    {"type": "message", "content": [{"type": "output_text", "text": "8"}]},
                ],
            },
        },
    ]
    stream = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)
    provider, _ = answering(OpenAIResponsesProvider, event_stream(stream), api_key="k")
    chunks: list[Any] = []

    response = provider.request(
        ask("gpt-5-mini", Thinking()).model_copy(update={"stream": True}), on_chunk=chunks.append
    )

    assert response.thinking == "Add them."
    assert chunks == [ThinkingDelta(text="Add "), ThinkingDelta(text="them."), TextDelta(text="8")]
    assert response.provider_data[REPLAY_PROVIDER] == "openai-responses"


def test_gemini_thought_parts_become_thinking_and_stream_as_thinking_deltas():
    parts = [{"text": "Adding.", "thought": True}, {"text": "8"}]
    data = {"candidates": [{"content": {"parts": parts}, "finishReason": "STOP"}]}
    provider, _ = answering(
        GeminiProvider, event_stream(f"data: {json.dumps(data)}\n\n"), api_key="k"
    )
    chunks: list[Any] = []

    response = provider.request(
        ask("gemini-2.5-flash", Thinking()).model_copy(update={"stream": True}),
        on_chunk=chunks.append,
    )

    assert (response.thinking, response.content) == ("Adding.", "8")
    assert chunks == [ThinkingDelta(text="Adding."), TextDelta(text="8")]


# -- replay data goes back to the provider that made it, and only to it ------------------------
SIGNED = Message(
    role="assistant",
    content="8",
    thinking="5 + 3 = 8.",
    provider_data={
        "anthropic_content": [
            {"type": "thinking", "thinking": "5 + 3 = 8.", "signature": "sig-1"},
            {"type": "text", "text": "8"},
        ],
        REPLAY_PROVIDER: "anthropic",
    },
)
QUESTION = Message(role="user", content="What is 5 + 3?")


def test_anthropic_blocks_go_back_to_the_provider_that_made_them():
    request = ask("claude-haiku-4-5", Thinking(), QUESTION, SIGNED)

    same = AnthropicProvider(api_key="k").build_body(request, stream=False)
    other = AnthropicProvider(api_key="k", name="anthropic-backup").build_body(
        request, stream=False
    )

    assert same["messages"][1]["content"][0]["signature"] == "sig-1"
    assert other["messages"][1]["content"] == [{"type": "text", "text": "8"}]


def test_openrouter_details_and_deepseek_reasoning_stay_with_their_provider():
    details = [{"type": "reasoning.text", "text": "hm", "signature": "sig-2", "index": 0}]
    from_openrouter = Message(
        role="assistant",
        content="8",
        provider_data={
            "reasoning_details": details,
            "reasoning": "hm",
            REPLAY_PROVIDER: "openrouter",
        },
    )
    from_deepseek = Message(
        role="assistant",
        content="8",
        provider_data={"reasoning": "hm", REPLAY_PROVIDER: "deepseek"},
    )

    def assistant(provider: Any, earlier: Message) -> dict[str, Any]:
        request = ask("m", None, QUESTION, earlier)
        message: dict[str, Any] = provider.build_body(request, stream=False)["messages"][1]
        return message

    assert (
        assistant(OpenRouterProvider(api_key="k"), from_openrouter)["reasoning_details"] == details
    )
    assert "reasoning_details" not in assistant(DeepSeekProvider(api_key="k"), from_openrouter)
    assert assistant(DeepSeekProvider(api_key="k"), from_deepseek)["reasoning_content"] == "hm"
    assert set(assistant(OpenRouterProvider(api_key="k"), from_deepseek)) == {"role", "content"}


def test_gemini_signatures_stay_with_their_provider():
    earlier = Message(
        role="assistant",
        content="8",
        provider_data={
            PARTS_KEY: [
                {"text": "thinking", "thought": True, "thoughtSignature": "sig-3"},
                {"text": "8"},
            ],
            REPLAY_PROVIDER: "gemini",
        },
    )
    request = ask("gemini-2.5-flash", None, QUESTION, earlier)

    same = GeminiProvider(api_key="k").build_body(request, stream=False)
    other = GeminiProvider(api_key="k", name="vertex").build_body(request, stream=False)

    assert "sig-3" in json.dumps(same)
    assert other["contents"][1] == {"role": "model", "parts": [{"text": "8"}]}


def test_a_deepseek_answer_keeps_reasoning_content_with_no_configuration():
    answer = httpx.Response(
        200,
        json={
            "id": "1",
            "model": "deepseek-v4-flash",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "8", "reasoning_content": "5+3"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 5, "completion_tokens": 3},
        },
    )
    provider, _ = answering(DeepSeekProvider, answer, api_key="k")

    response = provider.request(ask("deepseek-v4-flash", None))

    assert response.thinking == response.provider_data["reasoning"] == "5+3"
    assert provider.base_url == "https://api.deepseek.com"

"""Options follow the model, not the chat (docs/thinking.md): thinking the chat asked for is
not sent to a model the catalog lists without thinking, after ``with_model``, on a fallback
and in a background step; the chat keeps the setting for the models that take it.

Providers are real, at the HTTP edge (``httpx.MockTransport``), so what is checked is the
body each vendor would have received."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from django.test import override_settings

from agentloop.models import Chat
from agentloop.providers.anthropic import AnthropicProvider
from agentloop.providers.gemini import GeminiProvider
from agentloop.providers.openai import OpenAIProvider
from agentloop.runners import run_step
from tests.providers.wire import Recorder, chat_completion, event_stream, registered
from tests.providers.wire import anthropic_answer as anthropic_reply

pytestmark = pytest.mark.django_db

FAST = {"MODEL_RETRIES": 0, "RETRY_BACKOFF": 0.001, "RETRY_BACKOFF_MAX": 0.001}


def openai_answer(request: httpx.Request) -> httpx.Response:
    """A Chat Completions answer, streamed when asked (background steps stream)."""
    if not json.loads(request.content)["stream"]:
        return chat_completion("Hi")
    pieces = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hi"}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    data = [json.dumps(piece) for piece in pieces] + ["[DONE]"]
    return event_stream("".join(f"data: {line}\n\n" for line in data))


def openai_edge() -> tuple[Recorder, Callable[[], Any]]:
    recorder = Recorder(*(openai_answer for _ in range(4)))
    return recorder, lambda: registered(
        "openai", OpenAIProvider(api_key="k", transport=recorder.transport())
    )


def anthropic_answer(request: httpx.Request) -> httpx.Response:
    """Claude Haiku 4.5 is overloaded; any other model answers."""
    if json.loads(request.content)["model"] == "claude-haiku-4-5":
        error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
        return httpx.Response(529, json=error)
    return anthropic_reply("Hi")


@pytest.fixture
def debug_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.DEBUG, logger="agentloop")
    yield caplog


def dropped(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "not sent" in r.getMessage()]


# -- the review's defect -----------------------------------------------------------------------
def test_a_chat_switched_from_a_reasoning_model_to_gpt_4_1_mini_sends_no_reasoning_effort(
    debug_log,
):
    recorder, serving = openai_edge()
    with serving():
        chat = Chat.objects.create(model="openai:gpt-5-mini").with_thinking("medium")
        chat.ask("Hi")
        Chat.objects.get(pk=chat.pk).with_model("openai:gpt-4.1-mini").ask("And now?")

    first, second = recorder.bodies
    assert first["reasoning_effort"] == "medium"
    assert second["model"] == "gpt-4.1-mini"
    assert "reasoning_effort" not in second
    assert dropped(debug_log) == [
        "openai: with_thinking(effort='medium') not sent to gpt-4.1-mini: the model catalog "
        "lists it without thinking"
    ]


def test_the_chat_keeps_its_thinking_for_the_next_model_that_takes_it():
    recorder, serving = openai_edge()
    with serving():
        chat = Chat.objects.create(model="openai:gpt-4.1-mini").with_thinking("high")
        chat.ask("Hi")
        Chat.objects.get(pk=chat.pk).with_model("openai:o4-mini").ask("And now?")

    assert "reasoning_effort" not in recorder.bodies[0]
    assert recorder.bodies[1]["reasoning_effort"] == "high"


def test_a_background_step_drops_it_too():
    recorder, serving = openai_edge()
    with serving():
        chat = Chat.objects.create(model="openai:gpt-4.1-mini").with_thinking("low")
        chat.ask_later("Hi")
        chat.complete_later()
        assert run_step(chat.pk).action == "done"

    (body,) = recorder.bodies
    assert body["model"] == "gpt-4.1-mini" and "reasoning_effort" not in body


def test_a_model_the_catalog_does_not_know_gets_what_the_chat_asked_for():
    recorder, serving = openai_edge()
    with serving():
        Chat.objects.create(model="openai:our-fine-tuned-model").with_thinking("low").ask("Hi")

    assert recorder.bodies[0]["reasoning_effort"] == "low"


# -- fallbacks -----------------------------------------------------------------------------------
def test_a_fallback_from_an_anthropic_thinking_model_to_one_without_thinking(debug_log):
    recorder = Recorder(anthropic_answer, anthropic_answer)
    with (
        override_settings(AGENTLOOP=FAST),
        registered("anthropic", AnthropicProvider(api_key="k", transport=recorder.transport())),
    ):
        chat = Chat.objects.create(model="anthropic:claude-haiku-4-5").with_thinking("low")
        chat.with_fallbacks("anthropic:claude-3-5-haiku")
        assert chat.ask("Hi").content == "Hi"

    thinking, fallback = recorder.bodies
    assert thinking["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assert fallback["model"] == "claude-3-5-haiku"
    assert "thinking" not in fallback
    assert dropped(debug_log) == [
        "anthropic: with_thinking(effort='low') not sent to claude-3-5-haiku: the model "
        "catalog lists it without thinking"
    ]


def test_a_fallback_to_another_family_without_thinking():
    anthropic = Recorder(anthropic_answer)
    recorder, serving = openai_edge()
    with (
        override_settings(AGENTLOOP=FAST),
        registered("anthropic", AnthropicProvider(api_key="k", transport=anthropic.transport())),
        serving(),
    ):
        chat = Chat.objects.create(model="anthropic:claude-haiku-4-5").with_thinking("high")
        chat.with_fallbacks("openai:gpt-4.1-mini").ask("Hi")

    (body,) = recorder.bodies
    assert body["model"] == "gpt-4.1-mini" and "reasoning_effort" not in body


def test_a_fallback_to_a_reasoning_model_sends_no_temperature(debug_log):
    def answer(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content)["model"] == "gpt-4.1-mini":
            return httpx.Response(503, json={"error": {"message": "Unavailable"}})
        return chat_completion("Hi")

    recorder = Recorder(answer, answer)
    with (
        override_settings(AGENTLOOP=FAST),
        registered("openai", OpenAIProvider(api_key="k", transport=recorder.transport())),
    ):
        chat = Chat.objects.create(model="openai:gpt-4.1-mini").with_temperature(0.2)
        assert chat.with_fallbacks("openai:gpt-5-mini").ask("Hi").content == "Hi"

    first, fallback = recorder.bodies
    assert first["temperature"] == 0.2
    assert fallback["model"] == "gpt-5-mini" and "temperature" not in fallback
    assert dropped(debug_log) == [
        "openai: temperature=0.2 not sent to gpt-5-mini: the model catalog lists it without "
        "temperature"
    ]


# -- Gemini ---------------------------------------------------------------------------------------
def test_gemini_sends_no_thinking_config_to_a_model_without_thinking():
    answer = {
        "candidates": [
            {"content": {"role": "model", "parts": [{"text": "Hi"}]}, "finishReason": "STOP"}
        ]  # fmt: skip
    }
    recorder = Recorder(*(httpx.Response(200, json=answer) for _ in range(2)))
    with registered("gemini", GeminiProvider(api_key="k", transport=recorder.transport())):
        chat = Chat.objects.create(model="gemini:gemini-2.5-flash").with_thinking("low")
        chat.ask("Hi")
        Chat.objects.get(pk=chat.pk).with_model("gemini:gemini-2.0-flash").ask("And now?")

    thinking, plain = recorder.bodies
    assert thinking["generationConfig"]["thinkingConfig"]["thinkingBudget"] == 1024
    assert "thinkingConfig" not in json.dumps(plain)


def test_vertex_ai_shares_the_gemini_mapping_and_drops_thinking_the_same_way():
    from agentloop.messages import Message, ModelRequest, Thinking
    from agentloop.providers.vertex import VertexAIProvider

    vertex = VertexAIProvider(project="p", location="global")
    asked = {"thinking": Thinking(effort="low"), "messages": [Message(role="user", content="Hi")]}

    thinking = vertex.build_body(ModelRequest(model="gemini-2.5-flash", **asked), stream=False)
    plain = vertex.build_body(ModelRequest(model="gemini-2.0-flash", **asked), stream=False)

    assert thinking["generationConfig"]["thinkingConfig"]["thinkingBudget"] == 1024
    assert "thinkingConfig" not in json.dumps(plain)

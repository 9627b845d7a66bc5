"""The recorded traffic, replayed through the async path (``HTTPProvider.arequest``).

For every cassette of each family (Chat Completions, Responses, Anthropic Messages, Gemini),
interaction by interaction, the same request goes out through ``request()`` and through
``arequest()`` (``httpx.AsyncClient``, the shared push parsers): both send the same request
and make the same answer of the recording (text, tool calls, usage, the streamed chunks) or
raise the same error. The sync answers are checked against the recordings by the other
replay modules; here the async path must equal them. Then a persisted chat streams a
two-round tool conversation of each family with ``aask`` and an ``async def`` callback.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import async_to_sync

from agentloop.exceptions import ProviderError
from agentloop.messages import Message, ModelRequest
from agentloop.models import Chat
from agentloop.providers.anthropic import AnthropicProvider
from agentloop.providers.gemini import GeminiProvider
from agentloop.providers.http import HTTPProvider
from agentloop.providers.openai import (
    DeepSeekProvider,
    OllamaProvider,
    OpenAIProvider,
    OpenRouterProvider,
)
from agentloop.providers.openai_responses import OpenAIResponsesProvider

from . import cassettes
from .cassettes import (
    WEATHER_QUESTIONS,
    assert_each_answer_was_streamed,
    assert_two_complete_rounds,
    names,
    weather_chat,
)

# every test here replays the recordings (of providers/ and providers-next/): skipped without
# them (failing under CI=true)
cassettes.require_fixtures()
cassettes.require_fixtures(cassettes.NEXT)
FAMILIES: dict[str, tuple[str, type[HTTPProvider]]] = {
    "chat-completions": ("openrouter_claude-haiku-4-5", OpenRouterProvider),
    "chat-completions-ollama": ("ollama_qwen3", OllamaProvider),
    "responses": ("openai_gpt-5-nano", OpenAIResponsesProvider),
    "anthropic": ("anthropic_claude-haiku-4-5", AnthropicProvider),
    "gemini": ("gemini_gemini-2_5-flash", GeminiProvider),
}
CASES = [
    pytest.param(family, name, id=name)
    for family, (part, _) in FAMILIES.items()
    for name in names(part)
    if not name.startswith("batch_")
]


def _outcome(provider: HTTPProvider, request: ModelRequest, use_async: bool) -> Any:
    """What the provider makes of one recorded answer: (response, chunks) or the error."""
    chunks: list[Any] = []

    async def on_chunk_async(chunk: Any) -> None:
        chunks.append(chunk)

    try:
        if use_async:
            on_chunk = on_chunk_async if request.stream else None
            response = asyncio.run(provider.arequest(request, on_chunk=on_chunk))
        else:
            response = provider.request(request, on_chunk=chunks.append if request.stream else None)
    except ProviderError as exc:
        return ("error", type(exc), str(exc), exc.status, exc.retryable)
    return ("answer", response.model_dump(), [chunk.model_dump() for chunk in chunks])


def _without_made_up_ids(outcome: Any) -> Any:
    """Gemini sends no call ids: the provider makes one up per call ("call_" and a random
    hex), different in each run; they are blanked for the comparison."""
    if outcome[0] != "answer":
        return outcome
    _, response, chunks = outcome
    for item in [*response["tool_calls"], *chunks]:
        if isinstance(item.get("id"), str) and item["id"].startswith("call_"):
            item["id"] = "made up"
    return outcome


@pytest.mark.parametrize(("family", "name"), CASES)
def test_the_async_request_answers_as_the_sync_one(family: str, name: str) -> None:
    provider_class = FAMILIES[family][1]
    kinds: set[str] = set()
    for interaction in cassettes.cached(name).interactions:
        request = ModelRequest(
            model="m",
            messages=[Message(role="user", content="Hi")],
            stream=interaction.is_stream and interaction.status < 400,
        )
        outcomes, sent = [], []
        for use_async in (False, True):
            provider, replay = cassettes.serve(provider_class, interaction)
            outcomes.append(_outcome(provider, request, use_async))
            (request_sent,) = replay.sent
            sent.append((request_sent.url, request_sent.content, dict(request_sent.headers)))
        if family == "gemini":
            outcomes = [_without_made_up_ids(outcome) for outcome in outcomes]
        sync_outcome, async_outcome = outcomes
        assert async_outcome == sync_outcome
        assert sent[1] == sent[0]  # the same URL, body and headers (the key's among them)
        if async_outcome[0] == "error":
            assert "test-key" not in async_outcome[2]  # the key never shows in an error
            kinds.add("error")
        else:
            response = async_outcome[1]
            kinds.add("stream" if request.stream else "text")
            if response["tool_calls"]:
                kinds.add("tool calls")
    assert kinds  # every cassette gave at least one answer or error


def test_every_family_replays_text_tool_calls_streams_and_errors() -> None:
    """The cases above cover each kind of answer for each family's own recordings."""
    groups: dict[str, list[str]] = {}
    for family, (part, _) in FAMILIES.items():
        groups.setdefault(family.split("-ollama")[0], []).append(part)
    for family, parts in groups.items():
        recorded = [i for part in parts for n in names(part) if not n.startswith("batch_")
                    for i in cassettes.cached(n).interactions]  # fmt: skip
        assert any(i.status >= 400 for i in recorded), family
        assert any(i.is_stream and i.status < 400 for i in recorded), family
        assert any(not i.is_stream and i.status < 400 for i in recorded), family
        tools = [i for i in recorded if "tool" in i.response_text or "function" in i.response_text]
        assert tools, family


# -- the newer recordings: thinking and prompt caching ------------------------------------------
def _provider_for(uri: str) -> type[HTTPProvider]:
    """The provider class that spoke to ``uri`` in the recording."""
    if uri.endswith("/responses"):
        return OpenAIResponsesProvider
    if uri.endswith("/v1/messages"):
        return AnthropicProvider
    if "deepseek" in uri:
        return DeepSeekProvider
    return OpenRouterProvider if "openrouter" in uri else OpenAIProvider


NEXT_CASES = [name for name in names("", cassettes.NEXT) if "count_tokens" not in name]


@pytest.mark.parametrize("name", NEXT_CASES)
def test_thinking_and_caching_answer_alike_through_the_async_request(name: str) -> None:
    thoughts = []
    for interaction in cassettes.load(name, cassettes.NEXT).interactions:
        provider_class = _provider_for(interaction.uri)
        stream = interaction.is_stream and interaction.status < 400
        request = ModelRequest(
            model="m", messages=[Message(role="user", content="Hi")], stream=stream
        )
        outcomes = []
        for use_async in (False, True):
            provider, _ = cassettes.serve(provider_class, interaction)
            outcomes.append(_outcome(provider, request, use_async))
        assert outcomes[1] == outcomes[0]
        if outcomes[1][0] == "answer":
            thoughts.append(outcomes[1][1]["thinking"])
    if any(part in name for part in ("returns_thinking", "streams_thinking", "reasoning_content")):
        assert any(thoughts), name  # the recorded thinking came through the async path


# -- a persisted chat, streaming over recorded traffic with the async verbs ------------------------
STREAMING = {
    "chat-completions": OpenRouterProvider,
    "responses": OpenAIResponsesProvider,
    "anthropic": AnthropicProvider,
    "gemini": GeminiProvider,
}


@pytest.mark.django_db
@pytest.mark.parametrize("family", list(STREAMING))
def test_a_persisted_chat_streams_two_tool_rounds_with_aask(replaying, user, family) -> None:
    part = FAMILIES[family][0]
    name = f"chat_function_calling_{part}_can_use_tools_with_multi-turn_streaming_conversations"
    cassette = replaying(name, STREAMING[family], register_as="areplay")
    sync_cassette = replaying(name, STREAMING[family], register_as="sreplay")
    model = cassettes.cached(name).interactions[0].request_body.get("model", "m")
    chat = weather_chat(f"areplay:{model}", user)
    sync_chat = weather_chat(f"sreplay:{model}", user)

    async def ask_both() -> list[tuple[Any, list[Any]]]:
        answers = []
        for question in WEATHER_QUESTIONS:
            chunks: list[Any] = []

            async def on_chunk(chunk: Any, chunks: list[Any] = chunks) -> None:
                chunks.append(chunk)

            answers.append((await chat.aask(question, on_chunk), chunks))
        return answers

    answers = async_to_sync(ask_both)()
    for question in WEATHER_QUESTIONS:
        sync_chat.ask(question, stream=lambda chunk: None)

    assert_each_answer_was_streamed(answers)
    rows = assert_two_complete_rounds(chat)
    assert [r.content for r in rows] == [r.content for r in assert_two_complete_rounds(sync_chat)]
    assert cassette.sent_bodies() == sync_cassette.sent_bodies()
    assert len(cassette.sent_bodies()) == 4
    assert Chat.objects.get(pk=chat.pk).state == "idle"

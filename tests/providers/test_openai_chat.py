"""OpenAI Chat Completions (and OpenRouter, Ollama) on the project's own small fixtures:
configuration, request mapping, answers, streams, errors, and persisted chats over recorded
wire data."""

from __future__ import annotations

import copy
import json
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.test import override_settings

from agentloop import providers
from agentloop.exceptions import (
    AuthenticationError,
    BadRequestError,
    CancelledError,
    ConfigurationError,
    ContextLengthError,
    InvalidResponseError,
    ProviderTimeout,
    RateLimitError,
    ServerError,
    StreamInterruptedError,
)
from agentloop.messages import (
    Message,
    ModelRequest,
    TextDelta,
    ThinkingDelta,
    TokenUsage,
    ToolCall,
    ToolCallDelta,
    ToolDefinition,
)
from agentloop.models import Usage
from agentloop.providers.common import INVALID_ARGUMENTS
from agentloop.providers.openai import (
    OllamaProvider,
    OpenAIProvider,
    OpenRouterProvider,
    strict_json_schema,
)
from tests.doc_blocks import runnable
from tests.helpers import user_request
from tests.providers.cassettes import (
    ask_both,
    assert_claude_answered_both,
    assert_each_answer_was_streamed,
    assert_two_complete_rounds,
    stream_both,
    weather_chat,
)
from tests.providers.wire import (
    Recorder,
    an_invalid_call_answered,
    answering,
    cancelling,
    event_stream,
    read_timeout,
    shown,
)
from tests.providers.wire import openai_error as error

MODEL = "gpt-4.1-mini"
KEY = "sk-proj-secretsecretsecret1234"


# -- helpers -------------------------------------------------------------------------------
def make(
    *responses: Any, provider_class: type[OpenAIProvider] = OpenAIProvider, **options: Any
) -> tuple[OpenAIProvider, Recorder]:
    options.setdefault("api_key", KEY)
    return answering(provider_class, *responses, **options)


def completion(
    content: str | None = "Hello!",
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    finish: str = "stop",
    **usage: Any,
) -> httpx.Response:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return httpx.Response(
        200,
        json={
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": "gpt-4.1-mini-2025-04-14",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, **usage},
        },
    )


def function_call(call_id: str, name: str, arguments: str, index: int = 0) -> dict[str, Any]:
    return {
        "index": index,
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> str:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return json.dumps({"id": "chatcmpl-s", "model": MODEL, "choices": choices, **extra})


def sse(*data: str) -> httpx.Response:
    return event_stream("".join(f"data: {item}\n\n" for item in data))


ask = partial(user_request, MODEL)  # one user message to this file's model


WEATHER = ToolDefinition(
    name="weather",
    description="Gets the weather",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
)


# -- configuration -------------------------------------------------------------------------
def test_requests_go_to_chat_completions_with_a_bearer_key() -> None:
    provider, recorder = make(completion())

    provider.request(ask())

    sent = recorder.requests[0]
    assert sent.method == "POST"
    assert str(sent.url) == "https://api.openai.com/v1/chat/completions"
    assert sent.headers["authorization"] == f"Bearer {KEY}"


def test_the_key_and_base_url_come_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env-key-123456789")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1/")
    provider, recorder = make(completion(), api_key=None)

    provider.request(ask())

    assert str(recorder.requests[0].url) == "http://127.0.0.1:8000/v1/chat/completions"
    assert recorder.requests[0].headers["authorization"] == "Bearer sk-env-key-123456789"


def test_settings_give_key_base_url_headers_and_dialect(monkeypatch) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    configured = {
        "api_key": "sk-from-settings-123456",
        "base_url": "http://127.0.0.1:1234/v1",
        "headers": {"X-Team": "blue"},
        "system_role": "developer",
    }
    with override_settings(AGENTLOOP={"PROVIDERS": {"local": configured}}):
        provider, recorder = make(completion(), api_key=None, name="local")
        provider.request(
            ModelRequest(model="m", messages=[Message(role="system", content="Be brief.")])
        )

    sent = recorder.requests[0]
    assert str(sent.url) == "http://127.0.0.1:1234/v1/chat/completions"
    assert sent.headers["authorization"] == "Bearer sk-from-settings-123456"
    assert sent.headers["x-team"] == "blue"
    assert recorder.bodies[0]["messages"] == [{"role": "developer", "content": "Be brief."}]


def test_a_missing_key_fails_at_request_time_naming_the_setting(monkeypatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    provider, recorder = make(completion(), api_key=None)  # constructing is fine

    with pytest.raises(ConfigurationError) as caught:
        provider.request(ask())

    assert "AGENTLOOP['PROVIDERS']['openai']['api_key']" in str(caught.value)
    assert "OPENAI_API_KEY" in str(caught.value)
    assert recorder.requests == []


def test_ollama_needs_no_key_and_sends_no_authorization(monkeypatch) -> None:
    monkeypatch.delenv("OLLAMA_API_KEY", raising=False)
    provider, recorder = make(completion(), provider_class=OllamaProvider, api_key=None)

    provider.request(ask())

    assert str(recorder.requests[0].url) == "http://localhost:11434/v1/chat/completions"
    assert "authorization" not in recorder.requests[0].headers


def test_openrouter_uses_its_own_url_and_key_variable(monkeypatch) -> None:
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or-v1-abcdefgh12345678")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # OpenAI's, not OpenRouter's
    provider, recorder = make(completion(), provider_class=OpenRouterProvider, api_key=None)

    provider.request(ask())

    assert str(recorder.requests[0].url) == "https://openrouter.ai/api/v1/chat/completions"
    assert recorder.requests[0].headers["authorization"] == "Bearer sk-or-v1-abcdefgh12345678"


@pytest.mark.parametrize(
    ("name", "provider_class"),
    [
        ("openai", OpenAIProvider),
        ("openrouter", OpenRouterProvider),
        ("ollama", OllamaProvider),
    ],
)
def test_builtin_names_resolve_to_these_classes(name, provider_class) -> None:
    providers.unregister(name)
    try:
        provider, model = providers.resolve(f"{name}:some-model")
        assert type(provider) is provider_class
        assert provider.name == name
        assert model == "some-model"
    finally:
        providers.unregister(name)


def test_the_provider_classes_are_reachable_from_the_providers_package() -> None:
    assert providers.OpenAIProvider is OpenAIProvider  # type: ignore[attr-defined]
    assert providers.OllamaProvider is OllamaProvider  # type: ignore[attr-defined]


def test_the_key_never_appears_in_the_repr() -> None:
    provider, _ = make()

    assert KEY not in repr(provider)
    assert "api.openai.com" in repr(provider)


# -- request mapping -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("provider_class", "options", "role"),
    [
        (OpenAIProvider, {}, "developer"),
        (OpenAIProvider, {"base_url": "http://127.0.0.1:8000/v1"}, "system"),
        (
            OpenAIProvider,
            {"base_url": "http://127.0.0.1:8000/v1", "system_role": "developer"},
            "developer",
        ),
        (OpenRouterProvider, {}, "developer"),
        (OllamaProvider, {}, "system"),
    ],
)
def test_system_messages_stay_in_place_with_the_servers_role(provider_class, options, role) -> None:
    provider, _ = make(provider_class=provider_class, **options)
    request = ModelRequest(
        model=MODEL,
        messages=[
            Message(role="system", content="Be brief."),
            Message(role="user", content="Hi"),
            Message(role="system", content="Now be formal."),
        ],
    )

    body = provider.build_body(request, stream=False)

    assert body["messages"] == [
        {"role": role, "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": role, "content": "Now be formal."},
    ]


def test_a_tool_round_maps_to_tool_calls_and_tool_messages() -> None:
    provider, _ = make()
    request = ModelRequest(
        model=MODEL,
        messages=[
            Message(role="user", content="Weather in Paris and Rome?"),
            Message(
                role="assistant",
                content="Let me check.",
                tool_calls=[
                    ToolCall(id="call_1", name="weather", arguments={"city": "Paris"}),
                    ToolCall(id="call_2", name="weather", arguments={"city": "Rome"}),
                ],
            ),
            Message(role="tool", content="21°C", tool_call_id="call_1", tool_name="weather"),
            Message(
                role="tool",
                content="Unknown city",
                tool_call_id="call_2",
                tool_name="weather",
                is_error=True,
            ),
        ],
    )

    body = provider.build_body(request, stream=False)

    assert body["messages"][1:] == [
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city":"Paris"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city":"Rome"}'},
                },
            ],
        },
        {"role": "tool", "content": "21°C", "tool_call_id": "call_1"},
        # Chat Completions has no error flag: the error result goes as its text.
        {"role": "tool", "content": "Unknown city", "tool_call_id": "call_2"},
    ]


def test_a_call_with_invalid_arguments_is_sent_back_with_empty_arguments() -> None:
    provider, _ = make()
    call = ToolCall(
        id="call_1", name="weather", arguments={}, provider_data={INVALID_ARGUMENTS: '{"city":'}
    )

    body = provider.build_body(an_invalid_call_answered(MODEL, call), stream=False)

    assert body["messages"][1]["tool_calls"][0]["function"]["arguments"] == "{}"


@pytest.mark.parametrize(
    ("provider_class", "sent"),
    [(OllamaProvider, True), (OpenAIProvider, False), (OpenRouterProvider, False)],
)
def test_thinking_text_goes_back_only_where_the_server_reads_it(provider_class, sent) -> None:
    provider, _ = make(provider_class=provider_class)
    thought = Message(role="assistant", content="4", provider_data={"reasoning": "2 and 2"})
    request = ModelRequest(model=MODEL, messages=[Message(role="user", content="2+2?"), thought])

    body = provider.build_body(request, stream=False)

    expected = {"role": "assistant", "content": "4"}
    if sent:
        expected["reasoning"] = "2 and 2"
    assert body["messages"][1] == expected


@pytest.mark.parametrize(
    ("choice", "parallel", "expected"),
    [
        ("auto", None, {"tool_choice": "auto"}),
        ("none", None, {"tool_choice": "none"}),
        ("required", False, {"tool_choice": "required", "parallel_tool_calls": False}),
        (
            "weather",
            None,
            {"tool_choice": {"type": "function", "function": {"name": "weather"}}},
        ),
        (None, False, {"parallel_tool_calls": False}),
        (None, None, {}),
    ],
)
def test_tool_choice_and_one_call_per_answer(choice, parallel, expected) -> None:
    provider, _ = make()

    body = provider.build_body(
        ask(tools=[WEATHER], tool_choice=choice, parallel_tool_calls=parallel), stream=False
    )

    assert {k: body[k] for k in ("tool_choice", "parallel_tool_calls") if k in body} == expected


def test_without_tools_no_tool_fields_are_sent() -> None:
    provider, _ = make()

    body = provider.build_body(ask(tool_choice="required", parallel_tool_calls=False), False)

    assert not {"tools", "tool_choice", "parallel_tool_calls"} & set(body)


def test_openai_tools_are_strict_when_every_argument_is_required() -> None:
    provider, _ = make()

    body = provider.build_body(ask(tools=[WEATHER]), stream=False)

    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "description": "Gets the weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                    "additionalProperties": False,
                },
                "strict": True,
            },
        }
    ]
    assert "additionalProperties" not in WEATHER.parameters  # a copy was changed


def test_a_tool_with_an_optional_argument_is_sent_as_is_without_strict() -> None:
    provider, _ = make()
    optional = ToolDefinition(
        name="search",
        parameters={
            "type": "object",
            "properties": {"q": {"type": "string"}, "limit": {"type": "integer", "default": 5}},
            "required": ["q"],
        },
    )

    body = provider.build_body(ask(tools=[optional]), stream=False)

    assert body["tools"] == [
        {"type": "function", "function": {"name": "search", "parameters": optional.parameters}}
    ]


def test_compatible_servers_get_tools_without_strict() -> None:
    provider, _ = make(provider_class=OllamaProvider)

    body = provider.build_body(ask(tools=[WEATHER]), stream=False)

    assert body["tools"][0]["function"] == {
        "name": "weather",
        "description": "Gets the weather",
        "parameters": WEATHER.parameters,
    }


def test_structured_output_asks_for_a_strict_json_schema_on_a_copy() -> None:
    provider, _ = make()
    schema = {
        "title": "Person",
        "type": "object",
        "properties": {
            "name": {"type": "string", "title": "Name"},
            "nickname": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
            "address": {"$ref": "#/$defs/Address", "description": "Where"},
        },
        "required": ["name"],
        "$defs": {
            "Address": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    original = copy.deepcopy(schema)

    body = provider.build_body(ask(output_schema=schema), stream=False)

    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {
            "name": "Person",
            "strict": True,
            "schema": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "nickname": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                    "address": {"anyOf": [{"$ref": "#/$defs/Address"}], "description": "Where"},
                },
                "required": ["name", "nickname", "address"],
                "additionalProperties": False,
                "$defs": {
                    "Address": {
                        "type": "object",
                        "properties": {"city": {"type": "string"}},
                        "required": ["city"],
                        "additionalProperties": False,
                    }
                },
            },
        },
    }
    assert schema == original


def test_a_schema_without_a_title_is_named_response() -> None:
    provider, _ = make()
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}

    body = provider.build_body(ask(output_schema=schema), stream=False)

    assert body["response_format"]["json_schema"]["name"] == "response"


def test_strict_json_schema_refuses_what_strictness_would_change() -> None:
    assert (
        strict_json_schema({"type": "object", "properties": {"a": {"type": "string"}}}, force=False)
        is None
    )
    assert (
        strict_json_schema(
            {"type": "object", "properties": {}, "additionalProperties": True}, force=False
        )
        is None
    )
    assert (
        strict_json_schema(
            {
                "type": "object",
                "properties": {"a": {"type": "string", "minLength": 2}},
                "required": ["a"],
            },
            force=False,
        )
        is None
    )


@pytest.mark.parametrize(
    ("provider_class", "options", "field"),
    [
        (OpenAIProvider, {}, "max_completion_tokens"),
        (OpenAIProvider, {"base_url": "http://127.0.0.1:8000/v1"}, "max_tokens"),
        (OpenRouterProvider, {}, "max_tokens"),
        (OllamaProvider, {}, "max_tokens"),
        (OllamaProvider, {"max_tokens_field": "max_completion_tokens"}, "max_completion_tokens"),
    ],
)
def test_the_output_token_cap_uses_the_servers_field(provider_class, options, field) -> None:
    provider, _ = make(provider_class=provider_class, **options)

    body = provider.build_body(ask(max_output_tokens=300, temperature=0.2), stream=False)

    assert body[field] == 300
    assert {"max_tokens", "max_completion_tokens"} & set(body) == {field}
    assert body["temperature"] == 0.2


def test_streaming_asks_for_usage_in_the_last_chunk() -> None:
    provider, _ = make()

    assert provider.build_body(ask(), stream=True)["stream_options"] == {"include_usage": True}
    assert provider.build_body(ask(), stream=False)["stream"] is False
    assert "stream_options" not in provider.build_body(ask(), stream=False)


def test_provider_options_deep_merge_into_the_body_and_win() -> None:
    provider, recorder = make(completion())
    options = {
        "temperature": 1.0,
        "stream_options": {"include_obfuscation": False},
        "reasoning_effort": "low",
    }

    provider.request(ask(temperature=0.1, provider_options=options), on_chunk=None)

    body = recorder.bodies[0]
    assert body["temperature"] == 1.0
    assert body["reasoning_effort"] == "low"
    assert body["stream_options"] == {"include_obfuscation": False}


def test_request_headers_are_sent() -> None:
    provider, recorder = make(completion())

    provider.request(ask(headers={"HTTP-Referer": "https://example.com"}))

    assert recorder.requests[0].headers["http-referer"] == "https://example.com"


# -- answers -----------------------------------------------------------------------------------
def test_an_answer_parses_into_text_usage_and_finish_reason() -> None:
    provider, _ = make(
        completion(
            "Hello!",
            prompt_tokens_details={"cached_tokens": 4},
            completion_tokens_details={"reasoning_tokens": 2},
        )
    )

    response = provider.request(ask())

    assert response.content == "Hello!"
    assert response.finish_reason == "stop"
    assert response.model == "gpt-4.1-mini-2025-04-14"
    assert response.usage == TokenUsage(
        input_tokens=10, output_tokens=5, cached_tokens=4, reasoning_tokens=2
    )
    assert response.parsed is None
    assert response.provider_data == {"id": "chatcmpl-1"}


def test_tool_calls_parse_with_ids_names_and_arguments() -> None:
    provider, _ = make(
        completion(
            None,
            finish="tool_calls",
            tool_calls=[
                function_call("call_a", "weather", '{"city": "Paris"}'),
                function_call("call_b", "weather", '{"city": "Rome"}', index=1),
            ],
        )
    )

    response = provider.request(ask(tools=[WEATHER]))

    assert response.content == ""
    assert response.finish_reason == "tool_calls"
    assert [(c.id, c.name, c.arguments) for c in response.tool_calls] == [
        ("call_a", "weather", {"city": "Paris"}),
        ("call_b", "weather", {"city": "Rome"}),
    ]


def test_invalid_argument_json_is_kept_for_the_error_result() -> None:
    provider, _ = make(
        completion(None, tool_calls=[function_call("call_a", "weather", '{"city": "Par')])
    )

    response = provider.request(ask(tools=[WEATHER]))

    call = response.tool_calls[0]
    assert call.arguments == {}
    assert call.provider_data[INVALID_ARGUMENTS] == '{"city": "Par'


def test_structured_output_is_parsed_into_the_response() -> None:
    provider, _ = make(completion('{"name": "Bob", "age": 30}'))
    schema = {"type": "object", "properties": {"name": {"type": "string"}}}

    response = provider.request(ask(output_schema=schema))

    assert response.parsed == {"name": "Bob", "age": 30}


def test_a_refusal_becomes_the_text_and_is_marked() -> None:
    refused = completion(None)
    data = json.loads(refused.content)
    data["choices"][0]["message"]["refusal"] = "I can't help with that."
    provider, _ = make(httpx.Response(200, json=data))

    response = provider.request(ask(output_schema={"type": "object", "properties": {}}))

    assert response.content == "I can't help with that."
    assert response.provider_data["refusal"] == "I can't help with that."
    assert response.parsed is None


def test_thinking_text_is_kept_in_provider_data() -> None:
    answered = completion("4")
    data = json.loads(answered.content)
    data["choices"][0]["message"]["reasoning_content"] = "2 and 2 make 4"
    provider, _ = make(httpx.Response(200, json=data), provider_class=OllamaProvider)

    response = provider.request(ask())

    assert response.provider_data["reasoning"] == "2 and 2 make 4"


# -- streams -----------------------------------------------------------------------------------
def test_a_stream_yields_text_and_tool_call_deltas_and_reassembles_them() -> None:
    provider, recorder = make(
        sse(
            chunk({"role": "assistant", "content": "Checking"}),
            chunk({"content": " now."}),
            chunk({"tool_calls": [function_call("call_a", "weather", "")]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": ' "Paris"}'}}]}),
            chunk({"tool_calls": [function_call("call_b", "weather", '{"city": "Rome"}', 1)]}),
            chunk({}, finish="tool_calls"),
            chunk(usage={"prompt_tokens": 20, "completion_tokens": 9}),
            "[DONE]",
        )
    )
    chunks: list[Any] = []

    response = provider.request(ask(tools=[WEATHER]), on_chunk=chunks.append)

    assert recorder.bodies[0]["stream"] is True
    assert [c.text for c in chunks if isinstance(c, TextDelta)] == ["Checking", " now."]
    assert [
        (c.index, c.id, c.name, c.arguments) for c in chunks if isinstance(c, ToolCallDelta)
    ] == [
        (0, "call_a", "weather", ""),
        (0, None, None, '{"city":'),
        (0, None, None, ' "Paris"}'),
        (1, "call_b", "weather", '{"city": "Rome"}'),
    ]
    assert response.content == "Checking now."
    assert [(c.id, c.name, c.arguments) for c in response.tool_calls] == [
        ("call_a", "weather", {"city": "Paris"}),
        ("call_b", "weather", {"city": "Rome"}),
    ]
    assert response.finish_reason == "tool_calls"
    assert response.usage == TokenUsage(input_tokens=20, output_tokens=9)


def test_streamed_calls_without_an_index_are_told_apart_by_id() -> None:
    provider, _ = make(
        sse(
            chunk(
                {"tool_calls": [{"id": "a", "function": {"name": "weather", "arguments": "{}"}}]}
            ),
            chunk(
                {"tool_calls": [{"id": "b", "function": {"name": "weather", "arguments": "{}"}}]}
            ),
            chunk({}, finish="tool_calls"),
            "[DONE]",
        )
    )

    response = provider.request(ask(tools=[WEATHER]), on_chunk=lambda chunk: None)

    assert [call.id for call in response.tool_calls] == ["a", "b"]


def test_invalid_streamed_arguments_are_kept_for_the_error_result() -> None:
    provider, _ = make(
        sse(
            chunk({"tool_calls": [function_call("call_a", "weather", '{"city": ')]}),
            chunk({}, finish="tool_calls"),
            "[DONE]",
        )
    )

    response = provider.request(ask(tools=[WEATHER]), on_chunk=lambda chunk: None)

    assert response.tool_calls[0].provider_data[INVALID_ARGUMENTS] == '{"city": '


def test_streamed_thinking_is_collected_and_streamed_apart_from_text() -> None:
    provider, _ = make(
        sse(
            chunk({"content": "", "reasoning": "Two and"}),
            chunk({"content": "", "reasoning": " two."}),
            chunk({"content": "4"}, finish="stop"),
            "[DONE]",
        ),
        provider_class=OllamaProvider,
    )
    chunks: list[Any] = []

    response = provider.request(ask(), on_chunk=chunks.append)

    assert chunks == [
        ThinkingDelta(text="Two and"),
        ThinkingDelta(text=" two."),
        TextDelta(text="4"),
    ]
    assert [c.text for c in chunks if isinstance(c, TextDelta)] == ["4"]
    assert response.thinking == response.provider_data["reasoning"] == "Two and two."


def test_an_exception_from_on_chunk_stops_the_stream() -> None:
    provider, _ = make(
        sse(chunk({"content": "one"}), chunk({"content": "two"}), chunk({}, "stop"), "[DONE]")
    )
    seen: list[Any] = []

    with pytest.raises(CancelledError):
        provider.request(ask(), on_chunk=cancelling(seen))

    assert seen == [TextDelta(text="one")]


def test_a_stream_cut_before_done_is_interrupted() -> None:
    provider, _ = make(sse(chunk({"content": "Hel"}), chunk({"content": "lo"})))
    chunks: list[Any] = []

    with pytest.raises(StreamInterruptedError) as caught:
        provider.request(ask(), on_chunk=chunks.append)

    assert caught.value.retryable
    assert [c.text for c in chunks] == ["Hel", "lo"]


def test_malformed_stream_data_is_an_invalid_response() -> None:
    provider, _ = make(sse(chunk({"content": "Hi"}), '{"choices": [', "[DONE]"))

    with pytest.raises(InvalidResponseError):
        provider.request(ask(), on_chunk=lambda chunk: None)


@pytest.mark.parametrize(
    ("error", "error_type"),
    [
        ({"message": "Rate limit reached", "code": 429}, RateLimitError),
        ({"message": "Provider overloaded", "code": 502}, ServerError),
        ({"message": "The server had an error", "type": "server_error"}, ServerError),
        ({"message": "too long", "code": "context_length_exceeded"}, ContextLengthError),
    ],
)
def test_an_error_in_a_stream_maps_to_the_taxonomy(error, error_type) -> None:
    provider, _ = make(sse(chunk({"content": "Hi"}), json.dumps({"error": error})))

    with pytest.raises(error_type):
        provider.request(ask(), on_chunk=lambda chunk: None)


# -- errors ------------------------------------------------------------------------------------
def test_429_is_a_rate_limit_error_with_retry_after() -> None:
    provider, _ = make(
        error(429, "Rate limit reached", "rate_limit_exceeded", **{"Retry-After": "7"})
    )

    with pytest.raises(RateLimitError) as caught:
        provider.request(ask())

    assert caught.value.retry_after == 7.0
    assert caught.value.status == 429
    assert caught.value.retryable


@pytest.mark.parametrize(
    ("status", "message", "code", "error_type"),
    [
        (401, "Incorrect API key provided", "invalid_api_key", AuthenticationError),
        (403, "Project does not have access", None, AuthenticationError),
        (500, "The server had an error", None, ServerError),
        (503, "Overloaded", None, ServerError),
        (
            400,
            "This model's maximum context length is 128000 tokens.",
            "context_length_exceeded",
            ContextLengthError,
        ),
        (400, "Invalid value for 'temperature'", "invalid_value", BadRequestError),
        (404, "The model `gpt-9` does not exist", "model_not_found", BadRequestError),
    ],
)
def test_error_statuses_map_to_the_taxonomy(status, message, code, error_type) -> None:
    provider, _ = make(error(status, message, code))

    with pytest.raises(error_type) as caught:
        provider.request(ask())

    assert caught.value.status == status
    assert message in str(caught.value)


def test_an_error_status_on_a_stream_request_maps_too() -> None:
    provider, _ = make(error(401, "Incorrect API key provided", "invalid_api_key"))

    with pytest.raises(AuthenticationError):
        provider.request(ask(), on_chunk=lambda chunk: None)


def test_an_error_object_with_status_200_is_an_error() -> None:
    body = {"error": {"message": "Upstream rate limited", "code": 429}}
    provider, _ = make(httpx.Response(200, json=body))

    with pytest.raises(RateLimitError):
        provider.request(ask())


def test_malformed_json_is_an_invalid_response() -> None:
    provider, _ = make(httpx.Response(200, text="<html>Bad gateway</html>"))

    with pytest.raises(InvalidResponseError):
        provider.request(ask())


def test_an_answer_without_choices_is_an_invalid_response() -> None:
    provider, _ = make(httpx.Response(200, json={"id": "x", "choices": []}))

    with pytest.raises(InvalidResponseError):
        provider.request(ask())


def test_a_read_timeout_is_a_provider_timeout() -> None:
    provider, _ = make(read_timeout)

    with pytest.raises(ProviderTimeout) as caught:
        provider.request(ask())

    assert caught.value.retryable


def test_the_key_never_appears_in_errors() -> None:
    echoed = {"error": {"message": f"Incorrect API key provided: {KEY}", "code": "invalid_api_key"}}
    provider, _ = make(httpx.Response(401, json=echoed))

    with pytest.raises(AuthenticationError) as caught:
        provider.request(ask())

    assert KEY not in shown(caught.value)
    assert "[redacted]" in shown(caught.value)


def test_the_key_never_appears_in_an_in_stream_error() -> None:
    provider, _ = make(sse(json.dumps({"error": {"message": f"bad key {KEY}", "code": 401}})))

    with pytest.raises(AuthenticationError) as caught:
        provider.request(ask(), on_chunk=lambda chunk: None)

    assert KEY not in shown(caught.value)


# -- end to end: persisted chats over recorded wire data ---------------------------------------
def as_recorded(body: dict[str, Any]) -> dict[str, Any]:
    """A recorded body less what we deliberately send differently (see the replay test)."""
    body = copy.deepcopy(body)
    for tool in body.get("tools", []):
        tool["function"]["parameters"].pop("strict", None)
    for message in body["messages"]:
        message.pop("reasoning_content", None)
    return body


def as_sent(body: dict[str, Any]) -> dict[str, Any]:
    body = copy.deepcopy(body)
    for tool in body.get("tools", []):
        tool["function"].pop("strict", None)
    return body


@pytest.mark.django_db
def test_a_persisted_chat_runs_two_tool_rounds_over_recorded_openrouter_traffic(
    replaying, user
) -> None:
    cassette = replaying(
        "chat_function_calling_openrouter_claude-haiku-4-5_can_use_tools_in_multi-turn_conversations",
        OpenRouterProvider,
    )
    chat = weather_chat("openrouter:anthropic/claude-haiku-4.5", user)

    answers = ask_both(chat)

    rows = assert_claude_answered_both(
        chat,
        answers,
        ("toolu_bdrk_01Xvsi91KkVGwV6RFPx7YrSh", "toolu_bdrk_01RmihE7z579kRPYYnJPwM6h"),
    )
    assert rows[1].finish_reason == "tool_calls"
    assert [
        (u.provider, u.status, u.input_tokens, u.output_tokens)
        for u in Usage.objects.order_by("id")
    ] == [
        ("openrouter", "succeeded", 633, 75),
        ("openrouter", "succeeded", 748, 42),
        ("openrouter", "succeeded", 812, 75),
        ("openrouter", "succeeded", 927, 58),
    ]
    # What the chat sent is what RubyLLM sent for the same conversation.
    assert [as_sent(body) for body in cassette.sent_bodies()] == [
        as_recorded(i.request_body) for i in cassette.interactions
    ]


@pytest.mark.django_db
def test_a_persisted_chat_streams_two_tool_rounds_over_recorded_ollama_traffic(
    replaying, user, monkeypatch
) -> None:
    monkeypatch.delenv("OLLAMA_API_KEY", raising=False)
    cassette = replaying(
        "chat_function_calling_ollama_qwen3_can_use_tools_with_multi-turn_streaming_conversations",
        OllamaProvider,
        api_key=None,  # a local server needs no key
    )
    chat = weather_chat("ollama:qwen3", user).with_provider_options(enable_thinking=False)

    answers = stream_both(chat)

    assert_each_answer_was_streamed(answers)
    rows = assert_two_complete_rounds(chat)
    assert [c.call_id for m in rows for c in m.tool_calls.all()] == [
        "call_blqyt530",
        "call_velv45o4",
    ]
    # The thinking of each answer is kept on its row and sent back on the next request.
    assert rows[1].provider_data["reasoning"].startswith("Okay, the user is asking")
    assert [u.input_tokens for u in Usage.objects.order_by("id")] == [195, 377, 352, 546]
    assert [as_sent(body) for body in cassette.sent_bodies()] == [
        as_recorded(i.request_body) for i in cassette.interactions
    ]


# -- the documentation page --------------------------------------------------------------------
DOC = Path(__file__).resolve().parents[2] / "docs" / "providers" / "openai-compatible.md"


@pytest.mark.django_db(transaction=True)
def test_the_documentation_examples_run(example_module) -> None:
    blocks = runnable(DOC)
    assert blocks
    for block in blocks:
        source = "\n" * (block.line - 1) + block.code
        exec(compile(source, str(DOC), "exec"), example_module.__dict__)  # noqa: S102

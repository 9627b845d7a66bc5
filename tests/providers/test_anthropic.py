"""AnthropicProvider on the project's own small fixtures: configuration, request mapping,
errors, streams, thinking round trips, and persisted chats over recorded wire data."""

from __future__ import annotations

import copy
import json
from functools import partial
from typing import Any

import httpx
import pytest
from django.test import override_settings

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
    ToolCall,
    ToolCallDelta,
    ToolDefinition,
)
from agentloop.models import Usage
from agentloop.providers.anthropic import AnthropicProvider, default_max_tokens
from agentloop.providers.common import INVALID_ARGUMENTS
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
    an_empty_answer_between_questions,
    an_invalid_call_answered,
    answering,
    as_message,
    cancelling,
    event_stream,
    read_timeout,
    registered,
    resolved,
    shown,
    system_messages_around_a_question,
    two_results_then_a_question,
)

MODEL = "claude-haiku-4-5-20251001"
KEY = "sk-ant-api03-secretsecretsecret"


# -- helpers -------------------------------------------------------------------------------
def make(*responses: Any, **options: Any) -> tuple[AnthropicProvider, Recorder]:
    options.setdefault("api_key", KEY)
    return answering(AnthropicProvider, *responses, **options)


def answer(*content: dict[str, Any], stop: str = "end_turn", **usage: int) -> httpx.Response:
    return httpx.Response(
        200,
        json={
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": MODEL,
            "content": list(content),
            "stop_reason": stop,
            "usage": {"input_tokens": 10, "output_tokens": 5, **usage},
        },
    )


def sse(*events: dict[str, Any]) -> httpx.Response:
    return event_stream("".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events))


def start(input_tokens: int = 10) -> dict[str, Any]:
    message = {
        "id": "msg_s",
        "model": MODEL,
        "content": [],
        "usage": {"input_tokens": input_tokens, "output_tokens": 1},
    }
    return {"type": "message_start", "message": message}


def block(index: int, content_block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": content_block}


def delta(index: int, **delta: Any) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": delta}


def end(stop: str = "end_turn", output_tokens: int = 7) -> list[dict[str, Any]]:
    return [
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop},
            "usage": {"output_tokens": output_tokens},
        },
        {"type": "message_stop"},
    ]


ask = partial(user_request, MODEL)  # one user message to this file's model


def error(status: int, error_type: str, message: str, **headers: str) -> httpx.Response:
    body = {"type": "error", "error": {"type": error_type, "message": message}}
    return httpx.Response(status, json=body, headers=headers)


WEATHER = ToolDefinition(
    name="weather",
    description="Gets the weather",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)


# -- configuration -------------------------------------------------------------------------
def test_requests_carry_the_key_header_and_api_version() -> None:
    provider, recorder = make(answer({"type": "text", "text": "Hello"}))

    provider.request(ask())

    sent = recorder.requests[0]
    assert sent.url == "https://api.anthropic.com/v1/messages"
    assert sent.headers["x-api-key"] == KEY
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in sent.headers


def test_the_key_comes_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-from-env-123456")
    provider, recorder = make(answer({"type": "text", "text": "Hi"}), api_key=None)

    provider.request(ask())

    assert recorder.requests[0].headers["x-api-key"] == "sk-ant-from-env-123456"


def test_settings_give_key_base_url_and_default_max_tokens() -> None:
    configured = {
        "api_key": "sk-ant-settings-1234567",
        "base_url": "https://proxy.test/",
        "max_tokens": 1000,
    }
    with override_settings(AGENTLOOP={"PROVIDERS": {"anthropic": configured}}):
        provider, recorder = make(answer({"type": "text", "text": "Hi"}), api_key=None)
        provider.request(ask())

    assert str(recorder.requests[0].url) == "https://proxy.test/v1/messages"
    assert recorder.requests[0].headers["x-api-key"] == "sk-ant-settings-1234567"
    assert recorder.bodies[0]["max_tokens"] == 1000


def test_a_missing_key_fails_at_request_time_naming_the_setting(monkeypatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    provider, recorder = make(api_key=None)  # constructing it is fine

    with pytest.raises(ConfigurationError, match="ANTHROPIC_API_KEY") as caught:
        provider.request(ask())

    assert "AGENTLOOP['PROVIDERS']['anthropic']['api_key']" in str(caught.value)
    assert recorder.requests == []


def test_the_builtin_name_and_claude_ids_resolve_to_this_provider() -> None:
    provider, model = resolved(MODEL)

    assert isinstance(provider, AnthropicProvider)
    assert (provider.name, model) == ("anthropic", MODEL)


def test_the_key_never_appears_in_the_repr() -> None:
    provider, _ = make()

    assert KEY not in repr(provider)


# -- max_tokens ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("claude-haiku-4-5-20251001", 64000),
        ("claude-sonnet-4-5", 64000),
        ("claude-opus-4-1-20250805", 32000),
        ("claude-opus-4-5-20251101", 64000),
        ("claude-3-5-haiku-latest", 8192),
        ("claude-3-haiku-20240307", 4096),
        ("some-proxy-model", 8192),
    ],
)
def test_max_tokens_defaults_to_the_models_maximum_output(model: str, expected: int) -> None:
    assert default_max_tokens(model) == expected


def test_max_output_tokens_of_the_request_wins() -> None:
    provider, _ = make(max_tokens=2000)

    body = provider.build_body(ask(max_output_tokens=300), stream=False)

    assert body["max_tokens"] == 300


def test_the_constructor_max_tokens_beats_the_model_default() -> None:
    provider, _ = make(max_tokens=2000)

    assert provider.build_body(ask(), stream=False)["max_tokens"] == 2000


# -- request mapping -----------------------------------------------------------------------
def test_system_messages_anywhere_become_system_blocks_in_order() -> None:
    provider, _ = make()

    body = provider.build_body(system_messages_around_a_question(MODEL), stream=False)

    assert body["system"] == [
        {"type": "text", "text": "Be brief."},
        {"type": "text", "text": "Answer in French."},
    ]
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]


def test_tool_results_share_one_user_turn_with_error_flags_and_following_text() -> None:
    provider, _ = make()
    request = two_results_then_a_question(MODEL, ("toolu_1", "toolu_2"), [WEATHER])

    messages = provider.build_body(request, stream=False)["messages"]

    assert messages[1] == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "toolu_2", "name": "weather", "input": {"city": "Rome"}},
        ],
    }
    assert messages[2:] == [
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "sunny"}],
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": [{"type": "text", "text": "boom"}],
                    "is_error": True,
                },
                {"type": "text", "text": "And tomorrow?"},
            ],
        }
    ]


def test_an_empty_assistant_answer_is_left_out() -> None:
    provider, _ = make()

    messages = provider.build_body(an_empty_answer_between_questions(MODEL), stream=False)[
        "messages"
    ]

    assert messages == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "Hello?"}],
        },
    ]


def test_a_call_with_invalid_arguments_is_sent_back_with_empty_input() -> None:
    provider, _ = make()
    call = ToolCall(id="toolu_1", name="weather", provider_data={INVALID_ARGUMENTS: "{oops"})

    messages = provider.build_body(an_invalid_call_answered(MODEL, call), stream=False)["messages"]

    assert messages[1]["content"] == [
        {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}}
    ]


@pytest.mark.parametrize(
    ("choice", "parallel", "expected"),
    [
        (None, None, None),
        ("auto", None, {"type": "auto"}),
        ("none", None, {"type": "none"}),
        ("required", None, {"type": "any"}),
        ("weather", None, {"type": "tool", "name": "weather"}),
        (None, False, {"type": "auto", "disable_parallel_tool_use": True}),
        ("required", False, {"type": "any", "disable_parallel_tool_use": True}),
        ("none", False, {"type": "none"}),
    ],
)
def test_tool_choice_and_one_call_per_answer(choice, parallel, expected) -> None:
    provider, _ = make()

    body = provider.build_body(
        ask(tools=[WEATHER], tool_choice=choice, parallel_tool_calls=parallel), stream=False
    )

    assert body.get("tool_choice") == expected


def test_tools_are_not_strict_by_default() -> None:
    provider, _ = make()

    (tool,) = provider.build_body(ask(tools=[WEATHER]), stream=False)["tools"]

    assert tool == {
        "name": "weather",
        "description": "Gets the weather",
        "input_schema": WEATHER.parameters,
    }


def test_strict_tools_close_object_schemas_on_a_copy() -> None:
    provider, _ = make(strict_tools=True)
    original = copy.deepcopy(WEATHER.parameters)

    (tool,) = provider.build_body(ask(tools=[WEATHER]), stream=False)["tools"]

    assert tool["strict"] is True
    assert tool["input_schema"] == {**original, "additionalProperties": False}
    assert WEATHER.parameters == original


def test_structured_output_uses_output_config_with_closed_objects() -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "object", "properties": {"name": {"type": "string"}}}},
        "required": ["city"],
    }
    original = copy.deepcopy(schema)
    provider, _ = make()

    body = provider.build_body(ask(output_schema=schema), stream=False)

    sent = body["output_config"]["format"]
    assert sent["type"] == "json_schema"
    assert sent["schema"]["additionalProperties"] is False
    assert sent["schema"]["properties"]["city"]["additionalProperties"] is False
    assert schema == original


def test_structured_output_is_parsed_into_the_response() -> None:
    provider, _ = make(answer({"type": "text", "text": '{"name": "Ada", "age": 36}'}))

    response = provider.request(ask(output_schema={"type": "object", "properties": {}}))

    assert response.parsed == {"name": "Ada", "age": 36}


def test_provider_options_deep_merge_into_the_body_and_win() -> None:
    provider, _ = make()
    request = ask(
        output_schema={"type": "object", "properties": {}},
        temperature=0.2,
        provider_options={
            "output_config": {"effort": "low"},
            "temperature": 1.0,
            "thinking": {"type": "enabled", "budget_tokens": 2048},
        },
    )

    body = provider.build_body(request, stream=False)

    assert body["output_config"]["effort"] == "low"
    assert body["output_config"]["format"]["type"] == "json_schema"
    assert body["temperature"] == 1.0
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 2048}


def test_request_headers_are_sent() -> None:
    provider, recorder = make(answer({"type": "text", "text": "Hi"}))

    provider.request(ask(headers={"anthropic-beta": "context-1m-2025-08-07"}))

    assert recorder.requests[0].headers["anthropic-beta"] == "context-1m-2025-08-07"


# -- responses -----------------------------------------------------------------------------
def test_cache_reads_and_writes_count_as_input_and_reads_as_cached() -> None:
    provider, _ = make(
        answer(
            {"type": "text", "text": "Hi"},
            input_tokens=20,
            cache_read_input_tokens=1000,
            cache_creation_input_tokens=300,
        )
    )

    usage = provider.request(ask()).usage

    assert (usage.input_tokens, usage.cached_tokens, usage.output_tokens) == (1320, 1000, 5)


def test_max_tokens_stop_reason_becomes_length_and_is_kept_raw() -> None:
    provider, _ = make(answer({"type": "text", "text": "Once upon"}, stop="max_tokens"))

    response = provider.request(ask())

    assert response.finish_reason == "length"
    assert response.provider_data["stop_reason"] == "max_tokens"


def test_thinking_blocks_round_trip_in_order_with_signatures() -> None:
    thinking = {"type": "thinking", "thinking": "Paris first.", "signature": "sig-1"}
    redacted = {"type": "redacted_thinking", "data": "opaque=="}
    provider, recorder = make(
        answer(
            thinking,
            redacted,
            {"type": "text", "text": "Let me check."},
            {
                "type": "tool_use",
                "id": "toolu_1",
                "name": "weather",
                "input": {"city": "Paris"},
                "caller": {"type": "direct"},
            },
            stop="tool_use",
        ),
        answer({"type": "text", "text": "Sunny."}),
    )
    first = provider.request(ask("Weather in Paris?", tools=[WEATHER]))
    assistant = as_message(first)
    result = Message(role="tool", tool_call_id="toolu_1", tool_name="weather", content="sunny")

    provider.request(
        ModelRequest(
            model=MODEL,
            messages=[Message(role="user", content="Weather in Paris?"), assistant, result],
            tools=[WEATHER],
        )
    )

    assert first.content == "Let me check."
    assert recorder.bodies[1]["messages"][1]["content"] == [
        thinking,
        redacted,
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
    ]


def test_streamed_thinking_is_reassembled_with_its_signature_and_streamed_apart() -> None:
    provider, _ = make(
        sse(
            start(),
            block(0, {"type": "thinking", "thinking": "", "signature": ""}),
            delta(0, type="thinking_delta", thinking="Let me "),
            delta(0, type="thinking_delta", thinking="think."),
            delta(0, type="signature_delta", signature="sig-9"),
            {"type": "content_block_stop", "index": 0},
            block(1, {"type": "text", "text": ""}),
            delta(1, type="text_delta", text="Done."),
            *end(),
        )
    )
    chunks: list[Any] = []

    response = provider.request(ask(), on_chunk=chunks.append)

    assert response.provider_data["anthropic_content"] == [
        {"type": "thinking", "thinking": "Let me think.", "signature": "sig-9"},
        {"type": "text", "text": "Done."},
    ]
    assert response.thinking == "Let me think."
    assert chunks == [
        ThinkingDelta(text="Let me "),
        ThinkingDelta(text="think."),
        TextDelta(text="Done."),
    ]


def test_a_stream_yields_text_and_tool_call_deltas_and_reassembles_them() -> None:
    provider, _ = make(
        sse(
            start(input_tokens=12),
            block(0, {"type": "text", "text": ""}),
            {"type": "ping"},
            delta(0, type="text_delta", text="Checking "),
            delta(0, type="text_delta", text="both."),
            block(1, {"type": "tool_use", "id": "toolu_a", "name": "weather", "input": {}}),
            delta(1, type="input_json_delta", partial_json='{"city": '),
            delta(1, type="input_json_delta", partial_json='"Paris"}'),
            block(2, {"type": "tool_use", "id": "toolu_b", "name": "weather", "input": {}}),
            delta(2, type="input_json_delta", partial_json='{"city": "Rome"}'),
            *end(stop="tool_use", output_tokens=40),
        )
    )
    chunks: list[Any] = []

    response = provider.request(ask(tools=[WEATHER]), on_chunk=chunks.append)

    assert chunks == [
        TextDelta(text="Checking "),
        TextDelta(text="both."),
        ToolCallDelta(index=0, id="toolu_a", name="weather"),
        ToolCallDelta(index=0, arguments='{"city": '),
        ToolCallDelta(index=0, arguments='"Paris"}'),
        ToolCallDelta(index=1, id="toolu_b", name="weather"),
        ToolCallDelta(index=1, arguments='{"city": "Rome"}'),
    ]
    assert response.content == "Checking both."
    assert [(c.id, c.arguments) for c in response.tool_calls] == [
        ("toolu_a", {"city": "Paris"}),
        ("toolu_b", {"city": "Rome"}),
    ]
    assert (response.usage.input_tokens, response.usage.output_tokens) == (12, 40)
    assert response.finish_reason == "tool_calls"


def test_invalid_streamed_arguments_are_kept_for_the_error_result() -> None:
    provider, _ = make(
        sse(
            start(),
            block(0, {"type": "tool_use", "id": "toolu_x", "name": "weather", "input": {}}),
            delta(0, type="input_json_delta", partial_json='{"city": "Par'),
            *end(stop="tool_use"),
        )
    )

    (call,) = provider.request(ask(tools=[WEATHER]), on_chunk=lambda chunk: None).tool_calls

    assert call.arguments == {}
    assert call.provider_data == {INVALID_ARGUMENTS: '{"city": "Par'}


def test_an_exception_from_on_chunk_stops_the_stream() -> None:
    provider, _ = make(
        sse(
            start(),
            block(0, {"type": "text", "text": ""}),
            delta(0, type="text_delta", text="a"),
            delta(0, type="text_delta", text="b"),
            *end(),
        )
    )
    seen: list[Any] = []

    with pytest.raises(CancelledError):
        provider.request(ask(), on_chunk=cancelling(seen))

    assert seen == [TextDelta(text="a")]


# -- errors --------------------------------------------------------------------------------
def test_429_is_a_rate_limit_error_with_retry_after() -> None:
    provider, _ = make(error(429, "rate_limit_error", "Slow down", **{"retry-after": "7"}))

    with pytest.raises(RateLimitError) as caught:
        provider.request(ask())

    assert (caught.value.status, caught.value.retry_after) == (429, 7.0)


@pytest.mark.parametrize(
    ("status", "error_type", "message", "kind"),
    [
        (500, "api_error", "Internal server error", ServerError),
        (529, "overloaded_error", "Overloaded", ServerError),
        (401, "authentication_error", "invalid x-api-key", AuthenticationError),
        (403, "permission_error", "Not allowed", AuthenticationError),
        (
            400,
            "invalid_request_error",
            "prompt is too long: 250000 tokens > 200000 maximum",
            ContextLengthError,
        ),
        (400, "invalid_request_error", "max_tokens: must be at most 64000", BadRequestError),
    ],
)
def test_error_statuses_map_to_the_taxonomy(status, error_type, message, kind) -> None:
    provider, _ = make(error(status, error_type, message))

    with pytest.raises(kind) as caught:
        provider.request(ask())

    assert caught.value.status == status
    assert message in str(caught.value)


def test_errors_in_a_stream_response_status_map_too() -> None:
    provider, _ = make(error(529, "overloaded_error", "Overloaded"))

    with pytest.raises(ServerError):
        provider.request(ask(), on_chunk=lambda chunk: None)


def test_an_error_event_mid_stream_is_a_server_error_when_overloaded() -> None:
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    provider, _ = make(
        sse(
            start(),
            block(0, {"type": "text", "text": ""}),
            delta(0, type="text_delta", text="Hi"),
            overloaded,
        )
    )

    with pytest.raises(ServerError, match="Overloaded") as caught:
        provider.request(ask(), on_chunk=lambda chunk: None)

    assert caught.value.status == 529
    assert caught.value.retryable


def test_a_stream_cut_before_message_stop_is_interrupted() -> None:
    provider, _ = make(
        sse(
            start(), block(0, {"type": "text", "text": ""}), delta(0, type="text_delta", text="Hal")
        )
    )

    with pytest.raises(StreamInterruptedError):
        provider.request(ask(), on_chunk=lambda chunk: None)


def test_malformed_json_is_an_invalid_response() -> None:
    provider, _ = make(httpx.Response(200, text="{not json"))

    with pytest.raises(InvalidResponseError):
        provider.request(ask())


def test_a_json_answer_without_content_is_an_invalid_response() -> None:
    provider, _ = make(httpx.Response(200, json={"type": "message", "usage": {}}))

    with pytest.raises(InvalidResponseError):
        provider.request(ask())


def test_malformed_stream_data_is_an_invalid_response() -> None:
    provider, _ = make(event_stream("event: message_start\ndata: {oops\n\n"))

    with pytest.raises(InvalidResponseError):
        provider.request(ask(), on_chunk=lambda chunk: None)


def test_a_read_timeout_is_a_provider_timeout() -> None:
    provider, _ = make(read_timeout)

    with pytest.raises(ProviderTimeout):
        provider.request(ask())


def test_the_key_never_appears_in_errors() -> None:
    echoed = {
        "type": "error",
        "error": {"type": "authentication_error", "message": f"bad key {KEY}"},
    }
    provider, _ = make(httpx.Response(401, json=echoed))

    with pytest.raises(AuthenticationError) as caught:
        provider.request(ask())

    assert KEY not in shown(caught.value)
    assert "[redacted]" in shown(caught.value)


# -- end to end: a persisted chat over recorded wire data ----------------------------------
def without_inner_strict(body: dict[str, Any]) -> dict[str, Any]:
    """A recorded body less RubyLLM's in-schema "strict" key (see test_anthropic_replay)."""
    body = copy.deepcopy(body)
    for tool in body.get("tools", []):
        tool["input_schema"].pop("strict", None)
    return body


@pytest.mark.django_db
def test_a_persisted_chat_runs_two_tool_rounds_over_recorded_traffic(replaying, user) -> None:
    cassette = replaying(
        "chat_function_calling_anthropic_claude-haiku-4-5_can_use_tools_in_multi-turn_conversations",
        AnthropicProvider,
    )
    chat = weather_chat(f"anthropic:{MODEL}", user)

    answers = ask_both(chat)

    assert_claude_answered_both(
        chat, answers, ("toolu_01HNqv4WuLBnYyX5RLKHfZjL", "toolu_015sAPcNRzx1n4KGqsukSEs3")
    )
    assert [(u.status, u.input_tokens, u.output_tokens) for u in Usage.objects.order_by("id")] == [
        ("succeeded", 633, 75),
        ("succeeded", 748, 42),
        ("succeeded", 812, 75),
        ("succeeded", 927, 48),
    ]
    # What the chat sent is what RubyLLM sent for the same conversation.
    assert cassette.sent_bodies() == [
        without_inner_strict(i.request_body) for i in cassette.interactions
    ]


@pytest.mark.django_db
def test_a_persisted_chat_streams_two_tool_rounds_over_recorded_traffic(replaying, user) -> None:
    cassette = replaying(
        "chat_function_calling_anthropic_claude-haiku-4-5_can_use_tools_with_multi-turn_streaming_conversations",
        AnthropicProvider,
    )
    chat = weather_chat(f"anthropic:{MODEL}", user)

    answers = stream_both(chat)

    assert_each_answer_was_streamed(answers)
    rows = assert_two_complete_rounds(chat)
    assert [c.name for m in rows for c in m.tool_calls.all()] == ["weather", "weather"]
    assert Usage.objects.filter(status="succeeded").count() == 4
    assert cassette.sent_bodies() == [
        without_inner_strict(i.request_body) for i in cassette.interactions
    ]


@pytest.mark.django_db
def test_invalid_streamed_arguments_become_an_error_result_the_model_sees(user) -> None:
    provider, recorder = make(
        sse(
            start(),
            block(0, {"type": "tool_use", "id": "toolu_bad", "name": "weather", "input": {}}),
            delta(0, type="input_json_delta", partial_json='{"latitude": "52.52", '),
            *end(stop="tool_use"),
        ),
        sse(
            start(),
            block(0, {"type": "text", "text": ""}),
            delta(0, type="text_delta", text="Sorry."),
            *end(),
        ),
    )
    with registered("anthropic", provider):
        chat = weather_chat(f"anthropic:{MODEL}", user)
        chat.ask("Weather in Berlin?", stream=lambda chunk: None)

    result = chat.messages.get(role="tool")
    assert result.is_error
    assert "not a JSON object" in result.content
    assert result.tool_call.state == "failed"
    sent = recorder.bodies[1]["messages"]
    assert sent[1]["content"] == [
        {"type": "tool_use", "id": "toolu_bad", "name": "weather", "input": {}}
    ]
    assert sent[2]["content"][0]["is_error"] is True


def test_closing_objects_reaches_nested_definitions_and_leaves_property_names_alone() -> None:
    schema = {
        "type": "object",
        "properties": {
            "properties": {"type": "string"},
            "pets": {"type": "array", "items": {"$ref": "#/$defs/Pet"}},
            "owner": {"anyOf": [{"type": "object", "properties": {}}, {"type": "null"}]},
        },
        "$defs": {"Pet": {"type": "object", "properties": {"name": {"type": "string"}}}},
    }
    provider, _ = make()

    sent = provider.build_body(ask(output_schema=schema), stream=False)["output_config"]
    closed = sent["format"]["schema"]

    assert closed["additionalProperties"] is False
    assert closed["properties"]["properties"] == {"type": "string"}
    assert closed["$defs"]["Pet"]["additionalProperties"] is False
    assert closed["properties"]["owner"]["anyOf"][0]["additionalProperties"] is False
    assert closed["properties"]["owner"]["anyOf"][1] == {"type": "null"}
    assert "additionalProperties" not in schema

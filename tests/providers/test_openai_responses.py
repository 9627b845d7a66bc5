"""OpenAIResponsesProvider on its own small fixtures: the body it builds, errors, streams,
and persisted chats talking to it through an httpx.MockTransport (recorded wire data for
the end-to-end conversations)."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import httpx
import pytest
from django.test import override_settings
from pydantic import BaseModel

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
    ToolCall,
    ToolCallDelta,
    ToolDefinition,
)
from agentloop.models import Chat
from agentloop.providers.common import INVALID_ARGUMENTS
from agentloop.providers.openai_responses import OUTPUT_KEY, OpenAIResponsesProvider
from tests.helpers import transcript, user_request
from tests.providers.wire import (
    Recorder,
    cancelling,
    event_stream,
    read_timeout,
    registered,
    system_messages_around_a_question,
)
from tests.providers.wire import openai_error as error
from tests.tools import RecordedWeather

KEY = "sk-proj-responsesTESTKEY0123456789"


class Server(Recorder):
    """A Recorder making the provider that talks to it."""

    def provider(self, **options: Any) -> OpenAIResponsesProvider:
        options.setdefault("api_key", KEY)
        return OpenAIResponsesProvider(transport=self.transport(), **options)


def answer(*output: dict[str, Any], status: str = "completed", **extra: Any) -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "status": status,
        "model": "gpt-5-nano-2025-08-07",
        "output": list(output),
        "text": {"format": {"type": "text"}},
        "usage": {
            "input_tokens": 20,
            "input_tokens_details": {"cached_tokens": 5},
            "output_tokens": 30,
            "output_tokens_details": {"reasoning_tokens": 12},
        },
        **extra,
    }


def text_item(text: str) -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def call_item(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {
        "id": f"fc_{call_id}",
        "type": "function_call",
        "status": "completed",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def reasoning_item(secret: str) -> dict[str, Any]:
    return {
        "id": "rs_1",  # the vendor re-encrypts the same item for each event it sends
        "type": "reasoning",
        "summary": [],
        "content": [],
        "encrypted_content": secret,
    }


def sse(*events: dict[str, Any]) -> httpx.Response:
    return event_stream(
        "".join(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n" for event in events)
    )


ask = partial(user_request, "gpt-5-nano")  # one user message to this file's model


# -- the body ----------------------------------------------------------------------------
def test_system_messages_anywhere_become_the_instructions():
    body = OpenAIResponsesProvider(api_key=KEY).build_body(
        system_messages_around_a_question("gpt-5-nano"), stream=False
    )

    assert body["instructions"] == "Be brief.\n\nAnswer in French."
    assert body["input"] == [{"role": "user", "content": "Hi"}]


def test_requests_are_stateless_and_ask_for_encrypted_reasoning():
    body = OpenAIResponsesProvider(api_key=KEY).build_body(ask(), stream=True)

    assert body["store"] is False
    assert body["stream"] is True
    assert body["include"] == ["reasoning.encrypted_content"]


def test_models_that_do_not_reason_are_not_asked_for_encrypted_reasoning():
    request = ask().model_copy(update={"model": "gpt-4.1-mini"})

    body = OpenAIResponsesProvider(api_key=KEY).build_body(request, stream=False)

    assert "include" not in body


def test_a_tool_conversation_maps_to_function_call_items_in_order():
    call = ToolCall(id="call_1", name="add", arguments={"a": 1, "b": 2})
    messages = [
        Message(role="user", content="1 + 2?"),
        Message(
            role="assistant",
            tool_calls=[call],
            provider_data={
                OUTPUT_KEY: [
                    {"type": "reasoning", "summary": [], "encrypted_content": "enc-1"},
                    {"type": "function_call", "call_id": "call_1"},
                ]
            },
        ),
        Message(role="tool", content="3", tool_call_id="call_1", tool_name="add"),
        Message(role="assistant", content="It is 3."),
    ]

    body = OpenAIResponsesProvider(api_key=KEY).build_body(
        ModelRequest(model="gpt-5-nano", messages=messages), stream=False
    )

    assert body["input"] == [
        {"role": "user", "content": "1 + 2?"},
        {"type": "reasoning", "summary": [], "encrypted_content": "enc-1"},
        {"type": "function_call", "call_id": "call_1", "name": "add", "arguments": '{"a":1,"b":2}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "3"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "It is 3."}]},
    ]


def test_an_error_result_is_sent_as_its_text():
    messages = [
        Message(role="user", content="go"),
        Message(role="assistant", tool_calls=[ToolCall(id="c1", name="refuse")]),
        Message(role="tool", content="refused: no", tool_call_id="c1", is_error=True),
    ]

    body = OpenAIResponsesProvider(api_key=KEY).build_body(
        ModelRequest(model="gpt-5-nano", messages=messages), stream=False
    )

    assert body["input"][-1] == {
        "type": "function_call_output",
        "call_id": "c1",
        "output": "refused: no",
    }


def test_tool_choice_parallel_control_and_limits_are_sent():
    request = ask(
        tools=[ToolDefinition(name="add", parameters={"type": "object", "properties": {}})],
        tool_choice="add",
        parallel_tool_calls=False,
        temperature=0.2,
        max_output_tokens=300,
    ).model_copy(update={"model": "gpt-4.1-nano"})  # a model that takes a temperature

    body = OpenAIResponsesProvider(api_key=KEY).build_body(request, stream=False)

    assert body["tool_choice"] == {"type": "function", "name": "add"}
    assert body["parallel_tool_calls"] is False
    assert body["temperature"] == 0.2
    assert body["max_output_tokens"] == 300


def test_a_tool_whose_arguments_are_all_required_is_strict():
    parameters = {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    }
    request = ask(
        tools=[ToolDefinition(name="weather", description="Weather.", parameters=parameters)]
    )

    (tool,) = OpenAIResponsesProvider(api_key=KEY).build_body(request, stream=False)["tools"]

    assert tool == {
        "type": "function",
        "name": "weather",
        "description": "Weather.",
        "parameters": {**parameters, "additionalProperties": False},
        "strict": True,
    }
    assert "additionalProperties" not in parameters  # a copy was changed, not the definition


def test_a_tool_with_optional_arguments_is_sent_as_is_without_strict_mode():
    parameters = {
        "type": "object",
        "properties": {"label": {"type": "string"}, "seconds": {"type": "number", "default": 0.0}},
        "required": ["label"],
    }
    request = ask(tools=[ToolDefinition(name="record", parameters=parameters)])

    (tool,) = OpenAIResponsesProvider(api_key=KEY).build_body(request, stream=False)["tools"]

    assert tool["strict"] is False
    assert tool["parameters"] == parameters


class Person(BaseModel):
    name: str
    nickname: str | None = None


def test_a_pydantic_schema_becomes_a_strict_named_json_schema_format():
    schema = Person.model_json_schema()

    body = OpenAIResponsesProvider(api_key=KEY).build_body(ask(output_schema=schema), stream=False)

    text_format = body["text"]["format"]
    assert text_format["type"] == "json_schema"
    assert text_format["name"] == "Person"
    assert text_format["strict"] is True
    assert text_format["schema"]["additionalProperties"] is False
    assert text_format["schema"]["required"] == ["name", "nickname"]
    assert "default" not in text_format["schema"]["properties"]["nickname"]
    assert "title" not in text_format["schema"]
    assert schema == Person.model_json_schema()  # the request's schema is untouched


def test_provider_options_deep_merge_over_the_body():
    request = ask(
        output_schema={"type": "object", "properties": {}},
        provider_options={"text": {"verbosity": "low"}, "reasoning": {"effort": "minimal"}},
    )

    body = OpenAIResponsesProvider(api_key=KEY).build_body(request, stream=False)

    assert body["text"]["verbosity"] == "low"
    assert body["text"]["format"]["type"] == "json_schema"
    assert body["reasoning"] == {"effort": "minimal"}


def test_provider_options_can_turn_encrypted_reasoning_off():
    body = OpenAIResponsesProvider(api_key=KEY).build_body(
        ask(provider_options={"include": [], "store": True}), stream=False
    )

    assert body["include"] == []
    assert body["store"] is True


# -- the answer --------------------------------------------------------------------------
def test_an_answer_keeps_its_reasoning_for_the_next_request():
    server = Server(
        httpx.Response(
            200, json=answer(reasoning_item("enc-A"), call_item("call_9", "add", '{"a":1}'))
        )
    )

    response = server.provider().request(ask())

    assert response.tool_calls[0].id == "call_9"
    assert response.tool_calls[0].arguments == {"a": 1}
    assert response.finish_reason == "tool_calls"
    assert response.provider_data[OUTPUT_KEY] == [
        {"type": "reasoning", "summary": [], "encrypted_content": "enc-A"},
        {"type": "function_call", "call_id": "call_9"},
    ]
    assert response.usage.model_dump() == {
        "input_tokens": 20,
        "output_tokens": 30,
        "cache_read_tokens": 5,
        "cache_write_tokens": 0,
        "cache_write_1h_tokens": 0,
        "reasoning_tokens": 12,
    }


def test_invalid_tool_call_arguments_are_kept_and_sent_back_verbatim():
    server = Server(httpx.Response(200, json=answer(call_item("call_1", "add", '{"a": 1,'))))
    provider = server.provider()

    response = provider.request(ask())
    (call,) = response.tool_calls
    body = provider.build_body(
        ModelRequest(
            model="gpt-5-nano",
            messages=[
                Message(role="assistant", tool_calls=[call], provider_data=response.provider_data)
            ],
        ),
        stream=False,
    )

    assert call.arguments == {}
    assert call.provider_data == {INVALID_ARGUMENTS: '{"a": 1,'}
    assert body["input"][0]["arguments"] == '{"a": 1,'


def test_an_answer_cut_short_by_max_output_tokens_finishes_with_length():
    data = answer(
        text_item("Once upon"),
        status="incomplete",
        incomplete_details={"reason": "max_output_tokens"},
    )

    response = Server(httpx.Response(200, json=data)).provider().request(ask())

    assert response.content == "Once upon"
    assert response.finish_reason == "length"


def test_structured_output_is_parsed():
    data = answer(
        text_item('{"name": "Ada"}'),
        text={"format": {"type": "json_schema", "name": "Person", "strict": True}},
    )

    response = Server(httpx.Response(200, json=data)).provider().request(ask())

    assert response.parsed == {"name": "Ada"}


# -- errors ------------------------------------------------------------------------------
def test_429_is_a_rate_limit_error_with_retry_after():
    server = Server(error(429, "Rate limit reached", "rate_limit_exceeded", **{"retry-after": "7"}))

    with pytest.raises(RateLimitError) as raised:
        server.provider().request(ask())

    assert raised.value.retry_after == 7.0
    assert raised.value.status == 429


def test_500_is_a_server_error():
    with pytest.raises(ServerError):
        Server(error(500, "The server had an error")).provider().request(ask())


def test_401_is_an_authentication_error():
    with pytest.raises(AuthenticationError):
        Server(error(401, "Incorrect API key provided", "invalid_api_key")).provider().request(
            ask()
        )


def test_context_length_400_is_a_context_length_error():
    server = Server(
        error(
            400, "Your input exceeds the context window of this model.", "context_length_exceeded"
        )
    )

    with pytest.raises(ContextLengthError):
        server.provider().request(ask())


def test_other_400s_are_bad_request_errors():
    with pytest.raises(BadRequestError):
        Server(error(400, "Unsupported parameter: 'temperature'")).provider().request(ask())


def test_malformed_json_is_an_invalid_response_error():
    with pytest.raises(InvalidResponseError):
        Server(httpx.Response(200, text="{not json")).provider().request(ask())


def test_an_answer_without_output_is_an_invalid_response_error():
    with pytest.raises(InvalidResponseError):
        Server(httpx.Response(200, json={"id": "resp_1"})).provider().request(ask())


def test_a_read_timeout_is_a_provider_timeout():
    with pytest.raises(ProviderTimeout):
        Server(read_timeout).provider().request(ask())


def test_the_key_never_appears_in_errors_or_reprs():
    echoed = error(401, f"Incorrect API key provided: {KEY}. Find yours at ...", "invalid_api_key")
    provider = Server(echoed).provider()

    with pytest.raises(AuthenticationError) as raised:
        provider.request(ask())

    assert KEY not in str(raised.value)
    assert KEY not in (raised.value.body or "")
    assert KEY not in repr(raised.value)
    assert KEY not in repr(provider)


def test_a_missing_key_names_the_setting_and_the_variable(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)

    with pytest.raises(ConfigurationError) as raised:
        OpenAIResponsesProvider(name="openai-responses").request(ask())

    assert "AGENTLOOP['PROVIDERS']['openai-responses']['api_key']" in str(raised.value)
    assert "OPENAI_API_KEY" in str(raised.value)


def test_key_and_base_url_come_from_settings_under_the_registry_name():
    server = Server(httpx.Response(200, json=answer(text_item("hi"))))
    settings = {
        "PROVIDERS": {
            "openai-responses": {"api_key": "from-settings", "base_url": "http://llm.test/v1"}
        }
    }

    with override_settings(AGENTLOOP=settings):
        OpenAIResponsesProvider(transport=httpx.MockTransport(server)).request(ask())

    assert str(server.requests[0].url) == "http://llm.test/v1/responses"
    assert server.requests[0].headers["authorization"] == "Bearer from-settings"


# -- streams -------------------------------------------------------------------------------
def event(kind: str, **fields: Any) -> dict[str, Any]:
    return {"type": f"response.{kind}", **fields}


def stream_events(*, finish: bool = True) -> list[dict[str, Any]]:
    call = call_item("call_5", "add", '{"a":2}')
    events: list[dict[str, Any]] = [
        event("created", response=answer(status="in_progress")),
        event("output_item.added", output_index=0, item=reasoning_item("enc-0")),
        event("output_item.done", output_index=0, item=reasoning_item("enc-1")),
        event("output_item.added", output_index=1, item={**text_item(""), "content": []}),
        event("output_text.delta", item_id="msg_1", output_index=1, delta="Hel"),
        event("output_text.delta", item_id="msg_1", output_index=1, delta="lo"),
        event("output_item.done", output_index=1, item=text_item("Hello")),
        event("output_item.added", output_index=2, item={**call, "arguments": ""}),
        event("function_call_arguments.delta", item_id=call["id"], output_index=2, delta='{"a":'),
        event("function_call_arguments.delta", item_id=call["id"], output_index=2, delta="2}"),
        event("output_item.done", output_index=2, item=call),
    ]
    if finish:
        final = answer(reasoning_item("enc-2"), text_item("Hello"), call)
        events.append(event("completed", response=final))
    return events


def test_a_stream_sends_chunks_and_assembles_the_answer():
    chunks: list[Any] = []

    response = Server(sse(*stream_events())).provider().request(ask(), on_chunk=chunks.append)

    assert chunks == [
        TextDelta(text="Hel"),
        TextDelta(text="lo"),
        ToolCallDelta(index=0, id="call_5", name="add", arguments=""),
        ToolCallDelta(index=0, arguments='{"a":'),
        ToolCallDelta(index=0, arguments="2}"),
    ]
    assert response.content == "Hello"
    assert [(c.id, c.name, c.arguments) for c in response.tool_calls] == [
        ("call_5", "add", {"a": 2})
    ]
    assert response.usage.reasoning_tokens == 12
    # The reasoning sent back is the one the item's "done" event carried.
    assert response.provider_data[OUTPUT_KEY][0]["encrypted_content"] == "enc-1"


def test_a_stream_without_its_completed_event_is_interrupted():
    server = Server(sse(*stream_events(finish=False)))

    with pytest.raises(StreamInterruptedError):
        server.provider().request(ask(), on_chunk=lambda chunk: None)


def test_malformed_stream_data_is_an_invalid_response_error():
    broken = event_stream("data: {oops\n\n")

    with pytest.raises(InvalidResponseError):
        Server(broken).provider().request(ask(), on_chunk=lambda chunk: None)


def test_a_failed_stream_raises_the_matching_error():
    failed = answer(status="failed", error={"code": "rate_limit_exceeded", "message": "Slow down"})
    server = Server(sse({"type": "response.failed", "response": failed}))

    with pytest.raises(RateLimitError, match="Slow down"):
        server.provider().request(ask(), on_chunk=lambda chunk: None)


def test_an_error_event_raises_the_matching_error():
    event = {
        "type": "error",
        "code": "context_length_exceeded",
        "message": "Too long",
        "param": None,
    }

    with pytest.raises(ContextLengthError):
        Server(sse(event)).provider().request(ask(), on_chunk=lambda chunk: None)


def test_an_exception_from_the_chunk_callback_stops_the_stream():
    seen: list[Any] = []

    with pytest.raises(CancelledError):
        Server(sse(*stream_events())).provider().request(ask(), on_chunk=cancelling(seen))

    assert seen == [TextDelta(text="Hel")]


# -- persisted chats over recorded wire data ---------------------------------------------------
@pytest.mark.django_db
def test_a_persisted_chat_does_a_two_round_tool_conversation(replaying, user):
    cassette = replaying(
        "chat_function_calling_openai_gpt-5-nano_can_use_tools",
        OpenAIResponsesProvider,
        register_as="replay",
    )
    question = "What's the weather in Berlin? (52.5200, 13.4050)"
    chat = Chat.objects.create(model="replay:gpt-5-nano", owner=user)
    chat.with_tools(RecordedWeather)

    chat.ask_later(question).generate()
    # Another process continues from the rows alone.
    answer_message = Chat.objects.get(pk=chat.pk).complete()

    result = "Current weather at 52.5200, 13.4050: 15°C, Wind: 10 km/h"
    final = cassette.interactions[1].response_json()["output"][1]["content"][0]["text"]
    assert transcript(chat) == [
        ("user", question),
        ("assistant", ""),
        ("tool", result),
        ("assistant", final),
    ]
    assert answer_message.content == final
    asked = chat.messages.get(role="assistant", content="")
    (call,) = asked.tool_calls.all()
    assert (call.call_id, call.name, call.arguments) == (
        "call_R1nRm6zHHaYdJmzUTyHeErE1",
        "weather",
        {"latitude": "52.5200", "longitude": "13.4050"},
    )
    assert call.result.content == result
    assert asked.provider_data[OUTPUT_KEY][0]["encrypted_content"].startswith("gAAAA")
    usage = chat.usage_records.order_by("id").values_list(
        "status", "input_tokens", "output_tokens", "reasoning_tokens"
    )
    assert list(usage) == [("succeeded", 87, 211, 128), ("succeeded", 330, 259, 192)]
    # The second request carried the reasoning, the call and its result exactly as recorded.
    sent = cassette.sent_bodies()
    assert [body["input"] for body in sent] == [
        i.request_body["input"] for i in cassette.interactions
    ]


@pytest.mark.django_db
def test_a_persisted_chat_streams_a_multi_turn_tool_conversation(replaying, user):
    cassette = replaying(
        "chat_function_calling_openai_gpt-5-nano_can_use_tools_with_multi-turn_streaming_conversations",
        OpenAIResponsesProvider,
        register_as="replay",
    )
    chat = Chat.objects.create(model="replay:gpt-5-nano", owner=user)
    chat.with_tools(RecordedWeather)
    chunks: list[Any] = []

    chat.ask("What's the weather in Berlin? (52.5200, 13.4050)", stream=chunks.append)
    Chat.objects.get(pk=chat.pk).ask(
        "What's the weather in Paris? (48.8575, 2.3514)", stream=chunks.append
    )

    roles = [role for role, _ in transcript(chat)]
    assert roles == ["user", "assistant", "tool", "assistant"] * 2
    sent = cassette.sent_bodies()
    assert [body["input"] for body in sent] == [
        i.request_body["input"] for i in cassette.interactions
    ]
    assert all(body["stream"] is True for body in sent)
    streamed = "".join(chunk.text for chunk in chunks if isinstance(chunk, TextDelta))
    answers = [content for role, content in transcript(chat) if role == "assistant" and content]
    assert streamed == "".join(answers)


@pytest.mark.django_db
def test_a_rate_limited_call_is_retried_after_the_servers_delay(user):
    server = Server(
        error(429, "Rate limit reached", "rate_limit_exceeded", **{"retry-after": "0"}),
        httpx.Response(200, json=answer(text_item("Hello again"))),
    )
    with registered("replay", server.provider(api_key="test-key")):
        chat = Chat.objects.create(model="replay:gpt-5-nano", owner=user)
        reply = chat.ask("Hello")

    assert reply.content == "Hello again"
    assert list(chat.usage_records.order_by("id").values_list("status", flat=True)) == [
        "failed",
        "succeeded",
    ]
    assert len(server.requests) == 2


@pytest.mark.django_db
def test_invalid_arguments_reach_the_model_as_an_error_result(user):
    server = Server(
        httpx.Response(200, json=answer(call_item("call_1", "weather", '{"latitude": "52.52"'))),
        httpx.Response(200, json=answer(text_item("Sorry, let me retry."))),
    )
    with registered("replay", server.provider(api_key="test-key")):
        chat = Chat.objects.create(model="replay:gpt-5-nano", owner=user)
        chat.with_tools(RecordedWeather).ask("Weather in Berlin?")

    result = chat.messages.get(role="tool")
    assert result.is_error
    assert "Invalid arguments" in result.content
    second = server.bodies[1]["input"]
    assert second[1] == {
        "type": "function_call",
        "call_id": "call_1",
        "name": "weather",
        "arguments": '{"latitude": "52.52"',
    }
    assert second[2]["type"] == "function_call_output"
    assert second[2]["output"] == result.content

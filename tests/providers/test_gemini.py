"""GeminiProvider on the project's own small fixtures: configuration, request mapping, the
schema dialect, thought signatures and call ids, errors, streams, and persisted chats over
recorded wire data."""

from __future__ import annotations

import copy
import json
from functools import partial
from typing import Any, Literal

import httpx
import pytest
from django.test import override_settings
from pydantic import BaseModel, Field

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
from agentloop.models import Chat, Usage
from agentloop.providers.common import INVALID_ARGUMENTS
from agentloop.providers.gemini import (
    CALL_ID,
    PARTS_KEY,
    SIGNATURE,
    GeminiProvider,
    gemini_schema,
)
from agentloop.tools import tool
from tests.helpers import user_request
from tests.providers.cassettes import (
    ask_both,
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
from tests.tools import RecordedWeather

MODEL = "gemini-2.5-flash"
KEY = "AIzaSyTestSecretKey1234567890abcdefgh"
URL = f"https://generativelanguage.googleapis.com/v1beta/models/{MODEL}:generateContent"
STREAM_URL = (
    f"https://generativelanguage.googleapis.com/v1beta/models/{MODEL}:streamGenerateContent?alt=sse"
)


# -- helpers -------------------------------------------------------------------------------
def make(*responses: Any, **options: Any) -> tuple[GeminiProvider, Recorder]:
    options.setdefault("api_key", KEY)
    return answering(GeminiProvider, *responses, **options)


def usage(prompt: int = 10, output: int = 5, **more: int) -> dict[str, int]:
    return {
        "promptTokenCount": prompt,
        "candidatesTokenCount": output,
        "totalTokenCount": prompt + output + sum(more.values()),
        **more,
    }


def chunk(*parts: dict[str, Any], finish: str | None = None, **fields: Any) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"parts": list(parts), "role": "model"}, "index": 0}
    if finish:
        candidate["finishReason"] = finish
    return {
        "candidates": [candidate],
        "usageMetadata": usage(),
        "modelVersion": MODEL,
        "responseId": "resp-1",
        **fields,
    }


def answer(*parts: dict[str, Any], finish: str = "STOP", **fields: Any) -> httpx.Response:
    return httpx.Response(200, json=chunk(*parts, finish=finish, **fields))


def sse(*chunks: dict[str, Any]) -> httpx.Response:
    return event_stream("".join(f"data: {json.dumps(c)}\r\n\r\n" for c in chunks))


def call_part(name: str, args: Any, signature: str | None = None, **call: Any) -> dict[str, Any]:
    part: dict[str, Any] = {"functionCall": {"name": name, "args": args, **call}}
    if signature:
        part["thoughtSignature"] = signature
    return part


ask = partial(user_request, MODEL)  # one user message to this file's model


def error(status: int, rpc: str, message: str, *details: dict[str, Any], **headers: str):
    body = {"error": {"code": status, "message": message, "status": rpc, "details": list(details)}}
    return httpx.Response(status, json=body, headers=headers)


def ignore(chunk: Any) -> None:
    return None


WEATHER = ToolDefinition(
    name="weather",
    description="Gets the weather",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string", "description": "City name"}},
        "required": ["city"],
        "additionalProperties": False,
    },
)


# -- configuration -------------------------------------------------------------------------
def test_requests_go_to_generate_content_with_the_key_header() -> None:
    provider, recorder = make(answer({"text": "Hello"}))

    provider.request(ask())

    sent = recorder.requests[0]
    assert str(sent.url) == URL
    assert sent.headers["x-goog-api-key"] == KEY
    assert "authorization" not in sent.headers
    assert KEY not in str(sent.url)


def test_streams_go_to_stream_generate_content_as_sse() -> None:
    provider, recorder = make(sse(chunk({"text": "Hi"}, finish="STOP")))

    provider.request(ask(), on_chunk=ignore)

    assert str(recorder.requests[0].url) == STREAM_URL
    assert "stream" not in recorder.bodies[0]


@pytest.mark.parametrize(
    ("model", "path"),
    [
        ("models/gemini-2.5-pro", "/v1beta/models/gemini-2.5-pro:generateContent"),
        ("tunedModels/my-model-123", "/v1beta/tunedModels/my-model-123:generateContent"),
    ],
)
def test_a_model_given_as_a_resource_name_is_used_as_it_is(model: str, path: str) -> None:
    provider, recorder = make(answer({"text": "Hi"}))

    provider.request(ModelRequest(model=model, messages=[Message(role="user", content="Hi")]))

    assert recorder.requests[0].url.path == path


@pytest.mark.parametrize(
    ("environment", "expected"),
    [
        ({"GEMINI_API_KEY": "AIza-gemini-env-123456"}, "AIza-gemini-env-123456"),
        ({"GOOGLE_API_KEY": "AIza-google-env-123456"}, "AIza-google-env-123456"),
        ({"GEMINI_API_KEY": "AIza-first", "GOOGLE_API_KEY": "AIza-second"}, "AIza-first"),
    ],
)
def test_the_key_comes_from_the_environment(monkeypatch, environment, expected) -> None:
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    for variable, value in environment.items():
        monkeypatch.setenv(variable, value)
    provider, recorder = make(answer({"text": "Hi"}), api_key=None)

    provider.request(ask())

    assert recorder.requests[0].headers["x-goog-api-key"] == expected


def test_settings_give_key_base_url_and_api_version() -> None:
    configured = {
        "api_key": "AIza-settings-1234567",
        "base_url": "https://proxy.test/gemini/",
        "api_version": "v1alpha",
    }
    with override_settings(AGENTLOOP={"PROVIDERS": {"gemini": configured}}):
        provider, recorder = make(answer({"text": "Hi"}), api_key=None)
        provider.request(ask())

    sent = recorder.requests[0]
    assert str(sent.url) == f"https://proxy.test/gemini/v1alpha/models/{MODEL}:generateContent"
    assert sent.headers["x-goog-api-key"] == "AIza-settings-1234567"


def test_a_missing_key_fails_at_request_time_naming_the_setting(monkeypatch) -> None:
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    provider, recorder = make(api_key=None)  # constructing it is fine

    with pytest.raises(ConfigurationError, match="GEMINI_API_KEY") as caught:
        provider.request(ask())

    assert "AGENTLOOP['PROVIDERS']['gemini']['api_key']" in str(caught.value)
    assert "GOOGLE_API_KEY" in str(caught.value)
    assert recorder.requests == []


def test_the_builtin_name_and_gemini_ids_resolve_to_this_provider() -> None:
    provider, model = resolved(MODEL)

    assert isinstance(provider, GeminiProvider)
    assert (provider.name, model) == ("gemini", MODEL)


def test_the_key_never_appears_in_the_repr() -> None:
    provider, _ = make()

    assert KEY not in repr(provider)


# -- request mapping -----------------------------------------------------------------------
def test_system_messages_anywhere_become_the_system_instruction_in_order() -> None:
    provider, _ = make()

    body = provider.build_body(system_messages_around_a_question(MODEL), stream=False)

    assert body["systemInstruction"] == {
        "parts": [{"text": "Be brief."}, {"text": "Answer in French."}]
    }
    assert body["contents"] == [{"role": "user", "parts": [{"text": "Hi"}]}]
    assert "generationConfig" not in body


def test_a_rounds_results_share_one_user_content_with_errors_under_the_error_key() -> None:
    provider, _ = make()
    request = two_results_then_a_question(MODEL, ("call_a", "call_b"), [WEATHER])

    contents = provider.build_body(request, stream=False)["contents"]

    assert contents[1] == {
        "role": "model",
        "parts": [
            {"text": "Checking."},
            {"functionCall": {"name": "weather", "args": {"city": "Paris"}}},
            {"functionCall": {"name": "weather", "args": {"city": "Rome"}}},
        ],
    }
    assert contents[2:] == [
        {
            "role": "user",
            "parts": [
                {
                    "functionResponse": {
                        "name": "weather",
                        "response": {"name": "weather", "content": [{"text": "sunny"}]},
                    }
                },
                {
                    "functionResponse": {
                        "name": "weather",
                        "response": {"name": "weather", "error": "boom"},
                    }
                },
                {"text": "And tomorrow?"},
            ],
        }
    ]


def test_a_result_without_a_tool_name_takes_the_calls_name() -> None:
    provider, _ = make()
    request = ModelRequest(
        model=MODEL,
        messages=[
            Message(role="user", content="Hi"),
            Message(role="assistant", tool_calls=[ToolCall(id="call_1", name="weather")]),
            Message(role="tool", tool_call_id="call_1", content="sunny"),
        ],
    )

    contents = provider.build_body(request, stream=False)["contents"]

    assert contents[2]["parts"][0]["functionResponse"]["name"] == "weather"


def test_an_empty_assistant_answer_is_left_out() -> None:
    provider, _ = make()

    contents = provider.build_body(an_empty_answer_between_questions(MODEL), stream=False)[
        "contents"
    ]

    assert contents == [{"role": "user", "parts": [{"text": "Hi"}, {"text": "Hello?"}]}]


def test_a_call_with_invalid_arguments_is_sent_back_with_empty_args() -> None:
    provider, _ = make()
    call = ToolCall(id="call_1", name="weather", provider_data={INVALID_ARGUMENTS: "{oops"})
    request = an_invalid_call_answered(MODEL, call, tool_name="weather")

    contents = provider.build_body(request, stream=False)["contents"]

    assert contents[1]["parts"] == [{"functionCall": {"name": "weather", "args": {}}}]


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        (None, None),
        ("auto", {"functionCallingConfig": {"mode": "AUTO"}}),
        ("none", {"functionCallingConfig": {"mode": "NONE"}}),
        ("required", {"functionCallingConfig": {"mode": "ANY"}}),
        (
            "weather",
            {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["weather"]}},
        ),
    ],
)
def test_tool_choice_becomes_the_function_calling_mode(choice, expected) -> None:
    provider, _ = make()

    body = provider.build_body(ask(tools=[WEATHER], tool_choice=choice), stream=False)

    assert body.get("toolConfig") == expected


def test_one_call_per_answer_has_no_wire_switch() -> None:
    provider, _ = make()

    body = provider.build_body(ask(tools=[WEATHER], parallel_tool_calls=False), stream=False)

    assert "toolConfig" not in body


def test_temperature_and_max_output_tokens_go_in_the_generation_config() -> None:
    provider, _ = make()

    body = provider.build_body(ask(temperature=0.0, max_output_tokens=300), stream=False)

    assert body["generationConfig"] == {"temperature": 0.0, "maxOutputTokens": 300}


def test_provider_options_deep_merge_into_the_body_and_win() -> None:
    provider, _ = make()
    request = ask(
        temperature=0.2,
        provider_options={
            "generationConfig": {"temperature": 1.0, "thinkingConfig": {"thinkingBudget": 0}},
            "safetySettings": [{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "OFF"}],
        },
    )

    body = provider.build_body(request, stream=False)

    assert body["generationConfig"] == {"temperature": 1.0, "thinkingConfig": {"thinkingBudget": 0}}
    assert body["safetySettings"][0]["threshold"] == "OFF"


def test_request_headers_are_sent() -> None:
    provider, recorder = make(answer({"text": "Hi"}))

    provider.request(ask(headers={"x-goog-user-project": "my-project"}))

    assert recorder.requests[0].headers["x-goog-user-project"] == "my-project"


# -- the schema dialect ----------------------------------------------------------------------
class Address(BaseModel):
    street: str
    city: str = Field(description="City name")


class Person(BaseModel):
    name: str
    status: Literal["active", "retired"] | None = Field(default=None, description="Status")
    tags: list[str] = Field(default_factory=list)
    address: Address | None = None
    home: Address
    born: str = Field(json_schema_extra={"format": "date"})
    score: float = Field(ge=0, le=10)


def test_a_pydantic_schema_becomes_the_gemini_dialect() -> None:
    schema = Person.model_json_schema()
    original = copy.deepcopy(schema)

    converted = gemini_schema(schema)

    address = {
        "type": "OBJECT",
        "properties": {
            "street": {"type": "STRING"},
            "city": {"type": "STRING", "description": "City name"},
        },
        "required": ["street", "city"],
    }
    assert converted == {
        "type": "OBJECT",
        "properties": {
            "name": {"type": "STRING"},
            "status": {
                "type": "STRING",
                "enum": ["active", "retired"],
                "description": "Status",
                "nullable": True,
            },
            "tags": {"type": "ARRAY", "items": {"type": "STRING"}},
            "address": {**address, "nullable": True},
            "home": address,
            "born": {"type": "STRING", "format": "date"},
            "score": {"type": "NUMBER", "minimum": 0, "maximum": 10},
        },
        "required": ["name", "home", "born", "score"],
    }
    assert schema == original


def test_a_type_list_with_null_and_a_const_are_expressible() -> None:
    schema = {
        "type": "object",
        "properties": {
            "note": {"type": ["string", "null"]},
            "kind": {"const": "fixed"},
            "choice": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
        },
    }

    assert gemini_schema(schema) == {
        "type": "OBJECT",
        "properties": {
            "note": {"type": "STRING", "nullable": True},
            "kind": {"type": "STRING", "enum": ["fixed"]},
            "choice": {"anyOf": [{"type": "STRING"}, {"type": "INTEGER"}]},
        },
    }


class Node(BaseModel):
    value: int
    children: list[Node] = []


@pytest.mark.parametrize(
    "schema",
    [
        Node.model_json_schema(),  # recursive
        {
            "type": "object",
            "properties": {
                "counts": {"type": "object", "additionalProperties": {"type": "integer"}}
            },
        },
        {"type": "object", "properties": {"level": {"enum": [1, 2, 3]}}},
        {"type": "object", "properties": {"anything": {"description": "Any value"}}},
        {"type": "object", "properties": {"pair": {"type": "array", "prefixItems": [{}, {}]}}},
    ],
    ids=["recursive", "map", "integer-enum", "untyped", "tuple"],
)
def test_what_the_dialect_cant_say_goes_as_json_schema(schema) -> None:
    provider, _ = make()
    definition = ToolDefinition(name="t", description="T", parameters=schema)

    body = provider.build_body(ask(tools=[definition]), stream=False)

    assert gemini_schema(schema) is None
    assert body["tools"] == [
        {
            "functionDeclarations": [
                {"name": "t", "description": "T", "parametersJsonSchema": schema}
            ]
        }
    ]


def test_tool_definitions_from_tool_classes_are_sent_in_the_dialect() -> None:
    @tool
    def ping() -> str:
        """Checks the line."""
        return "pong"

    provider, _ = make()
    definitions = [RecordedWeather.definition(), ping.definition()]

    body = provider.build_body(ask(tools=definitions), stream=False)

    assert body["tools"] == [
        {
            "functionDeclarations": [
                {
                    "name": "weather",
                    "description": "Gets current weather for a location",
                    "parameters": {
                        "type": "OBJECT",
                        "properties": {
                            "latitude": {
                                "type": "STRING",
                                "description": "Latitude (e.g., 52.5200)",
                            },
                            "longitude": {
                                "type": "STRING",
                                "description": "Longitude (e.g., 13.4050)",
                            },
                        },
                        "required": ["latitude", "longitude"],
                    },
                },
                {
                    "name": "ping",
                    "description": "Checks the line.",
                    "parameters": {"type": "OBJECT", "properties": {}},
                },
            ]
        }
    ]


def test_a_tool_without_a_schema_is_declared_without_parameters() -> None:
    provider, _ = make()

    body = provider.build_body(ask(tools=[ToolDefinition(name="now")]), stream=False)

    assert body["tools"] == [{"functionDeclarations": [{"name": "now"}]}]


def test_structured_output_is_json_mode_with_the_translated_schema() -> None:
    provider, _ = make()

    body = provider.build_body(ask(output_schema=Address.model_json_schema()), stream=False)

    assert body["generationConfig"] == {
        "responseMimeType": "application/json",
        "responseSchema": gemini_schema(Address.model_json_schema()),
    }


def test_structured_output_the_dialect_cant_say_goes_as_response_json_schema() -> None:
    provider, _ = make()

    body = provider.build_body(ask(output_schema=Node.model_json_schema()), stream=False)

    assert body["generationConfig"] == {
        "responseMimeType": "application/json",
        "responseJsonSchema": Node.model_json_schema(),
    }


def test_structured_output_is_parsed_into_the_response() -> None:
    provider, _ = make(answer({"text": '{"street": "Main St", "city": "Springfield"}'}))

    response = provider.request(ask(output_schema=Address.model_json_schema()))

    assert response.parsed == {"street": "Main St", "city": "Springfield"}


# -- answers ---------------------------------------------------------------------------------
def test_usage_counts_thoughts_as_output_and_apart_as_reasoning() -> None:
    metadata = usage(
        prompt=1200,
        output=40,
        thoughtsTokenCount=300,
        cachedContentTokenCount=1024,
        toolUsePromptTokenCount=50,
    )
    provider, _ = make(answer({"text": "Hi"}, usageMetadata=metadata))

    response = provider.request(ask())

    assert response.usage.model_dump() == {
        "input_tokens": 1250,
        "output_tokens": 340,
        "cache_read_tokens": 1024,
        "cache_write_tokens": 0,
        "cache_write_1h_tokens": 0,
        "reasoning_tokens": 300,
    }


@pytest.mark.parametrize(
    ("finish", "parts", "expected"),
    [
        ("STOP", [{"text": "Hi"}], "stop"),
        ("STOP", [call_part("weather", {"city": "Paris"})], "tool_calls"),
        ("MAX_TOKENS", [{"text": "Once upon"}], "length"),
        ("SAFETY", [], "content_filter"),
        ("RECITATION", [], "content_filter"),
        ("MALFORMED_FUNCTION_CALL", [], "malformed_function_call"),
    ],
)
def test_finish_reasons_map_and_the_raw_one_is_kept(finish, parts, expected) -> None:
    provider, _ = make(answer(*parts, finish=finish))

    response = provider.request(ask())

    assert response.finish_reason == expected
    assert response.provider_data["finish_reason"] == finish


def test_a_blocked_prompt_is_an_empty_content_filter_answer() -> None:
    blocked = {"promptFeedback": {"blockReason": "PROHIBITED_CONTENT"}, "usageMetadata": usage()}
    provider, _ = make(httpx.Response(200, json=blocked))

    response = provider.request(ask())

    assert (response.content, response.tool_calls) == ("", [])
    assert response.finish_reason == "content_filter"
    assert response.provider_data["block_reason"] == "PROHIBITED_CONTENT"


def test_calls_without_ids_get_ours_and_keep_their_signature() -> None:
    provider, _ = make(
        answer(
            call_part("weather", {"city": "Paris"}, signature="sig-1"),
            call_part("weather", {"city": "Rome"}),
        )
    )

    first, second = provider.request(ask(tools=[WEATHER])).tool_calls

    assert first.id.startswith("call_") and second.id.startswith("call_")
    assert first.id != second.id
    assert (first.arguments, first.provider_data) == ({"city": "Paris"}, {SIGNATURE: "sig-1"})
    assert (second.arguments, second.provider_data) == ({"city": "Rome"}, {})


def test_call_ids_gemini_sends_are_used_and_go_back_on_call_and_result() -> None:
    provider, recorder = make(
        answer(call_part("weather", {"city": "Paris"}, signature="sig-1", id="fc-7")),
        answer({"text": "Sunny."}),
    )
    (call,) = provider.request(ask(tools=[WEATHER])).tool_calls

    provider.request(
        ModelRequest(
            model=MODEL,
            messages=[
                Message(role="user", content="Hi"),
                Message(role="assistant", tool_calls=[call]),
                Message(role="tool", tool_call_id=call.id, tool_name="weather", content="sunny"),
            ],
            tools=[WEATHER],
        )
    )

    assert (call.id, call.provider_data[CALL_ID]) == ("fc-7", "fc-7")
    model, results = recorder.bodies[1]["contents"][1:]
    assert model["parts"] == [
        {
            "functionCall": {"name": "weather", "args": {"city": "Paris"}, "id": "fc-7"},
            "thoughtSignature": "sig-1",
        }
    ]
    assert results["parts"][0]["functionResponse"]["id"] == "fc-7"


def test_arguments_that_are_not_an_object_are_kept_for_the_error_result() -> None:
    provider, _ = make(answer(call_part("weather", '{"city": "Par')))

    (call,) = provider.request(ask(tools=[WEATHER])).tool_calls

    assert call.arguments == {}
    assert call.provider_data == {INVALID_ARGUMENTS: '{"city": "Par'}


def test_thought_parts_stay_out_of_the_text_and_go_back_as_received() -> None:
    thought = {"text": "The user wants weather.", "thought": True}
    signed = {"text": "Let me check.", "thoughtSignature": "sig-text"}
    provider, recorder = make(
        answer(thought, signed, call_part("weather", {"city": "Paris"})),
        answer({"text": "Sunny."}),
    )
    first = provider.request(ask("Weather in Paris?", tools=[WEATHER]))
    assistant = as_message(first)
    result = Message(
        role="tool", tool_call_id=first.tool_calls[0].id, tool_name="weather", content="sunny"
    )

    provider.request(
        ModelRequest(
            model=MODEL,
            messages=[Message(role="user", content="Weather in Paris?"), assistant, result],
            tools=[WEATHER],
        )
    )

    assert first.content == "Let me check."
    assert recorder.bodies[1]["contents"][1]["parts"] == [
        thought,
        signed,
        {"functionCall": {"name": "weather", "args": {"city": "Paris"}}},
    ]


def test_an_edited_answer_keeps_its_thought_parts_and_rebuilds_the_text() -> None:
    provider, _ = make()
    thought = {"text": "Hmm.", "thought": True, "thoughtSignature": "sig-t"}
    message = Message(
        role="assistant",
        content="Edited text.",
        provider_data={PARTS_KEY: [thought, {"text": "Original.", "thoughtSignature": "sig"}]},
    )
    request = ModelRequest(
        model=MODEL,
        messages=[Message(role="user", content="Hi"), message, Message(role="user", content="So?")],
    )

    contents = provider.build_body(request, stream=False)["contents"]

    assert contents[1] == {"role": "model", "parts": [thought, {"text": "Edited text."}]}


# -- streams ---------------------------------------------------------------------------------
def test_a_stream_yields_text_and_call_deltas_and_reassembles_them() -> None:
    provider, _ = make(
        sse(
            chunk({"text": "Checking "}),
            chunk({"text": "both."}),
            chunk(
                call_part("weather", {"city": "Paris"}, signature="sig-1"),
                call_part("weather", {"city": "Rome"}),
                finish="STOP",
                usageMetadata=usage(prompt=12, output=40, thoughtsTokenCount=8),
            ),
        )
    )
    chunks: list[Any] = []

    response = provider.request(ask(tools=[WEATHER]), on_chunk=chunks.append)

    first, second = response.tool_calls
    assert chunks == [
        TextDelta(text="Checking "),
        TextDelta(text="both."),
        ToolCallDelta(index=0, id=first.id, name="weather", arguments='{"city":"Paris"}'),
        ToolCallDelta(index=1, id=second.id, name="weather", arguments='{"city":"Rome"}'),
    ]
    assert response.content == "Checking both."
    assert first.provider_data == {SIGNATURE: "sig-1"}
    assert (response.usage.input_tokens, response.usage.output_tokens) == (12, 48)
    assert response.finish_reason == "tool_calls"
    assert PARTS_KEY not in response.provider_data


def test_a_signature_streamed_on_an_empty_last_part_goes_back_on_the_text() -> None:
    provider, recorder = make(
        sse(
            chunk({"text": "The answer "}),
            chunk({"text": "is 4."}),
            chunk({"text": "", "thoughtSignature": "sig-end"}, finish="STOP"),
        ),
        answer({"text": "Yes."}),
    )
    chunks: list[Any] = []
    first = provider.request(ask("2+2?"), on_chunk=chunks.append)

    provider.request(
        ModelRequest(
            model=MODEL,
            messages=[
                Message(role="user", content="2+2?"),
                Message(role="assistant", content=first.content, provider_data=first.provider_data),
                Message(role="user", content="Sure?"),
            ],
        )
    )

    assert [c.text for c in chunks] == ["The answer ", "is 4."]
    assert recorder.bodies[1]["contents"][1] == {
        "role": "model",
        "parts": [{"text": "The answer is 4.", "thoughtSignature": "sig-end"}],
    }


def test_an_exception_from_on_chunk_stops_the_stream() -> None:
    provider, _ = make(sse(chunk({"text": "a"}), chunk({"text": "b"}), chunk(finish="STOP")))
    seen: list[Any] = []

    with pytest.raises(CancelledError):
        provider.request(ask(), on_chunk=cancelling(seen))

    assert seen == [TextDelta(text="a")]


def test_a_stream_that_ends_without_a_finish_reason_is_interrupted() -> None:
    provider, _ = make(sse(chunk({"text": "The answer"}), chunk({"text": " is"})))

    with pytest.raises(StreamInterruptedError) as caught:
        provider.request(ask(), on_chunk=ignore)

    assert caught.value.retryable


def test_an_error_event_mid_stream_maps_by_its_code() -> None:
    overloaded = {
        "error": {"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE"}
    }
    provider, _ = make(sse(chunk({"text": "Hi"}), overloaded))

    with pytest.raises(ServerError, match="overloaded") as caught:
        provider.request(ask(), on_chunk=ignore)

    assert caught.value.status == 503
    assert "UNAVAILABLE" in str(caught.value)


def test_an_error_status_on_a_stream_request_maps_too() -> None:
    provider, _ = make(error(503, "UNAVAILABLE", "The model is overloaded."))

    with pytest.raises(ServerError):
        provider.request(ask(), on_chunk=ignore)


def test_malformed_stream_data_is_an_invalid_response() -> None:
    provider, _ = make(event_stream("data: {oops\n\n"))

    with pytest.raises(InvalidResponseError):
        provider.request(ask(), on_chunk=ignore)


# -- errors ----------------------------------------------------------------------------------
RETRY_INFO = {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "1.5s"}


def test_429_takes_retry_after_from_the_retry_info_detail() -> None:
    provider, _ = make(error(429, "RESOURCE_EXHAUSTED", "Quota exceeded.", RETRY_INFO))

    with pytest.raises(RateLimitError) as caught:
        provider.request(ask())

    assert (caught.value.status, caught.value.retry_after) == (429, 1.5)
    assert caught.value.retryable


def test_a_retry_after_header_wins_over_the_retry_info_detail() -> None:
    provider, _ = make(
        error(429, "RESOURCE_EXHAUSTED", "Quota exceeded.", RETRY_INFO, **{"Retry-After": "7"})
    )

    with pytest.raises(RateLimitError) as caught:
        provider.request(ask())

    assert caught.value.retry_after == 7.0


API_KEY_INVALID = {
    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
    "reason": "API_KEY_INVALID",
    "domain": "googleapis.com",
}


@pytest.mark.parametrize(
    ("status", "rpc", "message", "details", "kind"),
    [
        (500, "INTERNAL", "An internal error has occurred.", [], ServerError),
        (503, "UNAVAILABLE", "The model is overloaded.", [], ServerError),
        (504, "DEADLINE_EXCEEDED", "Deadline exceeded.", [], ProviderTimeout),
        (403, "PERMISSION_DENIED", "Permission denied.", [], AuthenticationError),
        (401, "UNAUTHENTICATED", "Request had invalid credentials.", [], AuthenticationError),
        (400, "INVALID_ARGUMENT", "API key not valid.", [API_KEY_INVALID], AuthenticationError),
        (
            400,
            "INVALID_ARGUMENT",
            "The input token count (1200000) exceeds the maximum number of tokens allowed "
            "(1048576).",
            [],
            ContextLengthError,
        ),
        (400, "INVALID_ARGUMENT", "Invalid value at 'contents[0]'.", [], BadRequestError),
        (404, "NOT_FOUND", "models/gemini-9 is not found.", [], BadRequestError),
    ],
)
def test_error_statuses_map_to_the_taxonomy(status, rpc, message, details, kind) -> None:
    provider, _ = make(error(status, rpc, message, *details))

    with pytest.raises(kind) as caught:
        provider.request(ask())

    assert type(caught.value) is kind
    assert caught.value.status == status
    assert message in str(caught.value)


def test_malformed_json_is_an_invalid_response() -> None:
    provider, _ = make(httpx.Response(200, text="{not json"))

    with pytest.raises(InvalidResponseError):
        provider.request(ask())


def test_an_answer_without_candidates_is_an_invalid_response() -> None:
    provider, _ = make(httpx.Response(200, json={"usageMetadata": usage()}))

    with pytest.raises(InvalidResponseError, match="without candidates"):
        provider.request(ask())


def test_an_error_object_in_place_of_an_answer_maps_by_its_code() -> None:
    body = {"error": {"code": 429, "message": "Quota exceeded.", "status": "RESOURCE_EXHAUSTED"}}
    provider, _ = make(httpx.Response(200, json=body))

    with pytest.raises(RateLimitError) as caught:
        provider.request(ask())

    assert caught.value.status == 429


def test_a_read_timeout_is_a_provider_timeout() -> None:
    provider, _ = make(read_timeout)

    with pytest.raises(ProviderTimeout):
        provider.request(ask())


def test_the_key_never_appears_in_errors() -> None:
    provider, _ = make(error(400, "INVALID_ARGUMENT", f"API key {KEY} not valid.", API_KEY_INVALID))

    with pytest.raises(AuthenticationError) as caught:
        provider.request(ask())

    assert KEY not in shown(caught.value)
    assert "[redacted]" in shown(caught.value)


def test_the_key_never_appears_in_mid_stream_errors() -> None:
    leaked = {"error": {"code": 500, "message": f"failed for {KEY}", "status": "INTERNAL"}}
    provider, _ = make(sse(chunk({"text": "Hi"}), leaked))

    with pytest.raises(ServerError) as caught:
        provider.request(ask(), on_chunk=ignore)

    assert KEY not in shown(caught.value)


# -- end to end: persisted chats -------------------------------------------------------------
def without_empty_config(body: dict[str, Any]) -> dict[str, Any]:
    """A recorded body less RubyLLM's empty generationConfig (see test_gemini_replay)."""
    return {key: value for key, value in body.items() if value != {}}


@pytest.mark.django_db
def test_a_persisted_chat_runs_two_tool_rounds_over_recorded_traffic(replaying, user) -> None:
    cassette = replaying(
        "chat_function_calling_gemini_gemini-2_5-flash_can_use_tools_in_multi-turn_conversations",
        GeminiProvider,
    )
    chat = weather_chat(f"gemini:{MODEL}", user)

    first, second = ask_both(chat)

    assert first.content == "The weather in Berlin is 15°C, with wind at 10 km/h."
    assert second.content == "The weather in Paris is 15°C, with wind at 10 km/h."
    rows = list(chat.messages.order_by("id"))
    assert [m.role for m in rows] == ["user", "assistant", "tool", "assistant"] * 2
    calls = [c for m in rows for c in m.tool_calls.all()]
    assert [(c.name, c.arguments, c.state) for c in calls] == [
        ("weather", {"longitude": "13.4050", "latitude": "52.5200"}, "succeeded"),
        ("weather", {"latitude": "48.8575", "longitude": "2.3514"}, "succeeded"),
    ]
    assert all(c.call_id.startswith("call_") for c in calls)
    assert calls[0].provider_data[SIGNATURE].startswith("CrIEARFNMg")  # kept in the row
    assert calls[1].provider_data == {}
    assert rows[2].content == "Current weather at 52.5200, 13.4050: 15°C, Wind: 10 km/h"
    assert rows[7].provider_data[PARTS_KEY][0]["thoughtSignature"].startswith("CrUCARFNMg")
    usages = [
        (u.status, u.input_tokens, u.output_tokens, u.reasoning_tokens)
        for u in Usage.objects.order_by("id")
    ]
    assert usages == [
        ("succeeded", 103, 146, 116),
        ("succeeded", 190, 21, 0),
        ("succeeded", 238, 29, 0),
        ("succeeded", 323, 70, 49),
    ]
    # What the chat sent, signature included, is what RubyLLM sent for the same conversation.
    assert cassette.sent_bodies() == [
        without_empty_config(i.request_body) for i in cassette.interactions
    ]


@pytest.mark.django_db
def test_a_persisted_chat_streams_two_tool_rounds_over_recorded_traffic(replaying, user) -> None:
    cassette = replaying(
        "chat_function_calling_gemini_gemini-2_5-flash_can_use_tools_with_multi-turn_streaming_conversations",
        GeminiProvider,
    )
    chat = weather_chat(f"gemini:{MODEL}", user)

    (first, first_chunks), (second, second_chunks) = stream_both(chat)

    assert first.content == "The weather in Berlin is 15°C with a wind of 10 km/h."
    assert second.content == "The weather in Paris is 15°C with a wind of 10 km/h."
    for answer_row, chunks in ((first, first_chunks), (second, second_chunks)):
        streamed = "".join(c.text for c in chunks if isinstance(c, TextDelta))
        assert streamed == answer_row.content
        assert sum(isinstance(c, ToolCallDelta) for c in chunks) == 1
    rows = assert_two_complete_rounds(chat)
    assert [c.name for m in rows for c in m.tool_calls.all()] == ["weather", "weather"]
    assert Usage.objects.filter(status="succeeded").count() == 4
    assert cassette.sent_bodies() == [
        without_empty_config(i.request_body) for i in cassette.interactions
    ]


@pytest.mark.django_db
def test_invalid_arguments_become_an_error_result_the_model_sees(user) -> None:
    provider, recorder = make(
        answer(call_part("weather", '{"latitude": "52.52", ', signature="sig-x")),
        answer({"text": "Sorry."}),
    )
    with registered("gemini", provider):
        chat = weather_chat(f"gemini:{MODEL}", user)
        chat.ask("Weather in Berlin?")

    result = chat.messages.get(role="tool")
    assert result.is_error
    assert "not a JSON object" in result.content
    assert result.tool_call.state == "failed"
    sent = recorder.bodies[1]["contents"]
    assert sent[1]["parts"] == [
        {"functionCall": {"name": "weather", "args": {}}, "thoughtSignature": "sig-x"}
    ]
    assert sent[2]["parts"][0]["functionResponse"]["response"] == {
        "name": "weather",
        "error": result.content,
    }


@pytest.mark.django_db
@override_settings(AGENTLOOP={"MODEL_RETRIES": 1, "RETRY_BACKOFF": 0})
def test_a_chat_retries_a_rate_limit_after_the_retry_info_delay(user) -> None:
    retry_now = {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "0s"}
    provider, recorder = make(
        error(429, "RESOURCE_EXHAUSTED", "Quota exceeded.", retry_now),
        answer({"text": "Hello!"}),
    )
    with registered("gemini", provider):
        chat = Chat.objects.create(model=f"gemini:{MODEL}", owner=user)
        reply = chat.ask("Hi")

    assert reply.content == "Hello!"
    assert len(recorder.requests) == 2
    assert [(u.status, u.error.split(":")[0]) for u in Usage.objects.order_by("id")] == [
        ("failed", "RateLimitError"),
        ("succeeded", ""),
    ]

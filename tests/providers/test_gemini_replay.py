"""Replaying the recorded Gemini traffic (cassettes named ``*gemini_gemini-2_5-flash*``).

For every cassette but the batch one (test ids are the cassette names):
- the request: each recorded body is read back into our ModelRequest by a small reverse
  mapper of the wire format (contents, system instruction, function declarations in
  Gemini's schema dialect, tool config, generation config), the body our provider builds
  for it must equal the recorded one, and it must go to the recorded URL with the key in
  the ``x-goog-api-key`` header;
- the response: each recorded answer (JSON or SSE) goes through ``provider.request`` and
  must parse into the recorded text, function calls (with their thought signatures) and
  usage, or raise the right ProviderError;
- the round trip: in multi-turn cassettes, the answer we parsed, put back into the
  conversation, must give the model turn that the next recorded request sent.

Deliberate request differences (applied by ``expected_body`` / ``expected_model_turn``):
1. RubyLLM always sends ``"generationConfig": {}``; we leave an empty config out.
2. RubyLLM writes the function-calling mode in lower case (``"none"``, ``"any"``); we send
   the spelling the API reference documents (``"NONE"``, ``"ANY"``). The API read both.
3. With parallel calls Gemini signs only the first ``functionCall`` part; RubyLLM keeps one
   signature per message and copies it onto every call it sends back. We send each part
   back as it came (the signature on the first call only), as Google's thought-signature
   guide asks. This only shows in the round trip.
Everything else must be equal.
"""

from __future__ import annotations

import copy
import json
from contextlib import nullcontext
from typing import Any

import pytest

from agentloop.exceptions import AuthenticationError, ProviderError, RateLimitError
from agentloop.messages import (
    Message,
    ModelRequest,
    ModelResponse,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolDefinition,
)
from agentloop.providers.gemini import CALL_ID, PARTS_KEY, SIGNATURE, GeminiProvider
from tests.providers import cassettes
from tests.providers.cassettes import Interaction, cached, names, require_fixtures, sse_data
from tests.providers.wire import as_message

CASSETTES = [name for name in names("gemini_gemini-2_5-flash") if not name.startswith("batch_")]
BASE = "https://generativelanguage.googleapis.com/v1beta/models/"
#: the error each recorded error answer must raise
ERRORS: dict[int, type[ProviderError]] = {400: AuthenticationError, 429: RateLimitError}


def is_stream(interaction: Interaction) -> bool:
    return ":streamGenerateContent" in interaction.uri


def model_of(interaction: Interaction) -> str:
    assert interaction.uri.startswith(BASE), interaction.uri
    return interaction.uri[len(BASE) :].partition(":")[0]


# -- the reverse mapper: a recorded body -> our ModelRequest ---------------------------------
def json_schema(node: dict[str, Any]) -> dict[str, Any]:
    """Gemini's schema dialect -> JSON Schema, in the shapes pydantic writes."""
    node = dict(node)
    nullable = node.pop("nullable", False)
    result: dict[str, Any] = {}
    for key, value in node.items():
        if key == "type":
            result["type"] = value.lower()
        elif key == "properties":
            result["properties"] = {name: json_schema(sub) for name, sub in value.items()}
        elif key == "items":
            result["items"] = json_schema(value)
        elif key == "anyOf":
            result["anyOf"] = [json_schema(sub) for sub in value]
        else:
            result[key] = value
    if nullable:  # Optional[X] -> anyOf [X, null], the description outside
        outer = {key: result.pop(key) for key in ("description", "default") if key in result}
        return {"anyOf": [result, {"type": "null"}], **outer}
    return result


def _model_message(parts: list[dict[str, Any]], numbers: list[int]) -> Message:
    calls: list[ToolCall] = []
    texts: list[str] = []
    kept: list[dict[str, Any]] = []
    for part in parts:
        if "functionCall" in part:
            function_call = part["functionCall"]
            data = {}
            if "thoughtSignature" in part:
                data[SIGNATURE] = part["thoughtSignature"]
            if "id" in function_call:
                data[CALL_ID] = function_call["id"]
            numbers[0] += 1
            call = ToolCall(
                id=function_call.get("id") or f"call_{numbers[0]}",
                name=function_call["name"],
                arguments=function_call.get("args", {}),
                provider_data=data,
            )
            calls.append(call)
            kept.append({"functionCall": {"id": call.id}})
        else:
            if not part.get("thought"):
                texts.append(part["text"])
            kept.append(copy.deepcopy(part))
    signed = any(set(part) != {"text"} for part in kept if "functionCall" not in part)
    return Message(
        role="assistant",
        content="".join(texts),
        tool_calls=calls,
        provider_data={PARTS_KEY: kept} if signed else {},
    )


def to_messages(body: dict[str, Any]) -> list[Message]:
    """Contents (and the system instruction) -> our messages."""
    system = body.get("systemInstruction", {}).get("parts", [])
    messages = [Message(role="system", content=part["text"]) for part in system]
    unanswered: list[ToolCall] = []  # calls of the last model turn without a result yet
    numbers = [0]
    for content in body["contents"]:
        if content["role"] == "model":
            message = _model_message(content["parts"], numbers)
            messages.append(message)
            unanswered = list(message.tool_calls)
            continue
        assert content["role"] == "user", content["role"]
        for part in content["parts"]:
            if "functionResponse" not in part:
                messages.append(Message(role="user", content=part["text"]))
                continue
            result = part["functionResponse"]
            call = next(
                call
                for call in unanswered
                if call.name == result["name"] and result.get("id") in (None, call.id)
            )
            unanswered.remove(call)
            response = result["response"]
            error = "error" in response
            messages.append(
                Message(
                    role="tool",
                    content=response["error"]
                    if error
                    else "".join(item["text"] for item in response["content"]),
                    tool_call_id=call.id,
                    tool_name=result["name"],
                    is_error=error,
                )
            )
    return messages


def _tool_choice(body: dict[str, Any]) -> str | None:
    config = body.get("toolConfig", {}).get("functionCallingConfig")
    if config is None:
        return None
    mode = config["mode"].upper()
    if mode == "ANY":
        allowed = config.get("allowedFunctionNames")
        return allowed[0] if allowed else "required"
    return mode.lower()


def to_request(interaction: Interaction) -> ModelRequest:
    body = interaction.request_body
    config = body.get("generationConfig", {})
    schema = config.get("responseSchema")
    return ModelRequest(
        model=model_of(interaction),
        messages=to_messages(body),
        tools=[
            ToolDefinition(
                name=declaration["name"],
                description=declaration.get("description", ""),
                parameters=json_schema(declaration["parameters"])
                if "parameters" in declaration
                else declaration.get("parametersJsonSchema", {}),
            )
            for tools in body.get("tools", ())
            for declaration in tools["functionDeclarations"]
        ],
        tool_choice=_tool_choice(body),
        temperature=config.get("temperature"),
        max_output_tokens=config.get("maxOutputTokens"),
        output_schema=json_schema(schema) if schema else config.get("responseJsonSchema"),
        stream=is_stream(interaction),
    )


def expected_body(recorded: dict[str, Any]) -> dict[str, Any]:
    """The recorded body with deliberate differences 1 and 2 applied."""
    body = copy.deepcopy(recorded)
    if body.get("generationConfig") == {}:
        del body["generationConfig"]
    config = body.get("toolConfig", {}).get("functionCallingConfig")
    if config is not None:
        config["mode"] = config["mode"].upper()
    return body


# -- what a recorded answer says, read independently of the provider --------------------------
def recorded_chunks(interaction: Interaction) -> list[dict[str, Any]]:
    if interaction.is_stream:
        return sse_data(interaction.response_text)
    return [interaction.response_json()]


def recorded_parts(interaction: Interaction) -> list[dict[str, Any]]:
    return [
        part
        for chunk in recorded_chunks(interaction)
        for candidate in chunk.get("candidates", [])[:1]
        for part in candidate.get("content", {}).get("parts", [])
    ]


def recorded_text(interaction: Interaction) -> str:
    return "".join(
        part["text"]
        for part in recorded_parts(interaction)
        if "text" in part and not part.get("thought")
    )


def recorded_calls(interaction: Interaction) -> list[tuple[str, dict[str, Any], str | None]]:
    return [
        (part["functionCall"]["name"], part["functionCall"]["args"], part.get("thoughtSignature"))
        for part in recorded_parts(interaction)
        if "functionCall" in part
    ]


def recorded_usage(interaction: Interaction) -> dict[str, Any]:
    """The last usageMetadata (a stream repeats the running totals in every chunk)."""
    return [c["usageMetadata"] for c in recorded_chunks(interaction) if "usageMetadata" in c][-1]


# "gemini: N of M cassettes pass": every test of a cassette (request, URL, response, round
# trip) passed.
_pass_counts = cassettes.pass_counts(__name__, "Gemini replay", "gemini")


def test_recorded_traffic_is_present():
    require_fixtures()
    assert len(CASSETTES) >= 20, CASSETTES


# -- 1. the request -------------------------------------------------------------------------
@pytest.mark.parametrize("name", CASSETTES, ids=CASSETTES)
def test_request_body_matches_the_recording(name):
    provider = GeminiProvider(api_key="test-key")
    for interaction in cached(name).interactions:
        request = to_request(interaction)

        built = provider.build_body(request, stream=request.stream)

        assert built == expected_body(interaction.request_body)


@pytest.mark.parametrize("name", CASSETTES, ids=CASSETTES)
def test_request_goes_to_the_recorded_url_with_the_key_header(name):
    interactions = cached(name).interactions
    provider, replay = cassettes.serve(GeminiProvider, *interactions)
    for interaction in interactions:
        request = to_request(interaction)
        on_chunk = (lambda chunk: None) if request.stream else None
        with pytest.raises(ProviderError) if interaction.status >= 400 else nullcontext():
            provider.request(request, on_chunk=on_chunk)

    for sent, interaction in zip(replay.sent, interactions, strict=True):
        assert str(sent.url) == interaction.uri
        assert sent.headers["x-goog-api-key"] == "test-key"
        assert "key=" not in str(sent.url)
        assert "authorization" not in sent.headers
    assert replay.sent_bodies() == [expected_body(i.request_body) for i in interactions]


# -- 2. the response ------------------------------------------------------------------------
def replay_response(interaction: Interaction) -> tuple[ModelResponse, list[Any]]:
    return cassettes.replay(GeminiProvider, interaction, to_request(interaction))


@pytest.mark.parametrize("name", CASSETTES, ids=CASSETTES)
def test_recorded_response_parses(name):
    for interaction in cached(name).interactions:
        if interaction.status >= 400:
            with pytest.raises(ERRORS[interaction.status]) as raised:
                replay_response(interaction)
            assert raised.value.status == interaction.status
            assert "test-key" not in str(raised.value) + repr(raised.value)
            assert "test-key" not in (raised.value.body or "")
            if interaction.status == 429:  # RetryInfo {"retryDelay": "48s"}, no header
                assert raised.value.retry_after == 48.0
            continue

        response, chunks = replay_response(interaction)

        assert response.content == recorded_text(interaction)
        calls = [
            (call.name, call.arguments, call.provider_data.get(SIGNATURE))
            for call in response.tool_calls
        ]
        assert calls == recorded_calls(interaction)
        assert all(call.id.startswith("call_") for call in response.tool_calls)
        assert len({call.id for call in response.tool_calls}) == len(response.tool_calls)
        assert all(CALL_ID not in call.provider_data for call in response.tool_calls)
        usage = recorded_usage(interaction)
        thoughts = usage.get("thoughtsTokenCount", 0)
        assert response.usage.input_tokens == usage["promptTokenCount"]
        assert response.usage.output_tokens == usage["candidatesTokenCount"] + thoughts
        assert response.usage.reasoning_tokens == thoughts
        assert response.usage.cached_tokens == usage.get("cachedContentTokenCount", 0)
        assert (
            usage["promptTokenCount"] + usage["candidatesTokenCount"] + thoughts
            == usage["totalTokenCount"]
        )
        assert response.model == "gemini-2.5-flash"
        assert response.finish_reason == ("tool_calls" if response.tool_calls else "stop")
        assert response.provider_data["finish_reason"] == "STOP"
        assert response.parsed is None  # no Gemini cassette asks for structured output
        signed_text = [p for p in recorded_parts(interaction) if "text" in p and len(p) > 1]
        if signed_text:
            kept = response.provider_data[PARTS_KEY]
            assert [p.get("thoughtSignature") for p in kept if "text" in p] == [
                p.get("thoughtSignature") for p in signed_text
            ]
        else:
            assert PARTS_KEY not in response.provider_data
        if interaction.is_stream:
            assert_chunks_match(interaction, chunks, response)


def assert_chunks_match(interaction: Interaction, chunks: list[Any], response: ModelResponse):
    texts = [part["text"] for part in recorded_parts(interaction) if part.get("text")]
    assert [chunk.text for chunk in chunks if isinstance(chunk, TextDelta)] == texts
    deltas = [chunk for chunk in chunks if isinstance(chunk, ToolCallDelta)]
    assert [(d.index, d.id, d.name) for d in deltas] == [
        (index, call.id, call.name) for index, call in enumerate(response.tool_calls)
    ]
    assert [json.loads(d.arguments) for d in deltas] == [c.arguments for c in response.tool_calls]


# -- 3. the round trip: a parsed answer -> the next recorded request -----------------------------
def follow_ups(name: str) -> list[int]:
    """Indexes k whose answer the recorded request k+1 carries right after request k's."""
    interactions = cached(name).interactions
    found = []
    for k in cassettes.continued(interactions, "contents"):
        answer_turn = len(interactions[k].request_body["contents"])
        if interactions[k + 1].request_body["contents"][answer_turn]["role"] == "model":
            found.append(k)
    return found


ROUND_TRIPS = [name for name in CASSETTES if follow_ups(name)]


def expected_model_turn(sent: dict[str, Any], answer: Interaction) -> dict[str, Any]:
    """The model turn RubyLLM sent, less the signatures it copied (difference 3)."""
    turn = copy.deepcopy(sent)
    received = [part for part in recorded_parts(answer) if "functionCall" in part]
    calls = [part for part in turn["parts"] if "functionCall" in part]
    assert len(calls) == len(received)
    for part, original in zip(calls, received, strict=True):
        if "thoughtSignature" not in original:
            part.pop("thoughtSignature", None)
    return turn


@pytest.mark.parametrize("name", ROUND_TRIPS, ids=ROUND_TRIPS)
def test_parsed_answer_becomes_the_next_recorded_model_turn(name):
    interactions = cached(name).interactions
    for k in follow_ups(name):
        response, _ = replay_response(interactions[k])
        earlier = to_request(interactions[k])
        request = earlier.model_copy(update={"messages": [*earlier.messages, as_message(response)]})

        body = GeminiProvider(api_key="test-key").build_body(request, stream=False)

        sent = interactions[k + 1].request_body["contents"]
        position = len(interactions[k].request_body["contents"])
        assert body["contents"][:position] == sent[:position]
        assert body["contents"][position:] == [
            expected_model_turn(sent[position], interactions[k])
        ], f"interaction {k + 1}"


def test_a_copied_signature_is_the_only_round_trip_difference():
    """Difference 3 is real in exactly one cassette, and only on the second call."""
    name = "chat_function_calling_gemini_gemini-2_5-flash_can_use_parallel_tool_calls"
    first, second = cached(name).interactions[:2]
    received = [p for p in recorded_parts(first) if "functionCall" in p]
    sent = [p for p in second.request_body["contents"][1]["parts"] if "functionCall" in p]

    assert [("thoughtSignature" in p) for p in received] == [True, False]
    assert sent[1]["thoughtSignature"] == received[0]["thoughtSignature"]

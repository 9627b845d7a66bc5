"""Replaying the recorded Bedrock Converse traffic (``*bedrock*`` in ../shared/fixtures/
providers-cloud/, read in place; test ids are the cassette names).

For every cassette, and every interaction with Bedrock in it (the model-switch cassette
starts with an Anthropic call, replayed in test_anthropic_replay's style elsewhere):
- the request: each recorded body is read back into our ModelRequest by a small reverse
  mapper of the wire format below; the body our provider builds for it must equal the
  recorded one, go to the recorded path (``/model/{id}/converse`` or ``/converse-stream``)
  and be SigV4-signed for the ``bedrock`` service;
- the response: each recorded answer (JSON, or the binary event-stream frames exactly as
  received) goes through ``provider.request`` and must parse into the recorded text, tool
  calls, thinking with its signature, usage and stop reason, or raise the right error;
- the round trip: where the next recorded request carries the answer, the answer we parsed,
  put back into the conversation, must give the recorded assistant message.

Deliberate request differences (applied by ``expected_body``):
1. RubyLLM writes ``"strict": true`` inside a tool's JSON schema (``inputSchema.json``):
   not a JSON Schema keyword, and not how Converse asks for strict tools; we don't send it
   (as in the Anthropic replay).
2. ``with_caching`` puts a ``cachePoint`` at the end of the latest message as well as after
   the system prompt (RubyLLM: the system prompt only), as our Anthropic provider places
   its breakpoints (docs/caching.md): the conversation so far is read from the cache from
   the second call of a turn on. The recorded usage is unchanged by it.
3. The model id in the path is percent-encoded (``us.amazon.nova-2-lite-v1%3A0``), as
   AWS's SDKs send it, so the path botocore signs is the path the service reads; RubyLLM
   sent the ":" as it is. Paths are compared decoded.
Everything else must be equal.
"""

from __future__ import annotations

import copy
import json
from contextlib import nullcontext
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
from botocore.eventstream import EventStreamBuffer

from agentloop.exceptions import AuthenticationError, ContextLengthError, ProviderError
from agentloop.messages import (
    Caching,
    Message,
    ModelRequest,
    TextDelta,
    Thinking,
    ThinkingDelta,
    ToolCall,
    ToolCallDelta,
    ToolDefinition,
)
from agentloop.providers.bedrock import CONTENT_KEY, BedrockProvider
from agentloop.providers.thinking import REPLAY_PROVIDER
from tests.providers import cassettes
from tests.providers.aws import ACCESS_KEY, REGION
from tests.providers.cassettes import CLOUD, Interaction
from tests.providers.wire import as_message

# every test here replays the recordings: skipped without them (failing under CI=true)
cassettes.require_fixtures(CLOUD)
CASSETTES = cassettes.names("bedrock", CLOUD)
HOST = "bedrock-runtime.<AWS_REGION>.amazonaws.com"
ERRORS: dict[int, type[ProviderError]] = {403: AuthenticationError, 400: ContextLengthError}

_pass_counts = cassettes.pass_counts(__name__, "Bedrock Converse replay", "bedrock")

pytestmark = pytest.mark.usefixtures("aws_env")


def test_the_bedrock_cassettes_are_there() -> None:
    assert len(CASSETTES) == 26, CASSETTES


def interactions(name: str) -> list[Interaction]:
    found = [i for i in cassettes.load(name, CLOUD).interactions if HOST in i.uri]
    assert found, f"{name}: no Bedrock interaction"
    return found


def path_of(interaction: Interaction) -> str:
    return unquote(urlsplit(interaction.uri.replace("<AWS_REGION>", REGION)).path)


def is_stream(interaction: Interaction) -> bool:
    return path_of(interaction).endswith("/converse-stream")


# -- the reverse mapper: a recorded body -> our ModelRequest ---------------------------------
def _assistant(blocks: list[dict[str, Any]]) -> Message:
    calls = [
        ToolCall(
            id=b["toolUse"]["toolUseId"], name=b["toolUse"]["name"], arguments=b["toolUse"]["input"]
        )
        for b in blocks
        if "toolUse" in b
    ]
    text = "".join(b["text"] for b in blocks if "text" in b)
    data: dict[str, Any] = {}
    if any("reasoningContent" in b for b in blocks):
        kept = [
            {"toolUse": {"toolUseId": b["toolUse"]["toolUseId"]}} if "toolUse" in b else b
            for b in blocks
        ]
        data = {CONTENT_KEY: kept, REPLAY_PROVIDER: "bedrock"}
    return Message(role="assistant", content=text, tool_calls=calls, provider_data=data)


def to_messages(body: dict[str, Any]) -> list[Message]:
    messages = [
        Message(role="system", content=b["text"]) for b in body.get("system", []) if "text" in b
    ]
    names: dict[str, str] = {}
    for message in body["messages"]:
        blocks = [b for b in message["content"] if "cachePoint" not in b]
        if message["role"] == "assistant":
            answer = _assistant(blocks)
            names.update({call.id: call.name for call in answer.tool_calls})
            messages.append(answer)
            continue
        for block in blocks:
            if "toolResult" in block:
                result = block["toolResult"]
                messages.append(
                    Message(
                        role="tool",
                        content="".join(item["text"] for item in result["content"]),
                        tool_call_id=result["toolUseId"],
                        tool_name=names[result["toolUseId"]],
                        is_error=result.get("status") == "error",
                    )
                )
            else:
                messages.append(Message(role="user", content=block["text"]))
    return messages


def _thinking(body: dict[str, Any]) -> Thinking | None:
    fields = body.get("additionalModelRequestFields", {})
    if "reasoning_config" in fields:  # Claude: a budget
        return Thinking(budget_tokens=fields["reasoning_config"]["budget_tokens"])
    if "reasoningConfig" in fields:  # Nova 2: an effort
        return Thinking(effort=fields["reasoningConfig"]["maxReasoningEffort"])
    return None


def _cached(body: dict[str, Any]) -> bool:
    return any("cachePoint" in block for block in body.get("system", []))


def to_request(interaction: Interaction) -> ModelRequest:
    body = interaction.request_body
    model = path_of(interaction).split("/")[2]
    choice = body.get("toolConfig", {}).get("toolChoice")
    config = body.get("inferenceConfig", {})
    return ModelRequest(
        model=model,
        messages=to_messages(body),
        tools=[
            ToolDefinition(
                name=tool["toolSpec"]["name"],
                description=tool["toolSpec"].get("description", ""),
                parameters={
                    key: value
                    for key, value in tool["toolSpec"]["inputSchema"]["json"].items()
                    if key != "strict"  # difference 1
                },
            )
            for tool in body.get("toolConfig", {}).get("tools", [])
        ],
        tool_choice=None if choice is None else next(iter(choice)),
        temperature=config.get("temperature"),
        max_output_tokens=config.get("maxTokens"),
        thinking=_thinking(body),
        caching=Caching() if _cached(body) else None,
        stream=is_stream(interaction),
    )


def expected_body(recorded: dict[str, Any]) -> dict[str, Any]:
    """The recorded body with deliberate differences 1 and 2 applied."""
    body = copy.deepcopy(recorded)
    for tool in body.get("toolConfig", {}).get("tools", []):
        tool["toolSpec"]["inputSchema"]["json"].pop("strict", None)
    if _cached(body):
        body["messages"][-1]["content"].append({"cachePoint": {"type": "default"}})
    return body


# -- 1. the request ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", CASSETTES, ids=CASSETTES)
def test_request_body_matches_the_recording(name: str) -> None:
    provider = BedrockProvider()
    for interaction in interactions(name):
        request = to_request(interaction)

        built = provider.build_body(request, stream=request.stream)

        assert built == expected_body(interaction.request_body)


@pytest.mark.parametrize("name", CASSETTES, ids=CASSETTES)
def test_request_goes_to_the_recorded_path_signed(name: str) -> None:
    recorded = interactions(name)
    replay = cassettes.Cassette(name, list(recorded))
    provider = BedrockProvider(transport=replay.transport())
    for interaction in recorded:
        request = to_request(interaction)
        on_chunk = (lambda chunk: None) if request.stream else None
        with pytest.raises(ProviderError) if interaction.status >= 400 else nullcontext():
            provider.request(request, on_chunk=on_chunk)

    for sent, interaction in zip(replay.sent, recorded, strict=True):
        assert sent.url.host == f"bedrock-runtime.{REGION}.amazonaws.com"
        assert unquote(sent.url.path) == path_of(interaction)
        assert sent.url.raw_path.decode().count(":") == 0  # difference 3: encoded
        authorization = sent.headers["authorization"]
        assert authorization.startswith(
            f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/{sent.headers['x-amz-date'][:8]}/"
            f"{REGION}/bedrock/aws4_request, SignedHeaders="
        )
        assert sent.headers["content-type"] == "application/json"
    assert replay.sent_bodies() == [expected_body(i.request_body) for i in recorded]


# -- 2. the response --------------------------------------------------------------------------
def recorded_events(interaction: Interaction) -> list[tuple[str, dict[str, Any]]]:
    """The recorded stream's events, read with botocore's parser (the test's own reading)."""
    buffer = EventStreamBuffer()
    buffer.add_data(interaction.response_bytes)
    return [(m.headers[":event-type"], json.loads(m.payload)) for m in buffer]


def recorded_answer(interaction: Interaction) -> dict[str, Any]:
    """Text, calls, thinking (with signatures), usage and stop reason the recording says."""
    if not is_stream(interaction):
        data = json.loads(interaction.response_bytes or interaction.response_text)
        blocks = data["output"]["message"]["content"]
        reasoning = [
            b["reasoningContent"]["reasoningText"] for b in blocks if "reasoningContent" in b
        ]
        return {
            "text": "".join(b["text"] for b in blocks if "text" in b),
            "calls": [
                (b["toolUse"]["toolUseId"], b["toolUse"]["name"], b["toolUse"]["input"])
                for b in blocks
                if "toolUse" in b
            ],
            "thinking": [r.get("text") for r in reasoning],
            "signatures": [r.get("signature") for r in reasoning],
            "usage": data["usage"],
            "stop": data["stopReason"],
        }
    text, thinking, signature, usage, stop = "", "", None, {}, None
    calls: dict[int, list[Any]] = {}
    for kind, data in recorded_events(interaction):
        if kind == "contentBlockStart" and "toolUse" in data["start"]:
            tool = data["start"]["toolUse"]
            calls[data["contentBlockIndex"]] = [tool["toolUseId"], tool["name"], ""]
        elif kind == "contentBlockDelta":
            delta = data["delta"]
            text += delta.get("text", "")
            if "toolUse" in delta:
                calls[data["contentBlockIndex"]][2] += delta["toolUse"]["input"]
            reasoning = delta.get("reasoningContent", {})
            thinking += reasoning.get("text", "")
            signature = reasoning.get("signature", signature)
        elif kind == "messageStop":
            stop = data["stopReason"]
        elif kind == "metadata":
            usage = data["usage"]
    return {
        "text": text,
        "calls": [(i, n, json.loads(a) if a else {}) for i, n, a in calls.values()],
        "thinking": [thinking] if thinking else [],
        "signatures": [signature] if thinking else [],
        "usage": usage,
        "stop": stop,
    }


FINISH = {"end_turn": "stop", "tool_use": "tool_calls"}


@pytest.mark.parametrize("name", CASSETTES, ids=CASSETTES)
def test_recorded_response_parses(name: str) -> None:
    for interaction in interactions(name):
        request = to_request(interaction)
        if interaction.status >= 400:
            with pytest.raises(ERRORS[interaction.status]) as raised:
                cassettes.replay(_Signed, interaction, request)
            assert raised.value.status == interaction.status
            assert "Exception" in str(raised.value)  # the exception's name is said
            continue

        response, chunks = cassettes.replay(_Signed, interaction, request)

        expected = recorded_answer(interaction)
        assert response.content == expected["text"]
        assert [(c.id, c.name, c.arguments) for c in response.tool_calls] == expected["calls"]
        assert response.thinking == "\n\n".join(expected["thinking"])
        kept = response.provider_data.get(CONTENT_KEY, [])
        signatures = [
            b["reasoningContent"]["reasoningText"].get("signature")
            for b in kept
            if "reasoningContent" in b
        ]
        assert signatures == expected["signatures"]
        assert (CONTENT_KEY in response.provider_data) is bool(expected["thinking"])
        usage = expected["usage"]
        read, written = usage.get("cacheReadInputTokens", 0), usage.get("cacheWriteInputTokens", 0)
        assert response.usage.input_tokens == usage["inputTokens"] + read + written
        assert response.usage.output_tokens == usage["outputTokens"]
        assert (response.usage.cache_read_tokens, response.usage.cache_write_tokens) == (
            read,
            written,
        )
        assert response.usage.input_tokens + response.usage.output_tokens == usage["totalTokens"]
        assert response.finish_reason == FINISH[expected["stop"]]
        assert response.provider_data["stop_reason"] == expected["stop"]
        if request.stream:
            assert "".join(c.text for c in chunks if isinstance(c, TextDelta)) == expected["text"]
            assert "".join(c.text for c in chunks if isinstance(c, ThinkingDelta)) == "".join(
                expected["thinking"]
            )
            assert [c.id for c in chunks if isinstance(c, ToolCallDelta) and c.id] == [
                c[0] for c in expected["calls"]
            ]


class _Signed(BedrockProvider):
    """BedrockProvider as ``cassettes.replay`` makes it (an ``api_key`` it must not use)."""

    def __init__(self, *, api_key: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)


# -- 3. the round trip: a parsed answer -> the next recorded request ------------------------------
def follow_ups(name: str) -> list[int]:
    return cassettes.continued(interactions(name), "messages")


ROUND_TRIPS = [name for name in CASSETTES if follow_ups(name)]


@pytest.mark.parametrize("name", ROUND_TRIPS, ids=ROUND_TRIPS)
def test_parsed_answer_becomes_the_next_recorded_assistant_message(name: str) -> None:
    recorded = interactions(name)
    for k in follow_ups(name):
        response, _ = cassettes.replay(_Signed, recorded[k], to_request(recorded[k]))
        earlier = to_request(recorded[k])
        request = earlier.model_copy(update={"messages": [*earlier.messages, as_message(response)]})

        body = BedrockProvider().build_body(request, stream=False)

        position = len(recorded[k].request_body["messages"])
        sent = recorded[k + 1].request_body["messages"]
        assert body["messages"][position] == sent[position], f"interaction {k + 1}"

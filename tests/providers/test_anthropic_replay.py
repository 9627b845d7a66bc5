"""Replays of the recorded Anthropic Messages traffic (../shared/fixtures/providers/).

For every ``anthropic_claude-haiku-4-5`` cassette (batches aside):

* the request: each recorded body is turned back into our ModelRequest (a small reverse
  mapper below), the provider builds a body from it, and the two must be equal;
* the response: the recorded answers are served through ``httpx.MockTransport`` and
  must parse into the recorded text, tool calls, usage, finish reason and structured
  output; recorded error statuses must raise the matching ProviderError.

Test ids are the cassette names; the terminal summary says "anthropic: N of M cassettes
pass" (a cassette passes when both its request and its response test pass).

Deliberate difference, applied by ``expected_body``: RubyLLM puts ``"strict": true``
*inside* ``input_schema``. That is neither a JSON Schema keyword nor the Messages API's
tool-level ``strict`` flag (the API ignored it), so we don't send it; tools with
``strict: true`` at the tool level are opt-in (``strict_tools``), see test_anthropic.py.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from agentloop.exceptions import AuthenticationError, ContextLengthError, ProviderError
from agentloop.messages import Message, ModelRequest, TextDelta, ToolCall, ToolCallDelta
from agentloop.messages import ToolDefinition as Definition
from agentloop.providers.anthropic import AnthropicProvider
from tests.providers import cassettes

# every test here replays the recordings: skipped without them (failing under CI=true)
cassettes.require_fixtures()
CASSETTES = [
    name for name in cassettes.names("anthropic_claude-haiku-4-5") if not name.startswith("batch_")
]
ERRORS: dict[int, type[ProviderError]] = {401: AuthenticationError, 400: ContextLengthError}

_pass_counts = cassettes.pass_counts(__name__, "Anthropic Messages replay", "anthropic")


def test_the_anthropic_cassettes_are_there() -> None:
    assert len(CASSETTES) >= 25, CASSETTES


# -- the reverse mapper: a recorded body -> our ModelRequest ---------------------------------
def _text(blocks: Any) -> str:
    if isinstance(blocks, str):
        return blocks
    return "".join(block["text"] for block in blocks or [] if block["type"] == "text")


def _messages(body: dict[str, Any]) -> list[Message]:
    messages = [Message(role="system", content=block["text"]) for block in body.get("system", [])]
    names: dict[str, str] = {}
    for message in body["messages"]:
        blocks = message["content"]
        if message["role"] == "assistant":
            calls = [
                ToolCall(id=block["id"], name=block["name"], arguments=block["input"])
                for block in blocks
                if block["type"] == "tool_use"
            ]
            names.update({call.id: call.name for call in calls})
            messages.append(Message(role="assistant", content=_text(blocks), tool_calls=calls))
            continue
        for block in blocks:
            if block["type"] == "tool_result":
                messages.append(
                    Message(
                        role="tool",
                        content=_text(block.get("content")),
                        tool_call_id=block["tool_use_id"],
                        tool_name=names[block["tool_use_id"]],
                        is_error=block.get("is_error", False),
                    )
                )
            else:
                messages.append(Message(role="user", content=block["text"]))
    return messages


def _tool_choice(body: dict[str, Any]) -> tuple[str | None, bool | None]:
    choice = body.get("tool_choice")
    if choice is None:
        return None, None
    parallel = False if choice.get("disable_parallel_tool_use") else None
    kind = choice["type"]
    return {"any": "required", "tool": choice.get("name")}.get(kind, kind), parallel


def request_from_body(body: dict[str, Any]) -> ModelRequest:
    """Our request for the conversation a recorded body carries.

    ``max_tokens`` is deliberately not carried over: the recordings' 64000 must come from
    our own default for claude-haiku-4-5 (the model's maximum output).
    """
    choice, parallel = _tool_choice(body)
    schema = body.get("output_config", {}).get("format", {}).get("schema")
    return ModelRequest(
        model=body["model"],
        messages=_messages(body),
        tools=[
            Definition(
                name=tool["name"],
                description=tool.get("description", ""),
                # a tool's JSON schema; RubyLLM's in-schema "strict" is not part of it
                parameters={k: v for k, v in tool["input_schema"].items() if k != "strict"},
            )
            for tool in body.get("tools", [])
        ],
        tool_choice=choice,
        parallel_tool_calls=parallel,
        temperature=body.get("temperature"),
        output_schema=schema,
        stream=body.get("stream", False),
    )


def expected_body(recorded: dict[str, Any]) -> dict[str, Any]:
    """The recorded body less RubyLLM's in-schema "strict" key (see the module docstring)."""
    body = copy.deepcopy(recorded)
    for tool in body.get("tools", []):
        tool["input_schema"].pop("strict", None)
    return body


def interactions(name: str) -> list[cassettes.Interaction]:
    return [i for i in cassettes.load(name).interactions if i.uri.endswith("/v1/messages")]


# -- 1. the request we build is the recorded one ---------------------------------------------
@pytest.mark.parametrize("name", CASSETTES, ids=CASSETTES)
def test_request_matches_recording(name: str) -> None:
    provider = AnthropicProvider(api_key="test-key")
    recorded = interactions(name)
    assert recorded

    for interaction in recorded:
        body = interaction.request_body
        request = request_from_body(body)
        built = provider.build_body(request, stream=body["stream"])

        assert built == expected_body(body)


# -- 2. the recorded answers parse into the right response -----------------------------------
def _expected_from_stream(text: str) -> dict[str, Any]:
    content, usage, stop = [], {}, None
    calls: dict[int, dict[str, Any]] = {}
    for payload in cassettes.sse_data(text):
        kind = payload["type"]
        if kind == "message_start":
            usage.update(payload["message"]["usage"])
        elif kind == "content_block_start" and payload["content_block"]["type"] == "tool_use":
            block = payload["content_block"]
            calls[payload["index"]] = {"id": block["id"], "name": block["name"], "json": ""}
        elif kind == "content_block_delta":
            delta = payload["delta"]
            if delta["type"] == "text_delta":
                content.append(delta["text"])
            elif delta["type"] == "input_json_delta":
                calls[payload["index"]]["json"] += delta["partial_json"]
        elif kind == "message_delta":
            stop = payload["delta"]["stop_reason"]
            usage.update(payload["usage"])
    return {
        "text": "".join(content),
        "calls": [
            (call["id"], call["name"], json.loads(call["json"]) if call["json"] else {})
            for _, call in sorted(calls.items())
        ],
        "usage": usage,
        "stop_reason": stop,
    }


def _expected_from_json(data: dict[str, Any]) -> dict[str, Any]:
    return {
        "text": "".join(b["text"] for b in data["content"] if b["type"] == "text"),
        "calls": [
            (b["id"], b["name"], b["input"]) for b in data["content"] if b["type"] == "tool_use"
        ],
        "usage": data["usage"],
        "stop_reason": data["stop_reason"],
    }


FINISH = {"end_turn": "stop", "tool_use": "tool_calls", "max_tokens": "length"}


@pytest.mark.parametrize("name", CASSETTES, ids=CASSETTES)
def test_response_parses_like_the_recording(name: str) -> None:
    cassette = cassettes.load(name)
    provider = AnthropicProvider(api_key="test-key", transport=cassette.transport())

    for interaction in interactions(name):
        request = request_from_body(interaction.request_body)
        chunks: list[Any] = []
        on_chunk = chunks.append if interaction.request_body["stream"] else None

        if interaction.status >= 400:
            with pytest.raises(ERRORS[interaction.status]) as caught:
                provider.request(request, on_chunk=on_chunk)
            assert caught.value.status == interaction.status
            assert "test-key" not in repr(caught.value) + str(caught.value.body)
            continue

        response = provider.request(request, on_chunk=on_chunk)

        if interaction.is_stream:
            expected = _expected_from_stream(interaction.response_text)
            streamed = "".join(c.text for c in chunks if isinstance(c, TextDelta))
            assert streamed == expected["text"]
            assert [c.id for c in chunks if isinstance(c, ToolCallDelta) and c.id] == [
                call[0] for call in expected["calls"]
            ]
        else:
            expected = _expected_from_json(interaction.response_json())
        assert response.content == expected["text"]
        assert [(c.id, c.name, c.arguments) for c in response.tool_calls] == expected["calls"]
        assert all(c.provider_data == {} for c in response.tool_calls)
        usage = expected["usage"]
        assert response.usage.input_tokens == usage["input_tokens"] + usage.get(
            "cache_read_input_tokens", 0
        ) + usage.get("cache_creation_input_tokens", 0)
        assert response.usage.output_tokens == usage["output_tokens"]
        assert response.usage.cached_tokens == usage.get("cache_read_input_tokens", 0)
        assert response.finish_reason == FINISH[expected["stop_reason"]]
        assert response.model == "claude-haiku-4-5-20251001"
        if request.output_schema is not None:
            assert response.parsed == json.loads(expected["text"])
        else:
            assert response.parsed is None

    sent = cassette.sent_bodies()
    assert sent == [expected_body(i.request_body) for i in interactions(name)]

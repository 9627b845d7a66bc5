"""The OpenAI Responses wire format read back, for the replays of OpenAI
(test_openai_responses_replay.py) and of Azure AI Foundry's Responses deployments
(test_azure_replay.py).

- the reverse mapper: a recorded body -> our ModelRequest (input items -> messages, with
  reasoning kept in the assistant message's provider_data), the recorded tool parameters
  less RubyLLM's leaked ``strict`` flag, and when we ask for strict mode;
- what a recorded answer (JSON or SSE) says, read independently of the provider, and
  whether the streamed chunks match it;
- the round trip: a recorded next request with our parsed answer in place of the recorded one.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from agentloop.messages import (
    Message,
    ModelRequest,
    ModelResponse,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolDefinition,
)
from agentloop.providers.openai_responses import OUTPUT_KEY
from tests.providers.cassettes import Interaction, sse_data


# -- the reverse mapper: a recorded body -> our ModelRequest ---------------------------------
def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content)


def to_messages(items: list[dict[str, Any]]) -> list[Message]:
    """Input items -> messages; reasoning rides on its assistant message's provider_data."""
    messages: list[Message] = []
    names_by_call: dict[str, str] = {}
    answer: Message | None = None  # the assistant message being rebuilt
    for item in items:
        role, kind = item.get("role"), item.get("type")
        if role == "user":
            messages.append(Message(role="user", content=_text(item["content"])))
            answer = None
        elif role == "assistant" or kind in ("reasoning", "function_call"):
            if answer is None:
                answer = Message(role="assistant")
                messages.append(answer)
            output = answer.provider_data.setdefault(OUTPUT_KEY, [])
            if role == "assistant":
                answer.content += _text(item["content"])
                output.append({"type": "message"})
            elif kind == "reasoning":
                output.append(copy.deepcopy(item))
            else:
                call = ToolCall(
                    id=item["call_id"], name=item["name"], arguments=json.loads(item["arguments"])
                )
                answer.tool_calls.append(call)
                names_by_call[call.id] = call.name
                output.append({"type": "function_call", "call_id": call.id})
        elif kind == "function_call_output":
            messages.append(
                Message(
                    role="tool",
                    content=item["output"],
                    tool_call_id=item["call_id"],
                    tool_name=names_by_call.get(item["call_id"]),
                )
            )
            answer = None
        else:
            raise AssertionError(f"input item the reverse mapper doesn't know: {item}")
    return messages


def recorded_parameters(tool: dict[str, Any]) -> dict[str, Any]:
    # RubyLLM leaks its own "strict": true flag into the parameter schema; it is not a JSON
    # Schema keyword and we never send it (deliberate difference 1).
    return {key: value for key, value in tool["parameters"].items() if key != "strict"}


def to_request(body: dict[str, Any]) -> ModelRequest:
    messages = to_messages(body["input"])
    if body.get("instructions"):
        messages.insert(0, Message(role="system", content=body["instructions"]))
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        choice = choice["name"]
    schema = None
    text_format = (body.get("text") or {}).get("format")
    if text_format and text_format.get("type") == "json_schema":
        schema = dict(text_format["schema"])
        if text_format.get("name") and text_format["name"] != "response":
            schema["title"] = text_format["name"]  # how a named schema reaches us
    return ModelRequest(
        model=body["model"],
        messages=messages,
        tools=[
            ToolDefinition(
                name=tool["name"],
                description=tool.get("description", ""),
                parameters=recorded_parameters(tool),
            )
            for tool in body.get("tools", ())
        ],
        tool_choice=choice,
        parallel_tool_calls=body.get("parallel_tool_calls"),
        temperature=body.get("temperature"),
        max_output_tokens=body.get("max_output_tokens"),
        output_schema=schema,
        stream=bool(body.get("stream")),
    )


def expected_strict(parameters: dict[str, Any]) -> bool:
    """Strict mode fits when every object requires all its properties and allows no more."""

    def fits(node: Any) -> bool:
        if not isinstance(node, dict):
            return True
        if node.get("type") == "object":
            properties = node.get("properties", {})
            if set(node.get("required", [])) != set(properties):
                return False
            if node.get("additionalProperties", False) is not False:
                return False
        children = list(node.get("properties", {}).values()) + list(node.get("anyOf", []))
        if "items" in node:
            children.append(node["items"])
        return all(fits(child) for child in children)

    return fits(parameters)


# -- what a recorded answer says, read independently of the provider --------------------------
def recorded_answer(interaction: Interaction) -> dict[str, Any]:
    """The final response object of a recorded 200 answer."""
    if not interaction.is_stream:
        return interaction.response_json()
    terminal = [e for e in sse_data(interaction.response_text) if e["type"] == "response.completed"]
    assert len(terminal) == 1
    return terminal[0]["response"]


def recorded_text(response: dict[str, Any]) -> str:
    return "".join(
        part["text"]
        for item in response["output"]
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    )


def recorded_calls(response: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (item["call_id"], item["name"], json.loads(item["arguments"]))
        for item in response["output"]
        if item["type"] == "function_call"
    ]


def assert_chunks_match(interaction: Interaction, chunks: list[Any], response: ModelResponse):
    events = sse_data(interaction.response_text)
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    text_chunks = [chunk.text for chunk in chunks if isinstance(chunk, TextDelta)]
    assert text_chunks == deltas
    assert "".join(text_chunks) == response.content
    arguments: dict[int, str] = {}
    ids: dict[int, str] = {}
    for chunk in chunks:
        if isinstance(chunk, ToolCallDelta):
            arguments[chunk.index] = arguments.get(chunk.index, "") + chunk.arguments
            if chunk.id:
                ids[chunk.index] = chunk.id
    assert [ids[index] for index in sorted(ids)] == [call.id for call in response.tool_calls]
    assert [json.loads(arguments[index]) for index in sorted(arguments)] == [
        call.arguments for call in response.tool_calls
    ]


# -- the round trip: a parsed answer -> the next recorded request -----------------------------
def with_parsed_answer(
    before: dict[str, Any], after: dict[str, Any], answer: Message
) -> ModelRequest:
    """The recorded request ``after`` with our parsed ``answer`` in place of the recorded
    answer items (reasoning, text, calls) that follow ``before``'s input."""
    tail = after["input"][len(before["input"]) :]
    answer_items = 0
    while answer_items < len(tail) and (
        tail[answer_items].get("role") == "assistant"
        or tail[answer_items].get("type") in ("reasoning", "function_call")
    ):
        answer_items += 1
    assert answer_items > 0, "the next request doesn't start with the answer"
    request = to_request(after)
    messages = [
        *[m for m in request.messages if m.role == "system"],
        *to_messages(before["input"]),
        answer,
        *to_messages(tail[answer_items:]),
    ]
    return request.model_copy(update={"messages": messages})

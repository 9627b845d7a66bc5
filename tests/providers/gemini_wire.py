"""Gemini's wire format read back, for the replays of the Gemini API and Vertex AI (one
mapping, two transports: both replay modules use this).

- the reverse mapper: a recorded ``generateContent`` body -> our ModelRequest (contents, the
  system instruction, function declarations in Gemini's schema dialect, tool config,
  generation and thinking config), and the recorded body less RubyLLM's quirks;
- what a recorded answer (JSON or SSE) says, read independently of the provider;
- the round trip: which recorded requests carry the answer before them.
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
    Thinking,
    ThinkingDelta,
    ToolCall,
    ToolCallDelta,
    ToolDefinition,
)
from agentloop.providers.gemini import CALL_ID, PARTS_KEY, SIGNATURE
from tests.providers import cassettes
from tests.providers.cassettes import Interaction, sse_data


def is_stream(interaction: Interaction) -> bool:
    return ":streamGenerateContent" in interaction.uri


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


def _thinking(config: dict[str, Any]) -> Thinking | None:
    thinking = config.get("thinkingConfig")
    if thinking is None:
        return None
    if "thinkingLevel" in thinking:
        return Thinking(effort=thinking["thinkingLevel"])
    budget = thinking.get("thinkingBudget", 0)
    return Thinking(budget_tokens=budget) if budget else Thinking()


def to_request(interaction: Interaction, model: str) -> ModelRequest:
    """The ModelRequest for ``model`` whose body is the one ``interaction`` recorded."""
    body = interaction.request_body
    config = body.get("generationConfig", {})
    schema = config.get("responseSchema")
    return ModelRequest(
        model=model,
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
        thinking=_thinking(config),
        stream=is_stream(interaction),
    )


def expected_body(recorded: dict[str, Any]) -> dict[str, Any]:
    """The recorded body less RubyLLM's empty ``generationConfig``, with the documented
    upper-case function-calling mode (the replay modules' differences 1 and 2)."""
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


def assert_chunks_match(interaction: Interaction, chunks: list[Any], response: ModelResponse):
    """The chunks streamed are the recorded parts: answer text, thoughts, calls in order."""
    parts = [part for part in recorded_parts(interaction) if part.get("text")]
    texts = [part["text"] for part in parts if not part.get("thought")]
    thoughts = [part["text"] for part in parts if part.get("thought")]
    assert [chunk.text for chunk in chunks if isinstance(chunk, TextDelta)] == texts
    assert [chunk.text for chunk in chunks if isinstance(chunk, ThinkingDelta)] == thoughts
    deltas = [chunk for chunk in chunks if isinstance(chunk, ToolCallDelta)]
    assert [(d.index, d.id, d.name) for d in deltas] == [
        (index, call.id, call.name) for index, call in enumerate(response.tool_calls)
    ]
    assert [json.loads(d.arguments) for d in deltas] == [c.arguments for c in response.tool_calls]


# -- the round trip: a parsed answer -> the next recorded request --------------------------------
def follow_ups(interactions: list[Interaction]) -> list[int]:
    """Indexes k whose answer the recorded request k+1 carries right after request k's."""
    found = []
    for k in cassettes.continued(interactions, "contents"):
        answer_turn = len(interactions[k].request_body["contents"])
        if interactions[k + 1].request_body["contents"][answer_turn]["role"] == "model":
            found.append(k)
    return found


def expected_model_turn(sent: dict[str, Any], answer: Interaction) -> dict[str, Any]:
    """The model turn RubyLLM sent, less the signatures it copied onto parallel calls
    (Gemini signs the first call only; we send each part back as it came)."""
    turn = copy.deepcopy(sent)
    received = [part for part in recorded_parts(answer) if "functionCall" in part]
    calls = [part for part in turn["parts"] if "functionCall" in part]
    assert len(calls) == len(received)
    for part, original in zip(calls, received, strict=True):
        if "thoughtSignature" not in original:
            part.pop("thoughtSignature", None)
    return turn

"""The Chat Completions wire format read back, for the replays of OpenRouter and Ollama
(test_openai_chat_replay.py) and of Azure AI Foundry's Chat Completions deployments
(test_azure_replay.py).

- the reverse mapper: a recorded body -> our ModelRequest (messages with their text and
  attachments, tools, tool choice, structured output, provider options);
- the recorded body and ours less the deliberate differences (``comparable_recorded``,
  ``comparable_ours``);
- what a recorded answer (JSON or SSE) says, read independently of the provider, and the
  usage it should parse into.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from agentloop.messages import (
    Attachment,
    Message,
    ModelRequest,
    TokenUsage,
    ToolCall,
    ToolDefinition,
)
from agentloop.providers.openai import OpenAIProvider
from tests.providers.cassettes import Interaction, sse_data

#: body fields the reverse mapper understands; any other field is a provider option.
WIRE_FIELDS = {
    "model",
    "messages",
    "stream",
    "stream_options",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "temperature",
    "max_tokens",
    "max_completion_tokens",
    "response_format",
}


# -- the reverse mapper: a recorded body back into our ModelRequest -----------------------------
def _content(content: Any, gaps: list[str]) -> tuple[str, list[Attachment]]:
    """A message's text and attachments (image and file parts); other parts are gaps."""
    if isinstance(content, str):
        return content, []
    attachments = []
    for part in content:
        if part["type"] == "image_url":
            image = part["image_url"]
            attachments.append(Attachment(url=image["url"], detail=image.get("detail")))
        elif part["type"] == "file":
            file = part["file"]
            attachments.append(Attachment(url=file["file_data"], name=file.get("filename")))
    kinds = sorted({part["type"] for part in content} - {"text", "image_url", "file"})
    if kinds:
        gaps.append(f"content parts of type {', '.join(kinds)}")
    return "".join(part["text"] for part in content if part["type"] == "text"), attachments


def to_request(body: dict[str, Any], gaps: list[str]) -> ModelRequest:
    """The ModelRequest our provider should turn into ``body``.

    What a Message can't hold (content parts other than text, images and files) is left
    out and described in ``gaps``.
    """
    messages: list[Message] = []
    tool_names: dict[str, str] = {}
    for item in body["messages"]:
        role = item["role"]
        if role in ("system", "developer"):
            messages.append(Message(role="system", content=item["content"]))
        elif role == "user":
            text, attachments = _content(item["content"], gaps)
            messages.append(Message(role="user", content=text, attachments=attachments))
        elif role == "assistant":
            calls = [
                ToolCall(
                    id=call["id"],
                    name=call["function"]["name"],
                    arguments=json.loads(call["function"]["arguments"] or "{}"),
                )
                for call in item.get("tool_calls") or []
            ]
            tool_names.update({call.id: call.name for call in calls})
            thinking = item.get("reasoning")
            messages.append(
                Message(
                    role="assistant",
                    content=item.get("content") or "",
                    tool_calls=calls,
                    provider_data={"reasoning": thinking} if thinking else {},
                )
            )
        elif role == "tool":
            text, attachments = _content(item["content"], gaps)
            messages.append(
                Message(
                    role="tool",
                    content=text,
                    attachments=attachments,
                    tool_call_id=item["tool_call_id"],
                    tool_name=tool_names.get(item["tool_call_id"]),
                )
            )
        else:
            raise AssertionError(f"unexpected role {role!r}")
    tools = [
        ToolDefinition(
            name=tool["function"]["name"],
            description=tool["function"].get("description", ""),
            parameters={
                key: value
                for key, value in tool["function"].get("parameters", {}).items()
                if key != "strict"  # see comparable_recorded
            },
        )
        for tool in body.get("tools", [])
    ]
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        choice = choice["function"]["name"]
    schema = None
    if "response_format" in body:
        assert body["response_format"]["type"] == "json_schema"
        json_schema = body["response_format"]["json_schema"]
        schema = dict(json_schema["schema"])
        if json_schema["name"] != "response":
            schema["title"] = json_schema["name"]  # a pydantic model's schema carries its name
    parallel = body.get("parallel_tool_calls")
    return ModelRequest(
        model=body["model"],
        messages=messages,
        tools=tools,
        tool_choice=choice,
        parallel_tool_calls=parallel,
        temperature=body.get("temperature"),
        max_output_tokens=body.get("max_completion_tokens", body.get("max_tokens")),
        output_schema=schema,
        provider_options={key: value for key, value in body.items() if key not in WIRE_FIELDS},
        stream=bool(body.get("stream")),
    )


def comparable_recorded(body: dict[str, Any]) -> dict[str, Any]:
    """The recorded body minus what we deliberately send differently (each with its reason)."""
    body = copy.deepcopy(body)
    for tool in body.get("tools", []):
        # RubyLLM writes "strict": true INSIDE the parameters schema, where it is an unknown
        # schema keyword; the API reads strictness from function.strict, which we send (and
        # assert) instead, when the schema can be strict without changing its meaning.
        tool["function"].get("parameters", {}).pop("strict", None)
    for message in body["messages"]:
        # RubyLLM sends an assistant's thinking twice, as "reasoning" and "reasoning_content";
        # Ollama reads "reasoning", which we send; the copy adds nothing.
        message.pop("reasoning_content", None)
    return body


def comparable_ours(body: dict[str, Any], provider: OpenAIProvider) -> dict[str, Any]:
    """Our body with function.strict checked and removed (the recording has no such field)."""
    body = copy.deepcopy(body)
    for tool in body.get("tools", []):
        strict = tool["function"].pop("strict", None)
        assert strict is (True if provider.option("strict_tools") else None), tool
    return body


# -- what the recorded answer says, read independently of the provider ---------------------------
def recorded_answer(interaction: Interaction) -> dict[str, Any]:
    """Text, tool calls (id, name, arguments) and usage numbers of a recorded answer."""
    if not interaction.is_stream:
        data = interaction.response_json()
        message = data["choices"][0]["message"]
        calls = [
            (call["id"], call["function"]["name"], json.loads(call["function"]["arguments"]))
            for call in message.get("tool_calls") or []
        ]
        return {"text": message.get("content") or "", "calls": calls, "usage": data["usage"]}
    text = ""
    usage: dict[str, Any] = {}
    partial: dict[int, dict[str, Any]] = {}
    for chunk in sse_data(interaction.response_text):
        usage = chunk.get("usage") or usage
        for choice in chunk["choices"]:
            text += choice["delta"].get("content") or ""
            for call in choice["delta"].get("tool_calls") or []:
                slot = partial.setdefault(call["index"], {"arguments": ""})
                slot["id"] = call.get("id") or slot.get("id")
                slot["name"] = call["function"].get("name") or slot.get("name")
                slot["arguments"] += call["function"].get("arguments") or ""
    calls = [
        (slot["id"], slot["name"], json.loads(slot["arguments"] or "{}"))
        for _, slot in sorted(partial.items())
    ]
    return {"text": text, "calls": calls, "usage": usage}


def expected_usage(usage: dict[str, Any]) -> TokenUsage:
    return TokenUsage(
        input_tokens=usage["prompt_tokens"],
        output_tokens=usage["completion_tokens"],
        cached_tokens=(usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
        reasoning_tokens=(usage.get("completion_tokens_details") or {}).get("reasoning_tokens", 0),
    )

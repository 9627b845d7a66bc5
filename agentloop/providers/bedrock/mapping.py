"""Bedrock Converse's wire mapping: a ``ModelRequest`` as a Converse body.

How messages, tools, thinking and caching map is described in
``agentloop.providers.bedrock``; answers are read in :mod:`.answer`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ...attachments import Attachment
from ...exceptions import AttachmentError
from ...messages import Caching, Message, ModelRequest, Thinking, ToolCall, ToolDefinition
from ..caching import MAX_BREAKPOINTS
from ..common import INVALID_ARGUMENTS, close_object_schemas, deep_merge, turns
from ..model_options import temperature_for, thinking_for
from ..thinking import EFFORT_BUDGETS, budget_tokens, replays_to

__all__ = ["CONTENT_KEY", "request_body"]

#: Message.provider_data key holding an answer's blocks in order, when some must go back
#: exactly as received (``reasoningContent`` with its signature); text blocks are kept as
#: they were and tool uses as ``{"toolUse": {"toolUseId": id}}``, rebuilt from the calls.
CONTENT_KEY = "bedrock_content"

#: the name structured output's schema is given (the API asks for one, any will do).
_STRUCTURED_OUTPUT_NAME = "response"

# Characters Bedrock accepts in a document's name (others are replaced by a space).
_DOCUMENT_NAME = re.compile(r"[^A-Za-z0-9\s\-()\[\]]")


def family(model: str) -> str:
    """ "anthropic", "nova" or "other": where the fields of a model's family differ (thinking,
    tool cache points). Inference profiles (``us.``, ``global.``, ARNs) name the model too."""
    if "anthropic." in model:
        return "anthropic"
    if "amazon.nova" in model:
        return "nova"
    return "other"


# -- the request body --------------------------------------------------------------------------
def request_body(request: ModelRequest, provider: str) -> dict[str, Any]:
    """The Converse body for ``request`` (streamed or not, it is the same); replay data goes
    back only to ``provider``."""
    system, messages = _messages(request.messages, provider)
    body: dict[str, Any] = {"messages": messages}
    if system:
        body["system"] = system
    # Always sent, even empty, as the API has taken it in every recording.
    inference: dict[str, Any] = {}
    if request.max_output_tokens is not None:
        inference["maxTokens"] = request.max_output_tokens
    temperature = temperature_for(request, provider)
    if temperature is not None:
        inference["temperature"] = temperature
    body["inferenceConfig"] = inference
    if request.tools:
        tool_config: dict[str, Any] = {"tools": [_tool(tool) for tool in request.tools]}
        choice = _tool_choice(request.tool_choice)
        if choice is not None:
            tool_config["toolChoice"] = choice
        body["toolConfig"] = tool_config
    if request.output_schema is not None:
        schema = close_object_schemas(request.output_schema)
        structure = {"jsonSchema": {"schema": json.dumps(schema), "name": _STRUCTURED_OUTPUT_NAME}}
        body["outputConfig"] = {"textFormat": {"type": "json_schema", "structure": structure}}
    thinking = thinking_for(request, provider)
    if thinking is not None:
        fields = _thinking_fields(request.model, thinking)
        if fields:
            body["additionalModelRequestFields"] = fields
    if request.provider_options:
        body = deep_merge(body, request.provider_options)
    if request.caching is not None:
        # After the options: cache points set by hand count towards the limit.
        body = add_cache_points(body, request.caching, family(request.model))
    return body


def _tool(tool: ToolDefinition) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": tool.name}
    if tool.description:
        spec["description"] = tool.description
    spec["inputSchema"] = {"json": tool.parameters or {"type": "object", "properties": {}}}
    return {"toolSpec": spec}


def _tool_choice(choice: str | None) -> dict[str, Any] | None:
    """Converse has ``auto``, ``any`` and one ``tool``; "none" has no equivalent, so the
    tools are sent without a choice (the history's tool uses need the tool config)."""
    if choice is None or choice == "none":
        return None
    if choice == "auto":
        return {"auto": {}}
    if choice == "required":
        return {"any": {}}
    return {"tool": {"name": choice}}


def _thinking_fields(model: str, thinking: Thinking) -> dict[str, Any]:
    """Claude takes a budget (``reasoning_config``), Nova 2 an effort (``reasoningConfig``);
    off is each model's default, so turning thinking off sends nothing."""
    if not thinking.enabled:
        return {}
    kind = family(model)
    if kind == "nova":
        effort = thinking.effort or _effort_of(thinking.budget_tokens or 0)
        return {"reasoningConfig": {"type": "enabled", "maxReasoningEffort": effort}}
    if kind == "anthropic":
        return {"reasoning_config": {"type": "enabled", "budget_tokens": budget_tokens(thinking)}}
    return {}  # other families: their own fields, through provider_options


def _effort_of(budget: int) -> str:
    """The smallest effort whose budget covers ``budget`` (Nova takes no budget)."""
    for effort, tokens in EFFORT_BUDGETS.items():
        if budget <= tokens:
            return effort
    return "high"


def _messages(
    transcript: list[Message], provider: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    system = [{"text": m.content} for m in transcript if m.role == "system" and m.content]

    def blocks(message: Message) -> list[dict[str, Any]]:
        if message.role == "user":
            return _blocks(message)
        if message.role == "tool":
            return [_tool_result(message)]
        return _assistant_blocks(message, provider)

    return system, turns(transcript, blocks)


def _blocks(message: Message) -> list[dict[str, Any]]:
    """The text (no empty text block), then the attachments."""
    blocks = [{"text": message.content}] if message.content else []
    return blocks + [_attachment_block(attachment) for attachment in message.attachments]


def _attachment_block(attachment: Attachment) -> dict[str, Any]:
    source: dict[str, Any]
    if attachment.data is not None:
        source = {"bytes": attachment.base64()}
    elif attachment.url is not None and attachment.url.startswith("s3://"):
        source = {"s3Location": {"uri": attachment.url}}
    else:
        raise AttachmentError(
            f"Bedrock takes attachments as bytes or s3:// URLs, not {attachment.url!r}: "
            "attach the file's bytes instead"
        )
    subtype = (attachment.media_type or "").rpartition("/")[2]
    if attachment.kind == "image":
        return {"image": {"format": subtype, "source": source}}
    name = " ".join(_DOCUMENT_NAME.sub(" ", attachment.name or "document").split()) or "document"
    return {"document": {"format": subtype, "name": name, "source": source}}


def _tool_result(message: Message) -> dict[str, Any]:
    # The result's text as text (as the API took it in every recording, JSON text too).
    content = _blocks(message) or [{"text": "(empty)"}]  # content may not be empty
    result: dict[str, Any] = {"toolUseId": message.tool_call_id, "content": content}
    if message.is_error:
        result["status"] = "error"
    return {"toolResult": result}


def _tool_use(call: ToolCall) -> dict[str, Any]:
    # Arguments that were not a JSON object were never run; the API needs an object.
    arguments = {} if INVALID_ARGUMENTS in call.provider_data else call.arguments
    return {"toolUse": {"toolUseId": call.id, "name": call.name, "input": arguments}}


def _assistant_blocks(message: Message, provider: str) -> list[dict[str, Any]]:
    kept = message.provider_data.get(CONTENT_KEY) if replays_to(message, provider) else None
    calls = {call.id: call for call in message.tool_calls}
    opaque: list[dict[str, Any]] = []
    if isinstance(kept, list):
        texts = "".join(str(block.get("text", "")) for block in kept if "text" in block)
        kept_ids = {block["toolUse"].get("toolUseId") for block in kept if "toolUse" in block}
        if texts == message.content and kept_ids == set(calls):
            # As received: a signed reasoning block is checked against what follows it.
            return [
                _tool_use(calls[block["toolUse"]["toolUseId"]]) if "toolUse" in block else block
                for block in kept
            ]
        # Edited since: keep the opaque blocks (first, where reasoning goes) and rebuild.
        opaque = [block for block in kept if "text" not in block and "toolUse" not in block]
    text = [{"text": message.content}] if message.content else []
    return opaque + text + [_tool_use(call) for call in message.tool_calls]


# -- prompt caching ------------------------------------------------------------------------------
def cache_point(caching: Caching) -> dict[str, Any]:
    """A ``cachePoint`` block: 5 minutes is the API's default and is left unsaid."""
    point: dict[str, Any] = {"type": "default"}
    if caching.ttl == "1h":
        point["ttl"] = "1h"
    return {"cachePoint": point}


def _count_points(body: dict[str, Any]) -> int:
    blocks = [*body.get("system", ()), *(body.get("toolConfig") or {}).get("tools", ())]
    for message in body.get("messages", ()):
        blocks.extend(message.get("content") or ())
    return sum(1 for block in blocks if isinstance(block, dict) and "cachePoint" in block)


def add_cache_points(body: dict[str, Any], caching: Caching, model_family: str) -> dict[str, Any]:
    """``body`` (changed in place) with cache points after the tools (Claude only: Nova takes
    none there), the system prompt and the latest message, within the limit of four."""
    room = MAX_BREAKPOINTS - _count_points(body)
    tools = (body.get("toolConfig") or {}).get("tools") if model_family == "anthropic" else None
    messages = body.get("messages") or []
    targets = [tools, body.get("system"), messages[-1]["content"] if messages else None]
    for blocks in targets:
        if room > 0 and blocks and "cachePoint" not in blocks[-1]:
            blocks.append(cache_point(caching))
            room -= 1
    return body

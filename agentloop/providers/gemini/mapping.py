"""Gemini's wire mapping: a ``ModelRequest`` as a ``generateContent`` body, and an answer
(one response, or the chunks of a stream) as a ``ModelResponse``.

How messages, tools and attachments map is described in ``agentloop.providers.gemini``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from ...exceptions import InvalidResponseError
from ...messages import (
    Attachment,
    Message,
    ModelRequest,
    ModelResponse,
    TextDelta,
    Thinking,
    ThinkingDelta,
    TokenUsage,
    ToolCall,
    ToolCallDelta,
    ToolDefinition,
    reported_tokens,
)
from ..base import ChunkCallback
from ..common import (
    INVALID_ARGUMENTS,
    deep_merge,
    json_text,
    new_call_id,
    tool_call_from_text,
    turns,
)
from ..model_options import temperature_for, thinking_for
from ..thinking import budget_tokens, replays_to, stamped
from .schema import gemini_schema

__all__ = ["CALL_ID", "PARTS_KEY", "SIGNATURE", "Answer", "request_body"]

#: ToolCall.provider_data key: the thought signature Gemini put on the call's part.
SIGNATURE = "thought_signature"
#: ToolCall.provider_data key: the call id Gemini sent (Gemini 3 does; 2.x sends none).
CALL_ID = "gemini_id"
#: Message.provider_data key: the answer's parts in order, kept when some of them must go
#: back exactly as received (signed text, thought parts, code execution...). Function
#: calls are kept as ``{"functionCall": {"id": <our call id>}}`` and rebuilt from the calls.
PARTS_KEY = "gemini_parts"

_FINISH_REASONS = {
    "STOP": "stop",
    "MAX_TOKENS": "length",
    "SAFETY": "content_filter",
    "RECITATION": "content_filter",
    "LANGUAGE": "content_filter",
    "BLOCKLIST": "content_filter",
    "PROHIBITED_CONTENT": "content_filter",
    "SPII": "content_filter",
    "IMAGE_SAFETY": "content_filter",
    "IMAGE_PROHIBITED_CONTENT": "content_filter",
}


# -- the request body ---------------------------------------------------------------------------
def request_body(request: ModelRequest, provider: str | None = None) -> dict[str, Any]:
    """The ``generateContent`` body for ``request`` (streamed or not, the body is the same);
    thought signatures go back only to ``provider`` (None: to any)."""
    messages = request.messages
    if provider is not None:
        messages = [_for(provider, message) for message in messages]
    system, contents = _contents(messages)
    body: dict[str, Any] = {"contents": contents}
    if system:
        body["systemInstruction"] = {"parts": system}
    config: dict[str, Any] = {}
    temperature = temperature_for(request, provider or "gemini")
    if temperature is not None:
        config["temperature"] = temperature
    if request.max_output_tokens is not None:
        config["maxOutputTokens"] = request.max_output_tokens
    if request.output_schema is not None:
        config["responseMimeType"] = "application/json"
        converted = gemini_schema(request.output_schema)
        if converted is not None:
            config["responseSchema"] = converted
        else:
            config["responseJsonSchema"] = copy.deepcopy(request.output_schema)
    thinking = thinking_for(request, provider or "gemini")
    if thinking is not None:
        config["thinkingConfig"] = _thinking_config(request.model, thinking)
    if config:
        body["generationConfig"] = config
    if request.tools:
        body["tools"] = [{"functionDeclarations": [_declaration(t) for t in request.tools]}]
        tool_config = _tool_config(request.tool_choice)
        if tool_config is not None:
            body["toolConfig"] = tool_config
    if request.provider_options:
        body = deep_merge(body, request.provider_options)
    return body


def _thinking_config(model: str, thinking: Thinking) -> dict[str, Any]:
    """Gemini 3 takes a thinking level, earlier models a budget (0 turns thinking off)."""
    if not thinking.enabled:
        return {"thinkingBudget": 0}
    if model.startswith("gemini-3") and thinking.budget_tokens is None:
        return {"includeThoughts": True, "thinkingLevel": thinking.effort}
    return {"includeThoughts": True, "thinkingBudget": budget_tokens(thinking)}


def _without(data: Mapping[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k != key}


def _for(provider: str, message: Message) -> Message:
    """``message`` without thought parts and signatures another provider made."""
    if message.role != "assistant" or replays_to(message, provider):
        return message
    data = _without(message.provider_data, PARTS_KEY)
    calls = [
        call.model_copy(update={"provider_data": _without(call.provider_data, SIGNATURE)})
        for call in message.tool_calls
    ]
    return message.model_copy(update={"provider_data": data, "tool_calls": calls})


def _declaration(tool: ToolDefinition) -> dict[str, Any]:
    declaration: dict[str, Any] = {"name": tool.name}
    if tool.description:
        declaration["description"] = tool.description
    if tool.parameters:
        converted = gemini_schema(tool.parameters)
        if converted is not None:
            declaration["parameters"] = converted
        else:
            declaration["parametersJsonSchema"] = copy.deepcopy(tool.parameters)
    return declaration


def _tool_config(choice: str | None) -> dict[str, Any] | None:
    # Gemini has no switch for one call per answer: with calls="one" the engine runs the
    # first call and answers the others with an error result.
    if choice is None:
        return None
    if choice in ("auto", "none"):
        return {"functionCallingConfig": {"mode": choice.upper()}}
    if choice == "required":
        return {"functionCallingConfig": {"mode": "ANY"}}
    return {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": [choice]}}


def _contents(
    transcript: list[Message],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    system = [{"text": m.content} for m in transcript if m.role == "system" and m.content]
    calls: dict[str, ToolCall] = {}  # the calls so far, by id: a result names its call's name

    def parts(message: Message) -> list[dict[str, Any]]:
        if message.role == "user":
            first = [{"text": message.content}] if message.content else []
        elif message.role == "tool":
            first = [_function_response(message, calls.get(message.tool_call_id or ""))]
        else:
            calls.update({call.id: call for call in message.tool_calls})
            return _model_parts(message)
        return first + [_attachment_part(a) for a in message.attachments]

    return system, turns(transcript, parts, key="parts", model_role="model")


def _function_response(message: Message, call: ToolCall | None) -> dict[str, Any]:
    name = message.tool_name or (call.name if call else "")
    # "error" is the key Gemini documents for a failed call; otherwise the whole object
    # is the output.
    response: dict[str, Any] = (
        {"name": name, "error": message.content}
        if message.is_error
        else {"name": name, "content": [{"text": message.content}]}
    )
    function_response: dict[str, Any] = {"name": name, "response": response}
    if call is not None and call.provider_data.get(CALL_ID):
        function_response["id"] = call.provider_data[CALL_ID]
    return {"functionResponse": function_response}


def _function_call(call: ToolCall) -> dict[str, Any]:
    # Arguments that were not a JSON object were never run; the API needs an object.
    arguments = {} if INVALID_ARGUMENTS in call.provider_data else call.arguments
    function_call: dict[str, Any] = {"name": call.name, "args": arguments}
    if call.provider_data.get(CALL_ID):
        function_call["id"] = call.provider_data[CALL_ID]
    part: dict[str, Any] = {"functionCall": function_call}
    if call.provider_data.get(SIGNATURE):
        part["thoughtSignature"] = call.provider_data[SIGNATURE]
    return part


def _model_parts(message: Message) -> list[dict[str, Any]]:
    kept = message.provider_data.get(PARTS_KEY)
    opaque: list[dict[str, Any]] = []
    if isinstance(kept, list):
        text = "".join(p.get("text", "") for p in kept if _is_answer_text(p))
        slots = sum("functionCall" in p for p in kept)
        if text == message.content and slots == len(message.tool_calls):
            # As received: signatures belong to the parts they came on. Calls fill their
            # slots in order (the engine may have renamed a call's id meanwhile).
            calls = iter(message.tool_calls)
            return [
                _function_call(next(calls)) if "functionCall" in part else copy.deepcopy(part)
                for part in kept
            ]
        # Edited since: keep the thought and other opaque parts, rebuild the rest.
        opaque = [
            copy.deepcopy(p) for p in kept if "functionCall" not in p and not _is_answer_text(p)
        ]
    parts = opaque + ([{"text": message.content}] if message.content else [])
    return parts + [_function_call(call) for call in message.tool_calls]


def _attachment_part(attachment: Attachment) -> dict[str, Any]:
    if attachment.url is not None:
        file_data = {"fileUri": attachment.url}
        if attachment.media_type:
            file_data["mimeType"] = attachment.media_type
        return {"fileData": file_data}
    return {"inlineData": {"mimeType": attachment.media_type, "data": attachment.base64()}}


# -- answers -----------------------------------------------------------------------------
def _usage(metadata: Mapping[str, Any]) -> TokenUsage:
    # Thinking is billed as output: it counts in output_tokens and again, apart, in
    # reasoning_tokens (as OpenAI reports reasoning). Tool-use prompt tokens (search,
    # code execution) are prompt tokens too.
    thoughts = reported_tokens(metadata, "thoughtsTokenCount")
    return TokenUsage(
        input_tokens=reported_tokens(metadata, "promptTokenCount")
        + reported_tokens(metadata, "toolUsePromptTokenCount"),
        output_tokens=reported_tokens(metadata, "candidatesTokenCount") + thoughts,
        cached_tokens=reported_tokens(metadata, "cachedContentTokenCount"),
        reasoning_tokens=thoughts,
    )


def _is_answer_text(part: Mapping[str, Any]) -> bool:
    return "text" in part and not part.get("thought")


def _mergeable(previous: Mapping[str, Any], part: Mapping[str, Any]) -> bool:
    """Whether streamed text ``part`` continues ``previous``: both text of the same kind
    (answer or thought), nothing else on them, and no signature on ``previous`` yet."""
    return (
        "thoughtSignature" not in previous
        and set(previous) == set(part) - {"thoughtSignature"}
        and set(previous) in ({"text"}, {"text", "thought"})
        and bool(previous.get("thought")) == bool(part.get("thought"))
    )


class Answer:
    """One answer put together from a GenerateContentResponse or the chunks of a stream."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.parts: list[dict[str, Any]] = []
        self.calls: list[ToolCall] = []
        self.usage: Mapping[str, Any] = {}
        self.finish: str | None = None
        self.blocked: str | None = None
        self.model: str | None = None
        self.response_id: str | None = None
        self.seen_candidate = False

    @property
    def finished(self) -> bool:
        return self.finish is not None or self.blocked is not None

    def add(self, data: Any, on_chunk: ChunkCallback | None) -> None:
        if not isinstance(data, dict):
            raise InvalidResponseError(f"{self.name} answered with a {type(data).__name__}")
        candidates = data.get("candidates") or []
        if candidates:
            self.seen_candidate = True
            candidate = candidates[0]
            for part in (candidate.get("content") or {}).get("parts") or ():
                self._part(part, on_chunk)
            self.finish = candidate.get("finishReason") or self.finish
        block = (data.get("promptFeedback") or {}).get("blockReason")
        if block:
            self.blocked = block
        if data.get("usageMetadata"):
            self.usage = data["usageMetadata"]
        self.model = data.get("modelVersion") or self.model
        self.response_id = data.get("responseId") or self.response_id

    def _part(self, part: dict[str, Any], on_chunk: ChunkCallback | None) -> None:
        if "functionCall" in part:
            call = self._call(part["functionCall"], part.get("thoughtSignature"))
            index = len(self.calls)
            self.calls.append(call)
            self.parts.append({"functionCall": {"id": call.id}})
            if on_chunk is not None:
                arguments = call.provider_data.get(INVALID_ARGUMENTS)
                on_chunk(
                    ToolCallDelta(
                        index=index,
                        id=call.id,
                        name=call.name,
                        arguments=arguments if arguments is not None else json_text(call.arguments),
                    )
                )
            return
        if "text" in part and self.parts and _mergeable(self.parts[-1], part):
            previous = self.parts[-1]
            previous["text"] += part["text"]
            if part.get("thoughtSignature"):
                previous["thoughtSignature"] = part["thoughtSignature"]
        else:
            self.parts.append(dict(part))
        if _is_answer_text(part) and part["text"] and on_chunk is not None:
            on_chunk(TextDelta(text=part["text"]))
        elif part.get("thought") and part.get("text") and on_chunk is not None:
            on_chunk(ThinkingDelta(text=part["text"]))

    @staticmethod
    def _call(function_call: Mapping[str, Any], signature: str | None) -> ToolCall:
        vendor_id = function_call.get("id") or None
        data: dict[str, Any] = {}
        if signature:
            data[SIGNATURE] = signature
        if vendor_id:
            data[CALL_ID] = vendor_id
        name = str(function_call.get("name") or "")
        arguments = function_call.get("args")
        if arguments is None or isinstance(arguments, dict):
            return ToolCall(
                id=vendor_id or new_call_id(),
                name=name,
                arguments=arguments or {},
                provider_data=data,
            )
        # ``args`` is a JSON object on the wire; anything else is kept for the error result.
        text = arguments if isinstance(arguments, str) else json_text(arguments)
        return tool_call_from_text(vendor_id, name, text, **data)

    def response(self) -> ModelResponse:
        content = "".join(part["text"] for part in self.parts if _is_answer_text(part))
        provider_data: dict[str, Any] = {}
        if self.response_id:
            provider_data["id"] = self.response_id
        if self.finish:
            provider_data["finish_reason"] = self.finish
        if self.blocked:
            provider_data["block_reason"] = self.blocked
        if any(self._opaque(part) for part in self.parts):
            provider_data[PARTS_KEY] = self.parts
        if PARTS_KEY in provider_data or any(SIGNATURE in c.provider_data for c in self.calls):
            provider_data = stamped(provider_data, self.name)
        thoughts = [p.get("text") or "" for p in self.parts if p.get("thought")]
        return ModelResponse(
            content=content,
            tool_calls=self.calls,
            usage=_usage(self.usage),
            finish_reason=self._finish_reason(),
            model=self.model,
            thinking="\n\n".join(thought for thought in thoughts if thought),
            provider_data=provider_data,
        )

    @staticmethod
    def _opaque(part: Mapping[str, Any]) -> bool:
        """A part that must go back as received: anything but unsigned answer text and calls."""
        return "functionCall" not in part and set(part) != {"text"}

    def _finish_reason(self) -> str:
        if self.finish is None and self.blocked:
            return "content_filter"  # the prompt itself was blocked
        if self.finish in (None, "STOP", "FINISH_REASON_UNSPECIFIED"):
            return "tool_calls" if self.calls else "stop"
        return _FINISH_REASONS.get(self.finish, self.finish.lower())

"""Anthropic Messages API (``POST /v1/messages``), plain and streamed, over httpx.

Mapping, in short: system messages become the top-level ``system`` blocks; consecutive
tool results become one user message of ``tool_result`` blocks (``is_error`` kept);
assistant tool calls become ``tool_use`` blocks next to the text; ``max_tokens`` (required
by the API) comes from the request, else the provider's ``max_tokens`` setting, else a
per-model default; structured output uses ``output_config.format`` (JSON schema).
Attachments follow a message's text as ``image`` and ``document`` blocks (``source`` of type
``base64`` or ``url``), in tool results too.
Thinking and other non-text blocks of an answer are kept in ``provider_data`` and sent
back exactly as received, in their original order, as the API requires (to this provider
only: see :mod:`agentloop.providers.thinking`); the thinking text is also the answer's
``thinking``. ``with_thinking`` becomes ``thinking: {"type": "enabled", "budget_tokens"}``
(or ``{"type": "disabled"}``); ``with_caching`` adds ``cache_control`` breakpoints
(:mod:`agentloop.providers.caching`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..exceptions import InvalidResponseError, ProviderError, StreamInterruptedError
from ..messages import (
    Attachment,
    Message,
    ModelRequest,
    ModelResponse,
    TextDelta,
    ThinkingDelta,
    TokenUsage,
    ToolCall,
    ToolCallDelta,
    reported_tokens,
)
from .base import ChunkCallback
from .caching import add_anthropic_breakpoints
from .common import (
    INVALID_ARGUMENTS,
    close_object_schemas,
    deep_merge,
    tool_call_from_text,
    turns,
)
from .errors import error_for_status
from .http import HTTPProvider, StreamParser
from .model_options import temperature_for, thinking_for
from .thinking import budget_tokens, replays_to, stamped

__all__ = ["ANTHROPIC_VERSION", "AnthropicProvider", "default_max_tokens"]

ANTHROPIC_VERSION = "2023-06-01"

#: Message.provider_data key holding an answer's blocks in order, when it had blocks other
#: than text and tool_use (thinking, redacted_thinking, server tool blocks).
CONTENT_KEY = "anthropic_content"

# Largest output each model family accepts (the vendor's model overview), longest prefix
# wins. ``max_tokens`` is a cap, not a target: asking for the model's maximum costs nothing
# more and keeps long answers from being cut short.
_MAX_OUTPUT_TOKENS: tuple[tuple[str, int], ...] = (
    ("claude-3-haiku", 4096),
    ("claude-3-opus", 4096),
    ("claude-3-sonnet", 4096),
    ("claude-3-5-haiku", 8192),
    ("claude-3-5-sonnet", 8192),
    ("claude-3-7-sonnet", 64000),
    ("claude-haiku-4", 64000),
    ("claude-sonnet-4", 64000),
    ("claude-opus-4", 32000),
    ("claude-opus-4-1", 32000),
    ("claude-opus-4-5", 64000),
)
#: for model ids not in the table: every current Claude model accepts this much.
FALLBACK_MAX_TOKENS = 8192

_FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "content_filter",
}

# In-stream ``error`` events carry a type but no HTTP status: the status the same error
# has as an HTTP response, so it maps to the same ProviderError subclass.
_ERROR_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}

# Fields of answer blocks that the API does not take back as input.
_OUTPUT_ONLY_FIELDS = ("caller",)


def default_max_tokens(model: str) -> int:
    """The largest ``max_tokens`` ``model`` accepts, from a small table of model families."""
    best: tuple[int, int] | None = None
    for prefix, limit in _MAX_OUTPUT_TOKENS:
        if model.startswith(prefix) and (best is None or len(prefix) > best[0]):
            best = (len(prefix), limit)
    return best[1] if best else FALLBACK_MAX_TOKENS


def _text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _attachment_block(attachment: Attachment) -> dict[str, Any]:
    source: dict[str, Any]
    if attachment.url is not None:
        source = {"type": "url", "url": attachment.url}
    else:
        source = {
            "type": "base64",
            "media_type": attachment.media_type,
            "data": attachment.base64(),
        }
    if attachment.kind == "image":
        return {"type": "image", "source": source}
    block: dict[str, Any] = {"type": "document", "source": source}
    if attachment.name:
        block["title"] = attachment.name
    return block


def _blocks(message: Message) -> list[dict[str, Any]]:
    """The text (no empty text block: the API rejects those), then the attachments."""
    blocks = [_text_block(message.content)] if message.content else []
    return blocks + [_attachment_block(attachment) for attachment in message.attachments]


def _clean_block(block: Mapping[str, Any]) -> dict[str, Any]:
    """An answer block as input: without output-only fields and null values."""
    return {
        key: value
        for key, value in block.items()
        if key not in _OUTPUT_ONLY_FIELDS and value is not None
    }


class AnthropicProvider(HTTPProvider):
    """Claude through the Anthropic Messages API.

    Settings (``AGENTLOOP["PROVIDERS"]["anthropic"]``): ``api_key`` (else the
    ``ANTHROPIC_API_KEY`` environment variable), ``base_url`` (without ``/v1``),
    ``timeout``, ``headers`` (e.g. ``anthropic-beta``), ``max_tokens`` (the default output
    cap when a chat sets none) and ``strict_tools`` (send tools with ``strict: true``).
    """

    name = "anthropic"
    default_base_url = "https://api.anthropic.com"
    api_key_env = ("ANTHROPIC_API_KEY",)
    parses_json_text = True

    def __init__(
        self,
        *,
        max_tokens: int | None = None,
        strict_tools: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._max_tokens = max_tokens
        self._strict_tools = strict_tools

    # -- HTTP -------------------------------------------------------------------------------
    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        headers = {"anthropic-version": ANTHROPIC_VERSION}
        if api_key:
            headers["x-api-key"] = api_key
        return headers

    def endpoint(self, request: ModelRequest, stream: bool) -> str:
        return "/v1/messages"

    # -- the request body --------------------------------------------------------------------
    def max_tokens_for(self, request: ModelRequest) -> int:
        """The request's output cap, else the configured one, else the model's maximum."""
        configured = self._max_tokens or self._setting("max_tokens")
        return int(request.max_output_tokens or configured or default_max_tokens(request.model))

    def build_body(self, request: ModelRequest, stream: bool) -> dict[str, Any]:
        system, messages = self._messages(request.messages)
        body: dict[str, Any] = {
            "model": request.model,
            "messages": messages,
            "stream": stream,
            "max_tokens": self.max_tokens_for(request),
        }
        if system:
            body["system"] = system
        temperature = temperature_for(request, self.name)
        if temperature is not None:
            body["temperature"] = temperature
        if request.tools:
            body["tools"] = [self._tool(tool) for tool in request.tools]
            choice = self._tool_choice(request)
            if choice is not None:
                body["tool_choice"] = choice
        if request.output_schema is not None:
            schema = close_object_schemas(request.output_schema)
            body["output_config"] = {"format": {"type": "json_schema", "schema": schema}}
        thinking = thinking_for(request, self.name)
        if thinking is not None:
            budget = budget_tokens(thinking)
            body["thinking"] = (
                {"type": "enabled", "budget_tokens": budget}
                if budget is not None
                else {"type": "disabled"}
            )
        if request.provider_options:
            body = deep_merge(body, request.provider_options)
        if request.caching is not None:
            # After the options: breakpoints set by hand count towards the API's limit.
            body = add_anthropic_breakpoints(body, request.caching)
        return body

    def _tool(self, tool: Any) -> dict[str, Any]:
        strict = self._strict_tools
        if strict is None:
            strict = bool(self._setting("strict_tools"))
        schema = tool.parameters or {"type": "object", "properties": {}}
        definition: dict[str, Any] = {"name": tool.name}
        if tool.description:
            definition["description"] = tool.description
        definition["input_schema"] = close_object_schemas(schema) if strict else schema
        if strict:
            definition["strict"] = True
        return definition

    @staticmethod
    def _tool_choice(request: ModelRequest) -> dict[str, Any] | None:
        choice = request.tool_choice
        result: dict[str, Any] | None
        if choice is None:
            result = None
        elif choice in ("auto", "none"):
            result = {"type": choice}
        elif choice == "required":
            result = {"type": "any"}
        else:
            result = {"type": "tool", "name": choice}
        if request.parallel_tool_calls is False and (result is None or result["type"] != "none"):
            result = result or {"type": "auto"}
            result["disable_parallel_tool_use"] = True
        return result

    def _messages(
        self, transcript: list[Message]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        system = [_text_block(m.content) for m in transcript if m.role == "system" and m.content]

        def blocks(message: Message) -> list[dict[str, Any]]:
            if message.role == "user":
                return _blocks(message)
            if message.role == "tool":
                return [self._tool_result(message)]
            return self._assistant_blocks(message)

        return system, turns(transcript, blocks, joined=("user",))

    @staticmethod
    def _tool_result(message: Message) -> dict[str, Any]:
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.tool_call_id}
        content = _blocks(message)
        if content:  # empty text blocks are rejected; no content is allowed
            block["content"] = content
        if message.is_error:
            block["is_error"] = True
        return block

    @staticmethod
    def _tool_use(call: ToolCall) -> dict[str, Any]:
        # Arguments that were not a JSON object were never run; the API needs an object.
        arguments = {} if INVALID_ARGUMENTS in call.provider_data else call.arguments
        return {"type": "tool_use", "id": call.id, "name": call.name, "input": arguments}

    def _assistant_blocks(self, message: Message) -> list[dict[str, Any]]:
        kept = message.provider_data.get(CONTENT_KEY)
        if not replays_to(message, self.name):
            kept = None  # another provider's signatures: this one would reject them
        calls = {call.id: call for call in message.tool_calls}
        if isinstance(kept, list):
            texts = "".join(b.get("text", "") for b in kept if b.get("type") == "text")
            kept_ids = {b.get("id") for b in kept if b.get("type") == "tool_use"}
            if texts == message.content and kept_ids == set(calls):
                # Echo the answer as received: thinking signatures are checked in order.
                return [
                    self._tool_use(calls[block["id"]])
                    if block.get("type") == "tool_use"
                    else _clean_block(block)
                    for block in kept
                ]
            # Edited since: keep the opaque blocks (first, where thinking goes) and rebuild.
            opaque = [_clean_block(b) for b in kept if b.get("type") not in ("text", "tool_use")]
        else:
            opaque = []
        blocks = opaque + ([_text_block(message.content)] if message.content else [])
        return blocks + [self._tool_use(call) for call in message.tool_calls]

    # -- the answer --------------------------------------------------------------------------
    def parse_response(self, data: Any) -> ModelResponse:
        if not isinstance(data, dict) or not isinstance(data.get("content"), list):
            raise InvalidResponseError(f"{self.name} answered without a content list")
        blocks = []
        for block in data["content"]:
            if block.get("type") == "tool_use" and not isinstance(block.get("input"), dict):
                block = {**block, "input_json": json.dumps(block.get("input"))}
            blocks.append(block)
        return self._response(
            blocks, data.get("usage") or {}, data.get("stop_reason"), data.get("model"), data
        )

    def stream_parser(self, on_chunk: ChunkCallback) -> StreamParser:
        blocks: dict[int, dict[str, Any]] = {}
        tool_numbers: dict[int, int] = {}  # block index -> position among the tool calls
        usage: dict[str, Any] = {}
        message: dict[str, Any] = {}
        stop_reason: str | None = None
        while (event := (yield)) is not None:
            if not event.data.strip():
                continue
            data = json.loads(event.data)
            kind = data.get("type") or event.event
            if kind == "error":
                raise self.error_from_body(None, data)
            if kind == "message_start":
                message = data["message"]
                usage.update(message.get("usage") or {})
            elif kind == "content_block_start":
                index = data["index"]
                block = dict(data["content_block"])
                blocks[index] = block
                if block.get("type") in ("tool_use", "server_tool_use"):
                    block["input_json"] = ""
                if block.get("type") == "tool_use":
                    tool_numbers[index] = len(tool_numbers)
                    on_chunk(
                        ToolCallDelta(index=tool_numbers[index], id=block["id"], name=block["name"])
                    )
                elif block.get("type") == "text" and block.get("text"):
                    on_chunk(TextDelta(text=block["text"]))
            elif kind == "content_block_delta":
                self._apply_delta(
                    blocks[data["index"]], data["delta"], tool_numbers.get(data["index"]), on_chunk
                )
            elif kind == "message_delta":
                stop_reason = (data.get("delta") or {}).get("stop_reason") or stop_reason
                usage.update(data.get("usage") or {})
            elif kind == "message_stop":
                ordered = [blocks[index] for index in sorted(blocks)]
                return self._response(ordered, usage, stop_reason, message.get("model"), message)
            # ping, content_block_stop and unknown events carry nothing we need
        raise StreamInterruptedError(f"{self.name} stream ended before message_stop")

    @staticmethod
    def _apply_delta(
        block: dict[str, Any],
        delta: dict[str, Any],
        tool_number: int | None,
        on_chunk: ChunkCallback,
    ) -> None:
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = block.get("text", "") + delta["text"]
            on_chunk(TextDelta(text=delta["text"]))
        elif kind == "input_json_delta":
            fragment = delta.get("partial_json") or ""
            block["input_json"] = block.get("input_json", "") + fragment
            if tool_number is not None and fragment:
                on_chunk(ToolCallDelta(index=tool_number, arguments=fragment))
        elif kind == "thinking_delta":
            block["thinking"] = block.get("thinking", "") + delta["thinking"]
            if delta["thinking"]:
                on_chunk(ThinkingDelta(text=delta["thinking"]))
        elif kind == "signature_delta":
            block["signature"] = delta["signature"]
        elif kind == "citations_delta":
            block.setdefault("citations", []).append(delta["citation"])

    def error_from_body(self, status: int | None, data: Any) -> ProviderError:
        """An ``error`` event (mid-stream, or a batched request's outcome): its type says the
        status when there was none."""
        error = data.get("error") or {}
        error_type = str(error.get("type") or "api_error")
        status = status or _ERROR_STATUS.get(error_type, 500)
        found = error_for_status(self.name, status, json.dumps(data), {}, self._secrets())
        return type(found)(
            f"{self.name} reported an error mid-stream ({error_type}): "
            f"{error.get('message') or error_type}",
            status=status,
            body=found.body,
        )

    def _response(
        self,
        blocks: list[dict[str, Any]],
        usage: Mapping[str, Any],
        stop_reason: str | None,
        model: str | None,
        message: Mapping[str, Any],
    ) -> ModelResponse:
        texts: list[str] = []
        thoughts: list[str] = []
        calls: list[ToolCall] = []
        kept: list[dict[str, Any]] = []
        opaque = False
        for block in blocks:
            kind = block.get("type")
            if kind == "thinking":
                thoughts.append(block.get("thinking") or "")
            if kind == "text":
                texts.append(block.get("text", ""))
                kept.append(_clean_block(block))
            elif kind == "tool_use":
                calls.append(self._call(block))
                kept.append({"type": "tool_use", "id": block["id"]})
            else:  # thinking, redacted_thinking, server tool blocks: sent back verbatim
                opaque = True
                if "input_json" in block:
                    block = self._with_input(block)
                kept.append(_clean_block(block))
        provider_data: dict[str, Any] = {}
        if message.get("id"):
            provider_data["id"] = message["id"]
        if stop_reason:
            provider_data["stop_reason"] = stop_reason
        if opaque:
            provider_data = stamped({**provider_data, CONTENT_KEY: kept}, self.name)
        return ModelResponse(
            content="".join(texts),
            thinking="\n\n".join(thought for thought in thoughts if thought),
            tool_calls=calls,
            usage=self._usage(usage),
            finish_reason=_FINISH_REASONS.get(stop_reason or "", stop_reason),
            model=model,
            provider_data=provider_data,
        )

    @staticmethod
    def _call(block: dict[str, Any]) -> ToolCall:
        text = block.get("input_json")
        if text is None or (not text and block.get("input")):
            return ToolCall(id=block["id"], name=block["name"], arguments=block.get("input") or {})
        return tool_call_from_text(block["id"], block["name"], text)

    @staticmethod
    def _with_input(block: dict[str, Any]) -> dict[str, Any]:
        text = block.pop("input_json") or ""
        if text:
            try:
                block["input"] = json.loads(text)
            except ValueError:
                block["input"] = {}
        return block

    @staticmethod
    def _usage(usage: Mapping[str, Any]) -> TokenUsage:
        # Anthropic counts cache reads and writes apart from ``input_tokens``; ours is the
        # whole prompt (as OpenAI reports it), with the reads and writes also counted apart.
        cache_read = reported_tokens(usage, "cache_read_input_tokens")
        cache_write = reported_tokens(usage, "cache_creation_input_tokens")
        written = usage.get("cache_creation") or {}
        details = usage.get("output_tokens_details") or {}
        return TokenUsage(
            input_tokens=reported_tokens(usage, "input_tokens") + cache_read + cache_write,
            output_tokens=reported_tokens(usage, "output_tokens"),
            cache_read_tokens=cache_read,
            cache_write_tokens=cache_write,
            cache_write_1h_tokens=reported_tokens(written, "ephemeral_1h_input_tokens"),
            reasoning_tokens=reported_tokens(details, "thinking_tokens"),
        )

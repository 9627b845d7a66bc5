"""OpenAI's Responses API (``POST {base_url}/responses``) spoken over httpx.

Requests are stateless (``store: false``): every call sends the whole conversation
as ``input`` items. Reasoning models think in ``reasoning`` output items whose
``encrypted_content`` must go back with the next request, in their place before
the message or function calls they led to, or the model loses its chain of
thought between tool rounds. The answer's output items are therefore kept, in
order, in ``ModelResponse.provider_data["openai_output"]`` (the engine stores it
on the assistant message) and replayed from there; the text and function calls
themselves are rebuilt from the message, so a transcript edited or written by
another provider still maps.

Mapping, ours -> the wire:
- system messages (any position) -> ``instructions`` (joined by blank lines);
- user -> ``{"role": "user", "content": text}``; with attachments the content is a list:
  ``input_text``, then ``input_image`` (``image_url``: the URL or a ``data:`` URL) and
  ``input_file`` (``file_data`` + ``filename``, or ``file_url``) parts;
- assistant -> kept reasoning items, ``{"role": "assistant", "content":
  [{"type": "output_text", ...}]}`` and ``{"type": "function_call", ...}`` items;
- tool -> ``{"type": "function_call_output", "call_id", "output"}`` (the API has
  no error flag: an error result is sent as its text; with attachments ``output`` is
  a list of the same parts);
- tools -> ``{"type": "function", "name", "description", "parameters", "strict"}``,
  strict when the schema already satisfies strict mode (see
  :func:`~agentloop.providers.common.strict_json_schema`);
- ``output_schema`` -> ``text.format`` ``json_schema`` in strict mode;
- ``with_thinking`` -> ``reasoning: {"effort", "summary": "auto"}`` (the summaries become the
  answer's ``thinking``; effort None sends nothing: the model's default); ``with_caching``
  -> ``prompt_cache_key``.

Reasoning items are sent back only to the provider that made them (see
:mod:`agentloop.providers.thinking`).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from typing import Any

from ..exceptions import (
    AuthenticationError,
    BadRequestError,
    ContextLengthError,
    InvalidResponseError,
    ProviderError,
    RateLimitError,
    ServerError,
    StreamInterruptedError,
)
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
    ToolDefinition,
    reported_tokens,
)
from .base import ChunkCallback
from .catalog import thinks
from .common import (
    INVALID_ARGUMENTS,
    deep_merge,
    json_text,
    strict_json_schema,
    tool_call_from_text,
)
from .http import HTTPProvider, StreamParser
from .model_options import temperature_for, thinking_for
from .redaction import redact
from .thinking import replays_to, stamped

__all__ = ["OUTPUT_KEY", "OpenAIResponsesProvider"]

#: Message.provider_data key holding an answer's output items in order: reasoning items
#: as they must be sent back, and ``{"type": "message"}`` / ``{"type": "function_call",
#: "call_id": ...}`` markers for where the text and each call stood.
OUTPUT_KEY = "openai_output"

# Model families that don't reason: the API refuses ``include: reasoning.encrypted_content``
# for them ("Encrypted content is not supported with this model"). The rule for models the
# catalog doesn't list; for those it does, the catalog says.
_NON_REASONING_PREFIXES = ("gpt-4", "gpt-3.5", "chatgpt-4o")


def _reasons(model: str) -> bool:
    """Whether ``model`` reasons: the catalog's word, else the family rule above."""
    known = thinks(model)
    return known if known is not None else not model.startswith(_NON_REASONING_PREFIXES)


# In-stream error codes -> the ProviderError they mean (unknown codes: ServerError).
_STREAM_ERRORS: dict[str, type[ProviderError]] = {
    "rate_limit_exceeded": RateLimitError,
    "insufficient_quota": RateLimitError,
    "context_length_exceeded": ContextLengthError,
    "invalid_api_key": AuthenticationError,
    "invalid_prompt": BadRequestError,
    "invalid_request_error": BadRequestError,
    "server_error": ServerError,
}

_FORMAT_NAME = re.compile(r"[^a-zA-Z0-9_-]")


def _arguments_text(call: ToolCall) -> str:
    invalid = call.provider_data.get(INVALID_ARGUMENTS)
    if isinstance(invalid, str):
        return invalid  # what the model sent; its error result explains the problem
    return json_text(call.arguments)


def _function_call(call: ToolCall) -> dict[str, Any]:
    return {
        "type": "function_call",
        "call_id": call.id,
        "name": call.name,
        "arguments": _arguments_text(call),
    }


def _attachment(attachment: Attachment) -> dict[str, Any]:
    if attachment.kind == "image":
        # The API documents detail as required; "auto" is what it does without one.
        return {
            "type": "input_image",
            "image_url": attachment.data_url(),
            "detail": attachment.detail or "auto",
        }
    if attachment.url is not None:
        return {"type": "input_file", "file_url": attachment.url}
    return {
        "type": "input_file",
        "filename": attachment.filename(),
        "file_data": attachment.data_url(),
    }


def _content(message: Message) -> str | list[dict[str, Any]]:
    """The text, or with attachments a list of parts: the text first, then each one."""
    if not message.attachments:
        return message.content
    parts = [{"type": "input_text", "text": message.content}] if message.content else []
    return parts + [_attachment(attachment) for attachment in message.attachments]


def _assistant_text(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "output_text", "text": text}]}


def _assistant_items(message: Message, provider: str) -> list[dict[str, Any]]:
    """An assistant message as input items, in the order the model produced them; another
    provider's reasoning items stay out."""
    replay = replays_to(message, provider)
    calls = {call.id: call for call in message.tool_calls}
    items: list[dict[str, Any]] = []
    text_sent = not message.content
    placed: set[str] = set()
    for entry in message.provider_data.get(OUTPUT_KEY) or ():
        kind = entry.get("type")
        if kind == "message":
            if not text_sent:
                items.append(_assistant_text(message.content))
                text_sent = True
        elif kind == "function_call":
            call = calls.get(entry.get("call_id"))
            if call is not None and call.id not in placed:
                items.append(_function_call(call))
                placed.add(call.id)
        elif replay:
            items.append(copy.deepcopy(entry))
    # Whatever the markers didn't place (another provider's answer, renamed ids).
    if not text_sent:
        items.append(_assistant_text(message.content))
    items.extend(_function_call(call) for call in message.tool_calls if call.id not in placed)
    return items


def _kept_item(item: Mapping[str, Any]) -> dict[str, Any] | None:
    """What of an output item must be sent back next time (None: nothing)."""
    kind = item.get("type")
    if kind == "reasoning":
        kept: dict[str, Any] = {"type": "reasoning", "summary": item.get("summary") or []}
        if item.get("encrypted_content"):
            # Stateless: the item carries itself; an id would point at nothing stored.
            kept["encrypted_content"] = item["encrypted_content"]
        elif item.get("id"):
            kept["id"] = item["id"]  # only works with store=true (a provider option)
        return kept
    if kind == "message":
        return {"type": "message"}
    if kind == "function_call":
        return {"type": "function_call", "call_id": item.get("call_id")}
    return None


def _usage(usage: Mapping[str, Any] | None) -> TokenUsage:
    if not usage:
        return TokenUsage()
    input_details = usage.get("input_tokens_details")
    return TokenUsage(
        input_tokens=reported_tokens(usage, "input_tokens"),
        output_tokens=reported_tokens(usage, "output_tokens"),
        cache_read_tokens=reported_tokens(input_details, "cached_tokens"),
        cache_write_tokens=reported_tokens(input_details, "cache_write_tokens"),
        reasoning_tokens=reported_tokens(usage.get("output_tokens_details"), "reasoning_tokens"),
    )


class OpenAIResponsesProvider(HTTPProvider):
    """OpenAI's Responses API (``/v1/responses``), stateless, with reasoning round-tripped.

    Settings: ``AGENTLOOP["PROVIDERS"]["openai-responses"]`` (``api_key``,
    ``base_url``, ``timeout``, ``headers``), else ``OPENAI_API_KEY``.
    """

    name = "openai-responses"
    default_base_url = "https://api.openai.com/v1"
    api_key_env: tuple[str, ...] = ("OPENAI_API_KEY",)

    def endpoint(self, request: ModelRequest, stream: bool) -> str:
        return "/responses"

    # -- the request -----------------------------------------------------------------------
    def build_body(self, request: ModelRequest, stream: bool) -> dict[str, Any]:
        instructions, items = self._input(request.messages, self.name)
        body: dict[str, Any] = {"model": request.model, "input": items}
        if instructions:
            body["instructions"] = instructions
        body["stream"] = stream
        body["store"] = False
        if _reasons(request.model):
            body["include"] = ["reasoning.encrypted_content"]
        if request.tools:
            body["tools"] = [self._tool(tool) for tool in request.tools]
            choice = self._tool_choice(request.tool_choice)
            if choice is not None:
                body["tool_choice"] = choice
            if request.parallel_tool_calls is not None:
                body["parallel_tool_calls"] = request.parallel_tool_calls
        if request.output_schema is not None:
            body["text"] = {"format": self._schema_format(request.output_schema)}
        temperature = temperature_for(request, self.name)
        if temperature is not None:
            body["temperature"] = temperature
        if request.max_output_tokens is not None:
            body["max_output_tokens"] = request.max_output_tokens
        thinking = thinking_for(request, self.name)
        if thinking is not None and thinking.effort is not None:
            body["reasoning"] = {"effort": thinking.effort, "summary": "auto"}
        if request.caching is not None and request.caching.key:
            body["prompt_cache_key"] = request.caching.key
        if request.provider_options:
            body = deep_merge(body, request.provider_options)
        return body

    @staticmethod
    def _input(messages: list[Message], provider: str) -> tuple[str, list[dict[str, Any]]]:
        instructions: list[str] = []
        items: list[dict[str, Any]] = []
        for message in messages:
            if message.role == "system":
                if message.content:
                    instructions.append(message.content)
            elif message.role == "user":
                items.append({"role": "user", "content": _content(message)})
            elif message.role == "assistant":
                items.extend(_assistant_items(message, provider))
            else:
                items.append(
                    {
                        "type": "function_call_output",
                        "call_id": message.tool_call_id,
                        "output": _content(message),
                    }
                )
        return "\n\n".join(instructions), items

    @staticmethod
    def _tool(tool: ToolDefinition) -> dict[str, Any]:
        strict = strict_json_schema(tool.parameters, force=False)
        return {
            "type": "function",
            "name": tool.name,
            "description": tool.description,
            "parameters": strict if strict is not None else tool.parameters,
            "strict": strict is not None,
        }

    @staticmethod
    def _tool_choice(choice: str | None) -> str | dict[str, str] | None:
        if choice is None or choice in ("auto", "none", "required"):
            return choice
        return {"type": "function", "name": choice}

    @staticmethod
    def _schema_format(schema: Mapping[str, Any]) -> dict[str, Any]:
        # The schema's title names the format (pydantic puts the model's name there).
        title = schema.get("title")
        name = _FORMAT_NAME.sub("_", title)[:64] if isinstance(title, str) and title else ""
        return {
            "type": "json_schema",
            "name": name or "response",
            "schema": strict_json_schema(schema, force=True),
            "strict": True,
        }

    # -- the answer ------------------------------------------------------------------------
    def parse_response(self, data: Any) -> ModelResponse:
        if not isinstance(data, dict) or not isinstance(data.get("output"), list):
            raise InvalidResponseError(f"{self.name} answered without an output list")
        if data.get("status") == "failed" or data.get("error"):
            raise self._error(data.get("error") or {})
        return self._response(data)

    def _response(self, data: Mapping[str, Any]) -> ModelResponse:
        texts: list[str] = []
        thoughts: list[str] = []
        calls: list[ToolCall] = []
        kept: list[dict[str, Any]] = []
        for item in data.get("output") or ():
            kind = item.get("type")
            if kind == "reasoning":
                thoughts.extend(part.get("text") or "" for part in item.get("summary") or ())
            if kind == "message":
                for part in item.get("content") or ():
                    if part.get("type") == "output_text":
                        texts.append(part.get("text") or "")
                    elif part.get("type") == "refusal":
                        texts.append(part.get("refusal") or "")
            elif kind == "function_call":
                calls.append(
                    tool_call_from_text(item.get("call_id"), item["name"], item.get("arguments"))
                )
            entry = _kept_item(item)
            if entry is not None:
                kept.append(entry)
        content = "".join(texts)
        provider_data: dict[str, Any] = {"id": data.get("id"), OUTPUT_KEY: kept} if kept else {}
        if any(entry.get("type") == "reasoning" for entry in kept):
            provider_data = stamped(provider_data, self.name)
        return ModelResponse(
            content=content,
            tool_calls=calls,
            usage=_usage(data.get("usage")),
            finish_reason=self._finish_reason(data, calls),
            model=data.get("model"),
            parsed=self._parsed(data, content),
            thinking="\n\n".join(thought for thought in thoughts if thought),
            provider_data=provider_data,
        )

    @staticmethod
    def _finish_reason(data: Mapping[str, Any], calls: list[ToolCall]) -> str:
        if data.get("status") == "incomplete":
            reason = (data.get("incomplete_details") or {}).get("reason")
            return "length" if reason == "max_output_tokens" else str(reason or "incomplete")
        return "tool_calls" if calls else "stop"

    @staticmethod
    def _parsed(data: Mapping[str, Any], content: str) -> Any:
        text_format = (data.get("text") or {}).get("format") or {}
        if text_format.get("type") != "json_schema" or not content:
            return None
        try:
            return json.loads(content)
        except ValueError:
            return None  # e.g. cut short by max_output_tokens; the text stays on the message

    def _error(self, error: Mapping[str, Any]) -> ProviderError:
        code = str(error.get("code") or error.get("type") or "server_error")
        kind = _STREAM_ERRORS.get(code, ServerError)
        detail = redact(str(error.get("message") or code), self._secrets())
        return kind(
            f"{self.name} reported an error ({code}): {detail}",
            body=redact(json.dumps(dict(error)), self._secrets())[:2000],
        )

    # -- the stream ------------------------------------------------------------------------
    def stream_parser(self, on_chunk: ChunkCallback) -> StreamParser:
        done: dict[int, dict[str, Any]] = {}  # output_index -> finished item
        call_numbers: dict[str, int] = {}  # function_call item id -> index among calls
        while (event := (yield)) is not None:
            if not event.data or event.data.strip() == "[DONE]":
                continue
            data = json.loads(event.data)
            kind = data.get("type") or event.event
            if kind in ("response.output_text.delta", "response.refusal.delta"):
                if data.get("delta"):
                    on_chunk(TextDelta(text=data["delta"]))
            elif kind == "response.reasoning_summary_text.delta":
                if data.get("delta"):
                    on_chunk(ThinkingDelta(text=data["delta"]))
            elif kind == "response.function_call_arguments.delta":
                number = call_numbers.setdefault(data.get("item_id") or "", len(call_numbers))
                on_chunk(ToolCallDelta(index=number, arguments=data.get("delta") or ""))
            elif kind == "response.output_item.added":
                item = data.get("item") or {}
                if item.get("type") == "function_call":
                    number = call_numbers.setdefault(item.get("id") or "", len(call_numbers))
                    on_chunk(
                        ToolCallDelta(
                            index=number,
                            id=item.get("call_id"),
                            name=item.get("name"),
                            arguments=item.get("arguments") or "",
                        )
                    )
            elif kind == "response.output_item.done":
                done[int(data.get("output_index", len(done)))] = data["item"]
            elif kind in ("response.completed", "response.incomplete"):
                return self._response(self._final(data["response"], done))
            elif kind == "response.failed":
                raise self._error((data.get("response") or {}).get("error") or {})
            elif kind == "error":
                raise self._error(data.get("error") or data)
        raise StreamInterruptedError(f"{self.name} stream ended before the response completed")

    @staticmethod
    def _final(response: Mapping[str, Any], done: dict[int, dict[str, Any]]) -> dict[str, Any]:
        """The completed response with each output item as its ``output_item.done`` event had it.

        The vendor re-encrypts reasoning for every event; the ``done`` copies are the ones
        clients send back, so replays match the recorded traffic.
        """
        by_id = {item.get("id"): item for item in done.values() if item.get("id")}
        output = [by_id.get(item.get("id"), item) for item in response.get("output") or ()]
        if not output:
            output = [done[index] for index in sorted(done)]
        return {**response, "output": output}

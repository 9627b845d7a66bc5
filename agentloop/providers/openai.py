"""OpenAI Chat Completions (``POST {base_url}/chat/completions``) and the servers that speak it.

One wire format, four presets: :class:`OpenAIProvider` (api.openai.com, or any
OpenAI-compatible server by ``base_url``: vLLM, LM Studio, llama.cpp...),
:class:`OpenRouterProvider`, :class:`DeepSeekProvider` and :class:`OllamaProvider`.
Servers differ in a few details (the role of system messages, the name of the
output-token cap, strict tool schemas, how thinking is asked for and sent back, prompt
cache keys); each detail is a dialect option that the constructor or
``AGENTLOOP["PROVIDERS"][name]`` can override. Thinking: see
:mod:`agentloop.providers.openai_reasoning`.
"""

from __future__ import annotations

import json
import os
import re
from functools import lru_cache
from typing import Any, ClassVar
from urllib.parse import urlparse

from ..exceptions import AttachmentError, InvalidResponseError, StreamInterruptedError
from ..messages import (
    Attachment,
    Message,
    ModelRequest,
    ModelResponse,
    TextDelta,
    ThinkingDelta,
    ToolCall,
    ToolCallDelta,
    ToolDefinition,
)
from .base import ChunkCallback
from .common import (
    ToolCallAssembler,
    deep_merge,
    json_text,
    strict_json_schema,
    tool_call_from_text,
)
from .http import HTTPProvider, StreamParser
from .model_options import temperature_for, thinking_for
from .openai_reasoning import DETAILS_KEY, ReasoningDetails, reasoning_fields, usage_from
from .thinking import replays_to, stamped

__all__ = [
    "DeepSeekProvider",
    "OllamaProvider",
    "OpenAIProvider",
    "OpenRouterProvider",
    "strict_json_schema",
]

#: dialect of api.openai.com.
_OPENAI_DIALECT: dict[str, Any] = {
    "system_role": "developer",
    "max_tokens_field": "max_completion_tokens",
    "strict_tools": True,
    "reasoning_field": None,
    "file_urls": False,
    "thinking_format": "openai",
    "prompt_cache_key": True,
}
#: dialect of an unknown OpenAI-compatible server: the fields every one of them accepts.
_COMPATIBLE_DIALECT: dict[str, Any] = {
    "system_role": "system",
    "max_tokens_field": "max_tokens",
    "strict_tools": False,
    "reasoning_field": None,
    "file_urls": False,
    "thinking_format": "openai",
    "prompt_cache_key": False,
}


def _text(content: Any) -> str:
    """Message content as text: a string, or a list of parts (some servers send parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text") or ""
            for part in content
            if isinstance(part, dict) and part.get("type") in (None, "text", "output_text")
        )
    raise TypeError(f"message content is a {type(content).__name__}")


def _arguments_text(arguments: Any) -> str | None:
    # A few servers send arguments as an object instead of JSON text.
    if arguments is None or isinstance(arguments, str):
        return arguments
    return json_text(arguments)


@lru_cache(maxsize=64)
def _host(url: str) -> str:
    """The host of a (checked) base URL; asked on every model call for the dialect."""
    return urlparse(url).hostname or ""


class OpenAIProvider(HTTPProvider):
    """OpenAI Chat Completions; any OpenAI-compatible server by ``base_url``.

    Dialect options (constructor keyword, or the same key in
    ``AGENTLOOP["PROVIDERS"][name]``):

    - ``system_role``: role of system messages, ``"developer"`` or ``"system"``.
    - ``max_tokens_field``: ``"max_completion_tokens"`` or ``"max_tokens"``.
    - ``strict_tools``: send tool schemas with ``strict: true`` when that keeps their meaning.
    - ``reasoning_field``: field in which an assistant message's thinking text is sent back
      (``"reasoning"``, ``"reasoning_content"``), or None to not send it.
    - ``file_urls``: the server reads a document's URL in ``file.file_data`` (OpenRouter);
      elsewhere documents go as bytes only.
    - ``thinking_format``: how ``with_thinking`` is asked for: ``"openai"``,
      ``"openrouter"`` or ``"deepseek"`` (see :mod:`~agentloop.providers.openai_reasoning`).
    - ``prompt_cache_key``: ``with_caching`` sends the chat's ``prompt_cache_key``.

    On api.openai.com the defaults are ``developer``, ``max_completion_tokens`` and strict
    tools; on any other ``base_url`` they are ``system``, ``max_tokens`` and no strict flag,
    which every compatible server accepts.
    """

    name = "openai"
    default_base_url = "https://api.openai.com/v1"
    api_key_env: tuple[str, ...] = ("OPENAI_API_KEY",)
    parses_json_text = True
    #: environment variables that may hold the base URL (after settings).
    base_url_env: tuple[str, ...] = ("OPENAI_BASE_URL",)
    #: dialect options fixed by this preset (the rest follow the base URL).
    dialect: ClassVar[dict[str, Any]] = {}

    def __init__(
        self,
        *,
        system_role: str | None = None,
        max_tokens_field: str | None = None,
        strict_tools: bool | None = None,
        reasoning_field: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._dialect = {
            key: value
            for key, value in {
                "system_role": system_role,
                "max_tokens_field": max_tokens_field,
                "strict_tools": strict_tools,
                "reasoning_field": reasoning_field,
            }.items()
            if value is not None
        }

    # -- configuration -------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        url = self._configured_url()
        for variable in self.base_url_env:
            url = url or os.environ.get(variable)
        return (url or self.default_base_url).rstrip("/")

    def option(self, key: str) -> Any:
        """A dialect option: constructor, then settings, then the preset, then the base URL's."""
        if key in self._dialect:
            return self._dialect[key]
        configured = self._setting(key)
        if configured is not None:
            return configured
        if key in self.dialect:
            return self.dialect[key]
        openai = _host(self.base_url) == "api.openai.com"
        return (_OPENAI_DIALECT if openai else _COMPATIBLE_DIALECT)[key]

    def option_for(self, key: str, model: str) -> Any:
        """A dialect option for one model: :meth:`option` here; a host whose models differ in a
        detail (Azure's reasoning models take ``max_completion_tokens``) overrides this."""
        return self.option(key)

    # -- the request ---------------------------------------------------------------------
    def endpoint(self, request: ModelRequest, stream: bool) -> str:
        return f"{self.base_url}/chat/completions"

    def build_body(self, request: ModelRequest, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": request.model,
            "messages": [self._message(message) for message in request.messages],
            "stream": stream,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        if request.tools:
            strict = bool(self.option("strict_tools"))
            body["tools"] = [self._tool(tool, strict) for tool in request.tools]
            if request.tool_choice in ("auto", "none", "required"):
                body["tool_choice"] = request.tool_choice
            elif request.tool_choice:
                body["tool_choice"] = {
                    "type": "function",
                    "function": {"name": request.tool_choice},
                }
            if request.parallel_tool_calls is not None:
                body["parallel_tool_calls"] = request.parallel_tool_calls
        temperature = temperature_for(request, self.name)
        if temperature is not None:
            body["temperature"] = temperature
        if request.max_output_tokens is not None:
            body[self.option_for("max_tokens_field", request.model)] = request.max_output_tokens
        if request.output_schema is not None:
            body["response_format"] = self._response_format(request.output_schema)
        thinking = thinking_for(request, self.name)
        if thinking is not None:
            thinking_format = str(self.option("thinking_format"))
            body.update(reasoning_fields(thinking, thinking_format, request.model))
        if request.caching is not None and request.caching.key and self.option("prompt_cache_key"):
            body["prompt_cache_key"] = request.caching.key
        return deep_merge(body, request.provider_options)

    def _message(self, message: Message) -> dict[str, Any]:
        if message.role == "system":
            return {"role": self.option("system_role"), "content": message.content}
        if message.role == "tool":
            # Chat Completions has no error flag on tool results: the text says it.
            return {
                "role": "tool",
                "content": self._content(message),
                "tool_call_id": message.tool_call_id,
            }
        if message.role == "user":
            return {"role": "user", "content": self._content(message)}
        item: dict[str, Any] = {"role": message.role, "content": message.content}
        if message.role == "assistant":
            if message.tool_calls:
                item["tool_calls"] = [self._tool_call(call) for call in message.tool_calls]
            if replays_to(message, self.name):
                reasoning_field = self.option("reasoning_field")
                reasoning = message.provider_data.get("reasoning")
                if reasoning_field and reasoning:
                    item[reasoning_field] = reasoning
                if message.provider_data.get(DETAILS_KEY):
                    item[DETAILS_KEY] = message.provider_data[DETAILS_KEY]
        return item

    def _content(self, message: Message) -> str | list[dict[str, Any]]:
        """The text, or with attachments a list of parts: the text first, then each one."""
        if not message.attachments:
            return message.content
        parts = [{"type": "text", "text": message.content}] if message.content else []
        return parts + [self._attachment(attachment) for attachment in message.attachments]

    def _attachment(self, attachment: Attachment) -> dict[str, Any]:
        if attachment.kind == "image":
            image: dict[str, Any] = {"url": attachment.data_url()}
            if attachment.detail:
                image["detail"] = attachment.detail
            return {"type": "image_url", "image_url": image}
        if attachment.url is not None and not self.option("file_urls"):
            raise AttachmentError(
                f"{self.name} (Chat Completions) takes documents as bytes, not by URL "
                f"({attachment.url[:100]}): attach the file's bytes or a pathlib.Path."
            )
        return {
            "type": "file",
            "file": {"filename": attachment.filename(), "file_data": attachment.data_url()},
        }

    @staticmethod
    def _tool_call(call: ToolCall) -> dict[str, Any]:
        # Arguments that were not valid JSON go back as the {} we kept: some servers
        # (Ollama) reject a request whose argument text does not parse.
        return {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": json_text(call.arguments)},
        }

    @staticmethod
    def _tool(tool: ToolDefinition, strict: bool) -> dict[str, Any]:
        parameters = tool.parameters or {"type": "object", "properties": {}}
        function: dict[str, Any] = {"name": tool.name}
        if tool.description:
            function["description"] = tool.description
        strict_parameters = strict_json_schema(parameters, force=False) if strict else None
        if strict_parameters is not None:
            function["parameters"] = strict_parameters
            function["strict"] = True
        else:
            function["parameters"] = parameters
        return {"type": "function", "function": function}

    @staticmethod
    def _response_format(schema: dict[str, Any]) -> dict[str, Any]:
        title = schema.get("title")
        name = re.sub(r"[^A-Za-z0-9_-]", "_", title)[:64] if isinstance(title, str) else ""
        return {
            "type": "json_schema",
            "json_schema": {
                "name": name or "response",
                "schema": strict_json_schema(schema, force=True),
                "strict": True,
            },
        }

    # -- the answer ----------------------------------------------------------------------
    def parse_response(self, data: Any) -> ModelResponse:
        if not isinstance(data, dict):
            raise InvalidResponseError(f"{self.name} answered with a {type(data).__name__}")
        if data.get("error"):
            raise self.error_from_body(None, data)  # some answer HTTP 200 with an error object
        choice = data["choices"][0]
        message = choice["message"]
        tool_calls = [
            tool_call_from_text(
                call.get("id"),
                call["function"]["name"],
                _arguments_text(call["function"].get("arguments")),
            )
            for call in message.get("tool_calls") or []
        ]
        content = _text(message.get("content"))
        reasoning = message.get("reasoning") or message.get("reasoning_content")
        return ModelResponse(
            content=content or _text(message.get("refusal")),
            tool_calls=tool_calls,
            usage=usage_from(data.get("usage")),
            finish_reason=choice.get("finish_reason"),
            model=data.get("model"),
            thinking=reasoning if isinstance(reasoning, str) else "",
            provider_data=self._provider_data(
                data.get("id"), reasoning, message.get("refusal"), message.get(DETAILS_KEY)
            ),
        )

    def _provider_data(
        self, response_id: Any, reasoning: Any, refusal: Any, details: Any
    ) -> dict[str, Any]:
        """What to keep of an answer; thinking to send back is stamped with our name."""
        provider_data = {
            "id": response_id,
            "reasoning": reasoning,
            "refusal": refusal,
            DETAILS_KEY: details,
        }
        kept = {key: value for key, value in provider_data.items() if value}
        return stamped(kept, self.name) if reasoning or details else kept

    def stream_parser(self, on_chunk: ChunkCallback) -> StreamParser:
        text: list[str] = []
        reasoning: list[str] = []
        refusal: list[str] = []
        details = ReasoningDetails()
        calls = ToolCallAssembler()
        indexes: dict[str, int] = {}  # call id -> index, for servers that send no index
        usage = usage_from(None)
        finish_reason = model = response_id = None
        while (event := (yield)) is not None:
            data = event.data.strip()
            if not data:
                continue
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if not isinstance(chunk, dict):
                raise InvalidResponseError(f"{self.name} streamed a {type(chunk).__name__}")
            if chunk.get("error"):
                raise self.error_from_body(None, chunk)
            model = chunk.get("model") or model
            response_id = chunk.get("id") or response_id
            if chunk.get("usage"):
                usage = usage_from(chunk["usage"])
            for choice in chunk.get("choices") or []:
                if choice.get("index", 0) != 0:
                    continue  # n > 1 is not asked for; only the first answer counts
                delta = choice.get("delta") or {}
                piece = _text(delta.get("content"))
                if piece:
                    text.append(piece)
                    on_chunk(TextDelta(text=piece))
                thinking = delta.get("reasoning") or delta.get("reasoning_content")
                if isinstance(thinking, str) and thinking:
                    reasoning.append(thinking)
                    on_chunk(ThinkingDelta(text=thinking))
                if isinstance(delta.get(DETAILS_KEY), list):
                    details.add(delta[DETAILS_KEY])
                if isinstance(delta.get("refusal"), str):
                    refusal.append(delta["refusal"])
                for call in delta.get("tool_calls") or []:
                    piece_delta = self._call_delta(call, indexes)
                    calls.add(piece_delta)
                    on_chunk(piece_delta)
                finish_reason = choice.get("finish_reason") or finish_reason
        else:
            raise StreamInterruptedError(
                f"{self.name} ended the stream before [DONE]"
                + (f" (after {len(''.join(text))} characters)" if text else "")
            )
        return ModelResponse(
            content="".join(text) or "".join(refusal),
            tool_calls=calls.calls(),
            usage=usage,
            finish_reason=finish_reason,
            model=model,
            thinking="".join(reasoning),
            provider_data=self._provider_data(
                response_id, "".join(reasoning), "".join(refusal), details.details()
            ),
        )

    @staticmethod
    def _call_delta(call: dict[str, Any], indexes: dict[str, int]) -> ToolCallDelta:
        function = call.get("function") or {}
        index = call.get("index")
        call_id = call.get("id")
        if index is None:
            if call_id and call_id not in indexes:
                indexes[call_id] = len(indexes)
            index = indexes[call_id] if call_id else max(indexes.values(), default=0)
        elif call_id:
            indexes.setdefault(call_id, int(index))
        return ToolCallDelta(
            index=int(index),
            id=call_id or None,
            name=function.get("name") or None,
            arguments=_arguments_text(function.get("arguments")) or "",
        )


class OpenRouterProvider(OpenAIProvider):
    """OpenRouter (https://openrouter.ai): many vendors' models behind Chat Completions."""

    name = "openrouter"
    default_base_url = "https://openrouter.ai/api/v1"
    api_key_env = ("OPENROUTER_API_KEY",)
    base_url_env = ()
    dialect: ClassVar[dict[str, Any]] = {
        **_COMPATIBLE_DIALECT,
        "system_role": "developer",
        "strict_tools": True,
        # OpenRouter fetches a PDF from the URL given as file_data.
        "file_urls": True,
        "thinking_format": "openrouter",
    }


class DeepSeekProvider(OpenAIProvider):
    """DeepSeek's API (https://api.deepseek.com): thinking is asked for and sent back in
    ``reasoning_content`` with no configuration."""

    name = "deepseek"
    default_base_url = "https://api.deepseek.com"
    api_key_env = ("DEEPSEEK_API_KEY",)
    base_url_env = ()
    dialect: ClassVar[dict[str, Any]] = {
        **_COMPATIBLE_DIALECT,
        # DeepSeek wants a thinking answer's reasoning_content back with it in tool rounds.
        "reasoning_field": "reasoning_content",
        "thinking_format": "deepseek",
    }


class OllamaProvider(OpenAIProvider):
    """A local Ollama server's OpenAI-compatible endpoint (no key needed)."""

    name = "ollama"
    default_base_url = "http://localhost:11434/v1"
    api_key_env = ("OLLAMA_API_KEY",)
    base_url_env = ()
    requires_key = False
    dialect: ClassVar[dict[str, Any]] = {
        "system_role": "system",
        "max_tokens_field": "max_tokens",
        "strict_tools": False,
        # Ollama reads a thinking model's earlier thinking back from this field.
        "reasoning_field": "reasoning",
        "file_urls": False,
    }

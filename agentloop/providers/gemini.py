"""Google Gemini API (``generateContent`` / ``streamGenerateContent``), plain and streamed.

Mapping, in short: system messages become ``systemInstruction`` parts; user text is a
``user`` content, assistant answers are ``model`` contents of text and ``functionCall``
parts; the results of one round go back as one ``user`` content of ``functionResponse``
parts (matched by function name, and by id when Gemini gave the call one). Tools are
``functionDeclarations`` whose parameters are translated from JSON Schema into Gemini's
OpenAPI dialect (upper-case types, ``nullable``); a schema that dialect can't express is
sent as ``parametersJsonSchema`` instead. Structured output is JSON mode with the same
translation (``responseSchema``, else ``responseJsonSchema``). Attachments follow a
message's text as ``inlineData`` (bytes, base64) or ``fileData`` (``fileUri``: a URL)
parts; a tool result's attachments follow its ``functionResponse`` in the same content.

Gemini (before Gemini 3) sends calls without ids: each call gets one of ours, and the
vendor's id, when there is one, is kept in ``ToolCall.provider_data``. Thought signatures
are kept on the call (``thought_signature``) or, for signed text and thought parts, in the
assistant message's ``provider_data["gemini_parts"]``, and sent back on the same parts.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping
from typing import Any

import httpx
from httpx_sse import ServerSentEvent

from ..exceptions import (
    AuthenticationError,
    BadRequestError,
    InvalidResponseError,
    ProviderError,
    StreamInterruptedError,
)
from ..messages import (
    Attachment,
    Message,
    ModelRequest,
    ModelResponse,
    TextDelta,
    TokenUsage,
    ToolCall,
    ToolCallDelta,
    ToolDefinition,
)
from .base import ChunkCallback
from .common import (
    INVALID_ARGUMENTS,
    deep_merge,
    json_text,
    new_call_id,
    tool_call_from_text,
)
from .errors import error_for_status, redact
from .http import HTTPProvider

__all__ = ["CALL_ID", "PARTS_KEY", "SIGNATURE", "GeminiProvider", "gemini_schema"]

DEFAULT_API_VERSION = "v1beta"

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

# google.rpc status names, for error objects that carry no HTTP code.
_RPC_STATUS = {
    "INVALID_ARGUMENT": 400,
    "FAILED_PRECONDITION": 400,
    "OUT_OF_RANGE": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "RESOURCE_EXHAUSTED": 429,
    "CANCELLED": 499,
    "INTERNAL": 500,
    "UNKNOWN": 500,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
}


# -- JSON Schema -> Gemini's schema dialect ------------------------------------------------------
class _Inexpressible(Exception):  # noqa: N818 - control flow inside gemini_schema only
    """The schema uses something Gemini's OpenAPI dialect has no words for."""


_TYPES = {
    "string": "STRING",
    "number": "NUMBER",
    "integer": "INTEGER",
    "boolean": "BOOLEAN",
    "array": "ARRAY",
    "object": "OBJECT",
    "null": "NULL",
}
# Copied as they are (Gemini's Schema has the same fields).
_KEPT = (
    "format",
    "description",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "minProperties",
    "maxProperties",
    "pattern",
    "minimum",
    "maximum",
    "propertyOrdering",
)
# Keywords that shape what is valid in ways the dialect can't say: the schema goes as
# JSON Schema instead. (Annotations and validation-only keywords the dialect lacks, such as
# ``title``, ``examples``, ``exclusiveMinimum`` or ``uniqueItems``, are simply left out.)
_STRUCTURAL = (
    "prefixItems",
    "patternProperties",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
    "dependentSchemas",
    "dependentRequired",
    "unevaluatedProperties",
    "unevaluatedItems",
    "contains",
)


def _definitions(schema: Mapping[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key in ("definitions", "$defs"):
        if isinstance(schema.get(key), dict):
            found.update({f"#/{key}/{name}": value for name, value in schema[key].items()})
    return found


def _is_null(node: Any) -> bool:
    return isinstance(node, dict) and node.get("type") == "null" and len(node) == 1


def _convert(node: Any, definitions: dict[str, Any], expanding: frozenset[str]) -> dict[str, Any]:
    if not isinstance(node, dict):
        raise _Inexpressible
    if "$ref" in node:
        ref = node["$ref"]
        if ref in expanding or ref not in definitions:
            raise _Inexpressible  # recursive, or pointing somewhere we can't inline
        siblings = {key: value for key, value in node.items() if key != "$ref"}
        return _convert({**definitions[ref], **siblings}, definitions, expanding | {ref})
    if any(key in node for key in _STRUCTURAL):
        raise _Inexpressible
    node = dict(node)
    if "allOf" in node:
        parts = node.pop("allOf")
        if not isinstance(parts, list) or len(parts) != 1 or not isinstance(parts[0], dict):
            raise _Inexpressible
        return _convert({**parts[0], **node}, definitions, expanding)

    nullable = bool(node.pop("nullable", False))
    kind = node.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        nullable = nullable or len(kinds) < len(kind)
        if len(kinds) > 1:
            raise _Inexpressible
        kind = kinds[0] if kinds else "null"
    variants = node.pop("anyOf", None)
    if variants is None:
        variants = node.pop("oneOf", None)
    if variants is not None:
        if not isinstance(variants, list):
            raise _Inexpressible
        others = [variant for variant in variants if not _is_null(variant)]
        nullable = nullable or len(others) < len(variants)
        if len(others) == 1 and isinstance(others[0], dict) and "type" not in node:
            # Optional[X]: X itself, nullable; the outer description and default win.
            merged = _convert({**others[0], **node}, definitions, expanding)
            if nullable:
                merged["nullable"] = True
            return merged

    result: dict[str, Any] = {}
    if kind is not None:
        if kind not in _TYPES:
            raise _Inexpressible
        result["type"] = _TYPES[kind]
    elif "properties" in node:
        result["type"] = "OBJECT"
    if "const" in node:
        node["enum"] = [node.pop("const")]
    if "enum" in node:
        values = node["enum"]
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise _Inexpressible  # the dialect's enums are strings
        result["enum"] = list(values)
        result.setdefault("type", "STRING")
    for key in _KEPT:
        if key in node:
            result[key] = copy.deepcopy(node[key])
    if node.get("default") is not None:
        result["default"] = copy.deepcopy(node["default"])
    if "properties" in node:
        if not isinstance(node["properties"], dict):
            raise _Inexpressible
        result["properties"] = {
            name: _convert(value, definitions, expanding)
            for name, value in node["properties"].items()
        }
    if "required" in node:
        result["required"] = list(node["required"])
    if "items" in node:
        result["items"] = _convert(node["items"], definitions, expanding)
    extra = node.get("additionalProperties")
    if isinstance(extra, dict) and extra:
        raise _Inexpressible  # a map of values (dict[str, X]) has no equivalent
    if variants is not None:
        result["anyOf"] = [
            _convert(variant, definitions, expanding)
            for variant in variants
            if not _is_null(variant)
        ]
    elif "type" not in result:
        raise _Inexpressible  # "any value": the dialect needs a type
    if nullable:
        result["nullable"] = True
    return result


def gemini_schema(schema: Mapping[str, Any]) -> dict[str, Any] | None:
    """``schema`` (JSON Schema) in Gemini's OpenAPI dialect, or None when it can't be said.

    Types become upper case, ``Optional[X]`` (``anyOf`` with ``null``, or a type list)
    becomes ``X`` with ``nullable: true``, ``$ref`` is inlined, ``const`` is a one-value
    enum; ``additionalProperties: false``, titles and other annotations the dialect lacks
    are left out. Recursive references, maps (``additionalProperties`` with a schema),
    tuples, non-string enums and schemas without a type give None: send the JSON Schema
    itself then (``parametersJsonSchema`` / ``responseJsonSchema``).
    """
    try:
        return _convert(dict(schema), _definitions(schema), frozenset())
    except _Inexpressible:
        return None


# -- answers -----------------------------------------------------------------------------
def _usage(metadata: Mapping[str, Any]) -> TokenUsage:
    # Thinking is billed as output: it counts in output_tokens and again, apart, in
    # reasoning_tokens (as OpenAI reports reasoning). Tool-use prompt tokens (search,
    # code execution) are prompt tokens too.
    thoughts = int(metadata.get("thoughtsTokenCount") or 0)
    return TokenUsage(
        input_tokens=int(metadata.get("promptTokenCount") or 0)
        + int(metadata.get("toolUsePromptTokenCount") or 0),
        output_tokens=int(metadata.get("candidatesTokenCount") or 0) + thoughts,
        cached_tokens=int(metadata.get("cachedContentTokenCount") or 0),
        reasoning_tokens=thoughts,
    )


def _is_answer_text(part: Mapping[str, Any]) -> bool:
    return "text" in part and not part.get("thought")


def _attachment_part(attachment: Attachment) -> dict[str, Any]:
    if attachment.url is not None:
        file_data = {"fileUri": attachment.url}
        if attachment.media_type:
            file_data["mimeType"] = attachment.media_type
        return {"fileData": file_data}
    return {"inlineData": {"mimeType": attachment.media_type, "data": attachment.base64()}}


def _mergeable(previous: Mapping[str, Any], part: Mapping[str, Any]) -> bool:
    """Whether streamed text ``part`` continues ``previous``: both text of the same kind
    (answer or thought), nothing else on them, and no signature on ``previous`` yet."""
    return (
        "thoughtSignature" not in previous
        and set(previous) == set(part) - {"thoughtSignature"}
        and set(previous) in ({"text"}, {"text", "thought"})
        and bool(previous.get("thought")) == bool(part.get("thought"))
    )


class _Answer:
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
        return ModelResponse(
            content=content,
            tool_calls=self.calls,
            usage=_usage(self.usage),
            finish_reason=self._finish_reason(),
            model=self.model,
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


# -- the provider ------------------------------------------------------------------------------
class GeminiProvider(HTTPProvider):
    """Gemini through the Gemini API (Google AI Studio keys).

    Settings (``AGENTLOOP["PROVIDERS"]["gemini"]``): ``api_key`` (else the
    ``GEMINI_API_KEY`` or ``GOOGLE_API_KEY`` environment variable), ``base_url``
    (without the version), ``api_version`` (default ``v1beta``), ``timeout``, ``headers``.
    """

    name = "gemini"
    default_base_url = "https://generativelanguage.googleapis.com"
    api_key_env = ("GEMINI_API_KEY", "GOOGLE_API_KEY")
    parses_json_text = True

    def __init__(self, *, api_version: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._api_version = api_version

    @property
    def api_version(self) -> str:
        return str(self._api_version or self._setting("api_version") or DEFAULT_API_VERSION)

    # -- HTTP -------------------------------------------------------------------------------
    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        return {"x-goog-api-key": api_key} if api_key else {}

    def endpoint(self, request: ModelRequest, stream: bool) -> str:
        model = request.model
        resource = model if "/" in model else f"models/{model}"  # tunedModels/... as given
        action = "streamGenerateContent?alt=sse" if stream else "generateContent"
        return f"/{self.api_version}/{resource}:{action}"

    # -- the request body --------------------------------------------------------------------
    def build_body(self, request: ModelRequest, stream: bool) -> dict[str, Any]:
        system, contents = self._contents(request.messages)
        body: dict[str, Any] = {"contents": contents}
        if system:
            body["systemInstruction"] = {"parts": system}
        config: dict[str, Any] = {}
        if request.temperature is not None:
            config["temperature"] = request.temperature
        if request.max_output_tokens is not None:
            config["maxOutputTokens"] = request.max_output_tokens
        if request.output_schema is not None:
            config["responseMimeType"] = "application/json"
            converted = gemini_schema(request.output_schema)
            if converted is not None:
                config["responseSchema"] = converted
            else:
                config["responseJsonSchema"] = copy.deepcopy(request.output_schema)
        if config:
            body["generationConfig"] = config
        if request.tools:
            body["tools"] = [
                {"functionDeclarations": [self._declaration(t) for t in request.tools]}
            ]
            tool_config = self._tool_config(request.tool_choice)
            if tool_config is not None:
                body["toolConfig"] = tool_config
        if request.provider_options:
            body = deep_merge(body, request.provider_options)
        return body

    @staticmethod
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

    @staticmethod
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
        self, transcript: list[Message]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        system: list[dict[str, Any]] = []
        contents: list[dict[str, Any]] = []
        calls: dict[str, ToolCall] = {}

        def add(role: str, parts: list[dict[str, Any]]) -> None:
            if not parts:
                return  # the API rejects contents without parts
            # One content per turn: a round's results (and text after them) share one.
            if contents and contents[-1]["role"] == role:
                contents[-1]["parts"].extend(parts)
            else:
                contents.append({"role": role, "parts": parts})

        for message in transcript:
            if message.role == "system":
                if message.content:
                    system.append({"text": message.content})
            elif message.role == "user":
                text = [{"text": message.content}] if message.content else []
                add("user", text + [_attachment_part(a) for a in message.attachments])
            elif message.role == "tool":
                add(
                    "user",
                    [self._function_response(message, calls.get(message.tool_call_id or ""))]
                    + [_attachment_part(a) for a in message.attachments],
                )
            else:
                calls.update({call.id: call for call in message.tool_calls})
                add("model", self._model_parts(message))
        return system, contents

    @staticmethod
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

    @staticmethod
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

    def _model_parts(self, message: Message) -> list[dict[str, Any]]:
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
                    self._function_call(next(calls))
                    if "functionCall" in part
                    else copy.deepcopy(part)
                    for part in kept
                ]
            # Edited since: keep the thought and other opaque parts, rebuild the rest.
            opaque = [
                copy.deepcopy(p) for p in kept if "functionCall" not in p and not _is_answer_text(p)
            ]
        parts = opaque + ([{"text": message.content}] if message.content else [])
        return parts + [self._function_call(call) for call in message.tool_calls]

    # -- the answer --------------------------------------------------------------------------
    def parse_response(self, data: Any) -> ModelResponse:
        if isinstance(data, dict) and isinstance(data.get("error"), dict):
            raise self.error_from_body(None, data)
        answer = _Answer(self.name)
        answer.add(data, None)
        if not answer.seen_candidate and answer.blocked is None:
            raise InvalidResponseError(f"{self.name} answered without candidates")
        return answer.response()

    def parse_stream(
        self, events: Iterator[ServerSentEvent], on_chunk: ChunkCallback
    ) -> ModelResponse:
        answer = _Answer(self.name)
        for event in events:
            if not event.data.strip():
                continue
            data = json.loads(event.data)
            if isinstance(data, dict) and isinstance(data.get("error"), dict):
                raise self.error_from_body(None, data)
            answer.add(data, on_chunk)
        if not answer.finished:
            raise StreamInterruptedError(f"{self.name} stream ended before a finishReason")
        return answer.response()

    # -- errors -------------------------------------------------------------------------------
    def _raise_for_status(self, response: httpx.Response) -> None:
        if response.status_code >= 400:
            raise self._error(response.status_code, response.text, response.headers)

    def _error(
        self, status: int, text: str, headers: Mapping[str, str] | None = None
    ) -> ProviderError:
        """error_for_status, knowing Gemini's envelope: a bad key is a 400 with reason
        API_KEY_INVALID, and a 429 says when to retry in a RetryInfo detail."""
        found = error_for_status(self.name, status, text, headers or {}, self._secrets())
        error = _envelope(text)
        details = [d for d in error.get("details") or () if isinstance(d, dict)]
        reasons = {str(d.get("reason") or "") for d in details}
        if isinstance(found, BadRequestError) and (
            any(reason.startswith("API_KEY_") for reason in reasons)
            or error.get("status") in ("UNAUTHENTICATED", "PERMISSION_DENIED")
        ):
            found = AuthenticationError(
                str(found), status=found.status, body=found.body, retry_after=found.retry_after
            )
        if found.retry_after is None:
            found.retry_after = _retry_delay(details)
        return found

    def error_from_body(self, status: int | None, data: Any) -> ProviderError:
        """Google's ``{"error": {...}}`` in place of an answer, mid-stream or as a batched
        request's outcome: without a status, its ``code`` (else its RPC status) says one."""
        error: Mapping[str, Any] = data["error"]
        code = error.get("code")
        status = status or (code if isinstance(code, int) and 400 <= code < 600 else None)
        status = status or _RPC_STATUS.get(str(error.get("status") or ""), 500)
        found = self._error(status, json.dumps({"error": dict(error)}))
        detail = redact(str(error.get("message") or ""), self._secrets())[:300]
        return type(found)(
            f"{self.name} reported an error ({error.get('status') or status}): {detail}",
            status=found.status,
            body=found.body,
            retry_after=found.retry_after,
        )


def _envelope(text: str) -> dict[str, Any]:
    """The ``error`` object of a Google API error body (empty when it isn't one)."""
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    if isinstance(data, list) and data:
        data = data[0]
    error = data.get("error") if isinstance(data, dict) else None
    return error if isinstance(error, dict) else {}


def _retry_delay(details: list[dict[str, Any]]) -> float | None:
    """Seconds from a ``google.rpc.RetryInfo`` detail (``"retryDelay": "48s"``)."""
    for detail in details:
        if not str(detail.get("@type") or "").endswith("google.rpc.RetryInfo"):
            continue
        delay = detail.get("retryDelay")
        if isinstance(delay, str) and delay.endswith("s"):
            try:
                return max(0.0, float(delay[:-1]))
            except ValueError:
                return None
        if isinstance(delay, dict):  # the proto form {"seconds": ..., "nanos": ...}
            return max(0.0, float(delay.get("seconds") or 0) + float(delay.get("nanos") or 0) / 1e9)
    return None

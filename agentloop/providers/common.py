"""Mapping helpers every provider shares: tool calls, arguments, bodies and JSON schemas."""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..messages import Message, ModelRequest, ModelResponse, ToolCall, ToolCallDelta

__all__ = [
    "INVALID_ARGUMENTS",
    "ToolCallAssembler",
    "close_object_schemas",
    "deep_merge",
    "json_text",
    "new_call_id",
    "parse_arguments",
    "strict_json_schema",
    "turns",
    "with_parsed_json",
]

#: provider_data key holding argument text that was not a JSON object.
INVALID_ARGUMENTS = "invalid_arguments"


def new_call_id() -> str:
    """An id for a tool call the provider sent without one (Gemini)."""
    return f"call_{uuid.uuid4().hex[:24]}"


def parse_arguments(text: str | None) -> tuple[dict[str, Any], str | None]:
    """``(arguments, None)`` for a JSON object (empty text is ``{}``), else ``({}, text)``."""
    if text is None or not text.strip():
        return {}, None
    try:
        value = json.loads(text)
    except ValueError:
        return {}, text
    if not isinstance(value, dict):
        return {}, text
    return value, None


def tool_call_from_text(
    call_id: str | None, name: str, arguments: str | None, **provider_data: Any
) -> ToolCall:
    """A ToolCall from JSON argument text; invalid text is kept for the error result."""
    parsed, invalid = parse_arguments(arguments)
    data = {key: value for key, value in provider_data.items() if value is not None}
    if invalid is not None:
        data[INVALID_ARGUMENTS] = invalid
    return ToolCall(id=call_id or new_call_id(), name=name, arguments=parsed, provider_data=data)


@dataclass
class _Partial:
    id: str | None = None
    name: str = ""
    arguments: list[str] = field(default_factory=list)
    provider_data: dict[str, Any] = field(default_factory=dict)


class ToolCallAssembler:
    """Rebuilds tool calls from streamed deltas keyed by index."""

    def __init__(self) -> None:
        self._calls: dict[int, _Partial] = {}

    def add(self, delta: ToolCallDelta, **provider_data: Any) -> None:
        call = self._calls.setdefault(delta.index, _Partial())
        if delta.id:
            call.id = delta.id
        if delta.name:
            call.name = delta.name
        if delta.arguments:
            call.arguments.append(delta.arguments)
        call.provider_data.update({k: v for k, v in provider_data.items() if v is not None})

    def __bool__(self) -> bool:
        return bool(self._calls)

    def calls(self) -> list[ToolCall]:
        """The finished calls, in index order."""
        return [
            tool_call_from_text(
                partial.id, partial.name, "".join(partial.arguments), **partial.provider_data
            )
            for _, partial in sorted(self._calls.items())
        ]


# -- request bodies and answers ------------------------------------------------------------------
def deep_merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` updated by ``extra`` (provider options); nested dicts merge, ``extra`` wins.

    Neither argument is changed; values taken from ``extra`` are copies.
    """
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def json_text(value: Any) -> str:
    """Compact JSON, as the APIs write it (tool-call arguments read back the same)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def turns(
    transcript: Iterable[Message],
    blocks: Callable[[Message], list[dict[str, Any]]],
    *,
    key: str = "content",
    model_role: str = "assistant",
    joined: Container[str] | None = None,
) -> list[dict[str, Any]]:
    """The non-system messages of ``transcript`` as the turns of an API whose roles alternate
    (Anthropic, Bedrock Converse, Gemini): ``{"role": ..., key: blocks(message)}``, tool
    results in user turns, assistant messages in ``model_role`` turns.

    A message without blocks is left out (these APIs reject empty turns); one of the role
    of the turn before it is joined into that turn, for the roles in ``joined`` (all when
    None): a round's tool results and the user's text after them make one user turn.
    """
    result: list[dict[str, Any]] = []
    for message in transcript:
        if message.role == "system":
            continue
        role = "user" if message.role in ("user", "tool") else model_role
        content = blocks(message)
        if not content:
            continue
        if result and result[-1]["role"] == role and (joined is None or role in joined):
            result[-1][key].extend(content)
        else:
            result.append({"role": role, key: content})
    return result


def with_parsed_json(request: ModelRequest, response: ModelResponse) -> ModelResponse:
    """``response`` with ``parsed`` set from its text when the request asked for a schema.

    Text that is not JSON (cut short, a refusal) stays as it is and ``parsed`` stays None.
    """
    if request.output_schema is None or response.parsed is not None or not response.content:
        return response
    try:
        parsed = json.loads(response.content)
    except ValueError:
        return response
    return response.model_copy(update={"parsed": parsed})


# -- JSON schemas ------------------------------------------------------------------------------
# Where a schema holds other schemas: by name, in a list, or as one.
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_NODES = ("items", "additionalProperties", "not")


def _with_subschemas(node: dict[str, Any], visit: Callable[[Any], Any]) -> dict[str, Any]:
    """A shallow copy of ``node`` whose subschemas are replaced by ``visit(subschema)``."""
    result = dict(node)
    for key in _SCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            result[key] = {name: visit(value) for name, value in node[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(node.get(key), list):
            result[key] = [visit(value) for value in node[key]]
    for key in _SCHEMA_NODES:
        if isinstance(node.get(key), dict):
            result[key] = visit(node[key])
    return result


def _is_object(node: Mapping[str, Any]) -> bool:
    return node.get("type") == "object" or "properties" in node


def close_object_schemas(schema: Any) -> Any:
    """A copy of ``schema`` where every object schema says ``additionalProperties: false``.

    Objects that already say what extra properties they take keep it; nothing else changes
    (Anthropic's structured output and strict tools only accept closed objects, and
    pydantic leaves them open unless a model forbids extra fields).
    """
    if not isinstance(schema, dict):
        return copy.deepcopy(schema)
    result = _with_subschemas(schema, close_object_schemas)
    if _is_object(schema) and "additionalProperties" not in schema:
        result["additionalProperties"] = False
    return result


# Keywords OpenAI's strict mode accepts (its structured-outputs guide). A tool schema with
# any other keyword is sent without ``strict`` rather than risk a 400.
_STRICT_KEYWORDS = frozenset(
    {
        "type", "properties", "required", "additionalProperties", "items", "enum", "const",
        "description", "title", "anyOf", "$ref", "$defs", "definitions", "pattern", "format",
        "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
        "minItems", "maxItems", "$schema",
    }
)  # fmt: skip
# Keywords strict mode rejects; structured output drops them (the answer is validated later).
_STRICT_UNSUPPORTED = frozenset(
    {
        "minLength", "maxLength", "patternProperties", "unevaluatedProperties", "propertyNames",
        "minProperties", "maxProperties", "unevaluatedItems", "contains", "minContains",
        "maxContains", "uniqueItems",
    }
)  # fmt: skip
_STRICT_FORMATS = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}
)


class _NotStrict(Exception):  # noqa: N818 - control flow inside strict_json_schema only
    """The schema can't be made strict without changing what it accepts."""


def strict_json_schema(schema: Mapping[str, Any], *, force: bool = True) -> dict[str, Any] | None:
    """A copy of ``schema`` in the form OpenAI's strict mode requires.

    Every object gets ``additionalProperties: false``; ``$ref`` with siblings becomes
    ``anyOf: [{$ref}]``; titles go. With ``force`` (structured output) every property
    becomes required and defaults and unsupported keywords are dropped. Without it (tool
    parameters) the answer is None when strictness would change the schema's meaning or
    the API might refuse it: a root that is not an object, an optional property, a
    default, open additional properties, or a keyword strict mode doesn't list.
    """

    def walk(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        if not force and set(node) - _STRICT_KEYWORDS:
            raise _NotStrict
        node = dict(node)
        node.pop("title", None)
        node.pop("$schema", None)
        node.pop("default", None)
        unsupported = set(_STRICT_UNSUPPORTED.intersection(node))
        if node.get("format") is not None and node.get("format") not in _STRICT_FORMATS:
            if not force:
                raise _NotStrict
            unsupported.add("format")
        for key in unsupported:
            node.pop(key)
        if "oneOf" in node:
            node["anyOf"] = node.pop("oneOf")
        if "$ref" in node and len(node) > 1:
            node["anyOf"] = [{"$ref": node.pop("$ref")}, *node.get("anyOf", [])]
        node = _with_subschemas(node, walk)
        if _is_object(node):
            properties = node.setdefault("properties", {})
            if not force and (
                node.get("additionalProperties") not in (None, False)
                or set(properties) - set(node.get("required", []))
            ):
                raise _NotStrict
            node["additionalProperties"] = False
            if force or "required" not in node:
                node["required"] = list(properties)
        return node

    if not force and schema.get("type") != "object":
        return None  # strict tools need an object at the root
    try:
        result: dict[str, Any] = walk(schema)
    except _NotStrict:
        return None
    return result

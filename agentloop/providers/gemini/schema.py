"""JSON Schema in Gemini's OpenAPI schema dialect (``gemini_schema``)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

__all__ = ["gemini_schema"]


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

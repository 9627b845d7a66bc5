"""The mapping helpers every provider shares (agentloop/providers/common.py)."""

from __future__ import annotations

import copy

import pytest
from pydantic import BaseModel, Field

from agentloop.messages import Message, ModelRequest, ModelResponse
from agentloop.providers.common import (
    close_object_schemas,
    deep_merge,
    json_text,
    strict_json_schema,
    with_parsed_json,
)


# -- deep_merge ------------------------------------------------------------------------------
def test_deep_merge_merges_nested_dicts_and_the_extra_side_wins():
    base = {"model": "m", "text": {"format": {"type": "json_schema"}}, "stream": False}
    extra = {"text": {"verbosity": "low"}, "stream": True, "reasoning": {"effort": "low"}}

    merged = deep_merge(base, extra)

    assert merged == {
        "model": "m",
        "text": {"format": {"type": "json_schema"}, "verbosity": "low"},
        "stream": True,
        "reasoning": {"effort": "low"},
    }


def test_deep_merge_replaces_a_non_dict_with_a_dict_and_a_dict_with_a_list():
    merged = deep_merge({"a": 1, "b": {"x": 1}}, {"a": {"y": 2}, "b": [1, 2]})

    assert merged == {"a": {"y": 2}, "b": [1, 2]}


def test_deep_merge_changes_neither_argument_and_copies_what_it_takes():
    base = {"text": {"format": "f"}}
    extra = {"text": {"extra": ["a"]}, "list": [{"k": 1}]}
    before = (copy.deepcopy(base), copy.deepcopy(extra))

    merged = deep_merge(base, extra)
    merged["text"]["extra"].append("b")
    merged["list"][0]["k"] = 2

    assert (base, extra) == before


# -- json_text and with_parsed_json ----------------------------------------------------------
def test_json_text_is_compact_and_keeps_non_ascii():
    assert json_text({"city": "Zürich", "n": [1, 2]}) == '{"city":"Zürich","n":[1,2]}'


def request(schema=None) -> ModelRequest:
    return ModelRequest(
        model="m", messages=[Message(role="user", content="hi")], output_schema=schema
    )


def test_with_parsed_json_parses_the_text_when_a_schema_was_asked_for():
    response = ModelResponse(content='{"name": "Ada"}')

    parsed = with_parsed_json(request({"type": "object"}), response)

    assert parsed.parsed == {"name": "Ada"}
    assert response.parsed is None  # a copy was changed


def test_with_parsed_json_leaves_text_that_is_not_json():
    response = ModelResponse(content="I can't answer that.")

    assert with_parsed_json(request({"type": "object"}), response).parsed is None


def test_with_parsed_json_does_nothing_without_a_schema():
    assert with_parsed_json(request(), ModelResponse(content="{}")).parsed is None


def test_with_parsed_json_keeps_what_the_provider_already_parsed():
    response = ModelResponse(content='{"a": 1}', parsed={"a": 2})

    assert with_parsed_json(request({"type": "object"}), response).parsed == {"a": 2}


# -- close_object_schemas (Anthropic) --------------------------------------------------------
def test_close_object_schemas_closes_every_object_on_a_copy():
    schema = {
        "type": "object",
        "properties": {
            "person": {"type": "object", "properties": {"name": {"type": "string"}}},
            "tags": {"type": "array", "items": {"type": "object", "properties": {}}},
            "either": {"anyOf": [{"type": "object", "properties": {}}, {"type": "null"}]},
        },
        "$defs": {"Pet": {"type": "object", "properties": {"kind": {"type": "string"}}}},
    }
    before = copy.deepcopy(schema)

    closed = close_object_schemas(schema)

    assert closed["additionalProperties"] is False
    assert closed["properties"]["person"]["additionalProperties"] is False
    assert closed["properties"]["tags"]["items"]["additionalProperties"] is False
    assert closed["properties"]["either"]["anyOf"][0]["additionalProperties"] is False
    assert closed["$defs"]["Pet"]["additionalProperties"] is False
    assert "required" not in closed  # nothing else changes
    assert schema == before


def test_close_object_schemas_keeps_what_an_object_says_about_extra_properties():
    schema = {"type": "object", "additionalProperties": {"type": "integer"}}

    assert close_object_schemas(schema) == schema


# -- strict_json_schema (OpenAI) -------------------------------------------------------------
class Pet(BaseModel):
    kind: str


class Person(BaseModel):
    name: str = Field(title="The name", min_length=1)
    nickname: str | None = None
    pets: list[Pet] = []


def test_structured_output_schema_becomes_strict_on_a_copy():
    schema = Person.model_json_schema()
    before = copy.deepcopy(schema)

    strict = strict_json_schema(schema, force=True)

    assert strict is not None
    assert strict["additionalProperties"] is False
    assert strict["required"] == ["name", "nickname", "pets"]
    assert "title" not in strict
    assert strict["properties"]["name"] == {"type": "string"}  # title and minLength dropped
    assert "default" not in strict["properties"]["nickname"]
    assert strict["$defs"]["Pet"]["additionalProperties"] is False
    assert strict["$defs"]["Pet"]["required"] == ["kind"]
    assert schema == before


def test_a_ref_with_siblings_becomes_an_any_of():
    schema = {
        "type": "object",
        "properties": {"pet": {"$ref": "#/$defs/Pet", "description": "The pet"}},
        "required": ["pet"],
        "$defs": {"Pet": {"type": "object", "properties": {}}},
    }

    strict = strict_json_schema(schema, force=True)

    assert strict is not None
    assert strict["properties"]["pet"] == {
        "description": "The pet",
        "anyOf": [{"$ref": "#/$defs/Pet"}],
    }


def test_tool_parameters_with_every_argument_required_become_strict():
    parameters = {
        "type": "object",
        "properties": {"city": {"type": "string", "format": "date"}},
        "required": ["city"],
    }

    assert strict_json_schema(parameters, force=False) == {
        **parameters,
        "additionalProperties": False,
    }


NOT_STRICT = {
    "an optional argument": {"type": "object", "properties": {"a": {"type": "string"}}},
    "a default": {
        "type": "object",
        "properties": {"a": {"type": "string", "default": "x"}},
        "required": ["a"],
    },
    "open additional properties": {
        "type": "object",
        "properties": {},
        "additionalProperties": True,
    },
    "a keyword strict mode rejects": {
        "type": "object",
        "properties": {"a": {"type": "string", "minLength": 2}},
        "required": ["a"],
    },
    "a keyword strict mode doesn't list": {
        "type": "object",
        "properties": {"a": {"type": "string", "examples": ["x"]}},
        "required": ["a"],
    },
    "a format strict mode doesn't list": {
        "type": "object",
        "properties": {"a": {"type": "string", "format": "uri"}},
        "required": ["a"],
    },
    "a root that is not an object": {"type": "string"},
}


@pytest.mark.parametrize("schema", NOT_STRICT.values(), ids=NOT_STRICT.keys())
def test_tool_parameters_that_strictness_would_change_are_not_made_strict(schema):
    assert strict_json_schema(schema, force=False) is None

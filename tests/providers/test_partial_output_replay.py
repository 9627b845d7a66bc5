"""Partial structured output over each provider family's recorded streaming format.

No recording streams a structured answer, so each test builds one: the family's recorded
``supports_streaming_responses`` answer (../shared/fixtures/, read in place) with its text
deltas replaced by the JSON answer of a ``chat_with_schema`` recording, cut into small
pieces; every other event (starts, stops, usage, a Responses API's whole-text ``done``
events, Bedrock's binary frames) stays as recorded, the answer's text put in where the
recorded text was. The provider parses it, the chat (``with_schema``) sends a partial per
change, and the final ``parsed`` must be the recorded answer's object.
"""

from __future__ import annotations

import binascii
import json
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
from botocore.eventstream import EventStreamBuffer
from pydantic import BaseModel

import agentloop
from agentloop import providers
from agentloop.messages import PartialOutput, TextDelta
from agentloop.providers.anthropic import AnthropicProvider
from agentloop.providers.bedrock import BedrockProvider
from agentloop.providers.gemini import GeminiProvider
from agentloop.providers.openai import OpenAIProvider
from agentloop.providers.openai_responses import OpenAIResponsesProvider
from tests.providers import cassettes
from tests.providers.cassettes import CLOUD, FIXTURES, Cassette, Interaction

cassettes.require_fixtures(FIXTURES)
cassettes.require_fixtures(CLOUD)


class Person(BaseModel):
    """The recorded schema: ``{"name": string, "age": integer}``, both required."""

    name: str
    age: int


SCHEMA_ANSWERS = {
    "anthropic": "chat_with_schema_with_anthropic_claude-haiku-4-5_accepts_a_json_schema_and_"
    "returns_structured_output",
    "openai": "chat_with_schema_with_openai_gpt-5-nano_accepts_a_json_schema_and_returns_"
    "structured_output",
    "openrouter": "chat_with_schema_with_openrouter_claude-haiku-4-5_accepts_a_json_schema_and_"
    "returns_structured_output",
}


def recorded_answer(family: str) -> str:
    """The JSON text a ``chat_with_schema`` recording answered ({"name":"John","age":30})."""
    [interaction] = cassettes.cached(SCHEMA_ANSWERS[family]).interactions
    data = interaction.response_json()
    if "content" in data:  # Anthropic Messages
        return "".join(b["text"] for b in data["content"] if b["type"] == "text")
    if "choices" in data:  # Chat Completions
        return str(data["choices"][0]["message"]["content"])
    return "".join(  # Responses
        part["text"]
        for item in data["output"]
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    )


# -- where each wire format keeps a streamed text delta ----------------------------------------
def _anthropic_text(event: dict[str, Any]) -> str | None:
    delta = event.get("delta") or {}
    if event.get("type") == "content_block_delta" and delta.get("type") == "text_delta":
        return str(delta["text"])
    return None


def _anthropic_set(event: dict[str, Any], text: str) -> None:
    event["delta"]["text"] = text


def _chat_text(event: dict[str, Any]) -> str | None:
    choices = event.get("choices") or [{}]
    return (choices[0].get("delta") or {}).get("content") or None


def _chat_set(event: dict[str, Any], text: str) -> None:
    event["choices"][0]["delta"]["content"] = text


def _responses_text(event: dict[str, Any]) -> str | None:
    return str(event["delta"]) if event.get("type") == "response.output_text.delta" else None


def _responses_set(event: dict[str, Any], text: str) -> None:
    event["delta"] = text


def _gemini_parts(event: dict[str, Any]) -> list[dict[str, Any]]:
    candidates = event.get("candidates") or [{}]
    parts = (candidates[0].get("content") or {}).get("parts") or []
    return [part for part in parts if "text" in part and not part.get("thought")]


def _gemini_text(event: dict[str, Any]) -> str | None:
    return "".join(part["text"] for part in _gemini_parts(event)) or None


def _gemini_set(event: dict[str, Any], text: str) -> None:
    first, *others = _gemini_parts(event)
    first["text"] = text
    for part in others:
        part["text"] = ""


def _gemini_unfinished(event: dict[str, Any]) -> None:
    """A copy that is not the last: no finish reason, no usage (they come at the end)."""
    event.pop("usageMetadata", None)
    for candidate in event.get("candidates") or []:
        candidate.pop("finishReason", None)


def _bedrock_text(event: dict[str, Any]) -> str | None:
    return (event.get("delta") or {}).get("text") or None


def _bedrock_set(event: dict[str, Any], text: str) -> None:
    event["delta"]["text"] = text


@dataclass(frozen=True)
class Family:
    """A wire format: where its text deltas are, and how to write one."""

    text: Callable[[dict[str, Any]], str | None]
    set_text: Callable[[dict[str, Any], str], None]
    unfinished: Callable[[dict[str, Any]], None] = lambda event: None


ANTHROPIC = Family(_anthropic_text, _anthropic_set)
CHAT = Family(_chat_text, _chat_set)
RESPONSES = Family(_responses_text, _responses_set)
GEMINI = Family(_gemini_text, _gemini_set, _gemini_unfinished)
BEDROCK = Family(_bedrock_text, _bedrock_set)


def carrying(events: list[tuple[Any, Any]], family: Family, pieces: list[str]) -> list[Any]:
    """``events`` (``(framing, payload)`` pairs; a payload that is no JSON object passes
    as it is) with their text deltas replaced by ``pieces``: the first delta becomes one copy
    per piece but the last, the last delta carries the last piece (one delta only: it becomes
    all of them, each copy but the last unfinished), those between go; the recorded whole
    text, wherever it is repeated (``done`` events), becomes the answer."""

    def is_delta(payload: Any) -> bool:
        return isinstance(payload, dict) and family.text(payload) is not None

    deltas = [i for i, (_, payload) in enumerate(events) if is_delta(payload)]
    assert deltas, "the recording streams no text"
    whole = "".join(str(family.text(events[i][1])) for i in deltas)
    answer = "".join(pieces)
    out: list[Any] = []
    for index, (framing, payload) in enumerate(events):
        if index == deltas[0]:
            for number, piece in enumerate(pieces if len(deltas) == 1 else pieces[:-1]):
                copy = json.loads(json.dumps(payload))
                family.set_text(copy, piece)
                if len(deltas) == 1 and number < len(pieces) - 1:
                    family.unfinished(copy)
                out.append((framing, copy))
            if len(deltas) > 1:
                continue
        elif index == deltas[-1]:
            payload = json.loads(json.dumps(payload))
            family.set_text(payload, pieces[-1])
            out.append((framing, payload))
        elif index not in deltas:
            out.append((framing, _replaced(payload, whole, answer)))
    return out


def _replaced(value: Any, whole: str, answer: str) -> Any:
    if isinstance(value, dict):
        return {key: _replaced(item, whole, answer) for key, item in value.items()}
    if isinstance(value, list):
        return [_replaced(item, whole, answer) for item in value]
    return answer if value == whole else value


# -- the two ways a stream is written ----------------------------------------------------------
def sse_with(interaction: Interaction, family: Family, pieces: list[str]) -> Interaction:
    """A recorded SSE answer carrying ``pieces`` (each ``event:`` line kept with its data;
    comments and ``[DONE]`` as they were)."""
    events: list[tuple[Any, Any]] = []
    for block in interaction.response_text.split("\n\n"):
        if not block.strip():
            continue
        lines = block.split("\n")
        data = [line[len("data:") :].strip() for line in lines if line.startswith("data:")]
        others = [line for line in lines if not line.startswith("data:")]
        payload = json.loads(data[0]) if data and data[0].startswith("{") else (data or [None])[0]
        events.append((others, payload))
    written = []
    for others, payload in carrying(events, family, pieces):
        if payload is None:
            written.append("\n".join(others))
        else:
            text = payload if isinstance(payload, str) else json.dumps(payload)
            written.append("\n".join([*others, f"data: {text}"]))
    return replace(interaction, response_text="\n\n".join(written) + "\n\n", response_bytes=b"")


def _frame(headers: dict[str, str], payload: bytes) -> bytes:
    """One AWS event-stream frame: the prelude and its CRC, string headers, the payload, the
    message CRC."""
    encoded = b"".join(
        struct.pack("B", len(name)) + name.encode() + b"\x07" + struct.pack(">H", len(value))
        + value.encode()
        for name, value in headers.items()
    )  # fmt: skip
    total = 12 + len(encoded) + len(payload) + 4
    prelude = struct.pack(">II", total, len(encoded))
    prelude += struct.pack(">I", binascii.crc32(prelude))
    message = prelude + encoded + payload
    return message + struct.pack(">I", binascii.crc32(message))


def frames_with(interaction: Interaction, pieces: list[str]) -> Interaction:
    """Bedrock's recorded event-stream answer carrying ``pieces`` (frames encoded again)."""
    buffer = EventStreamBuffer()
    buffer.add_data(interaction.response_bytes)
    events = [(dict(message.headers), json.loads(message.payload)) for message in buffer]
    out = b"".join(
        _frame(headers, json.dumps(payload).encode())
        for headers, payload in carrying(events, BEDROCK, pieces)
    )
    return replace(interaction, response_bytes=out, response_text="")


def pieces_of(text: str, size: int = 3) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


# -- the cases ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    recording: str
    folder: str  # "providers" or "providers-cloud"
    family: Family | None  # None: Bedrock's binary frames
    provider: Callable[..., Any]
    model: str
    answer_from: str  # the chat_with_schema recording whose answer it carries


CASES = {
    "anthropic": Case(
        "chat_streaming_responses_anthropic_claude-haiku-4-5_supports_streaming_responses",
        "providers", ANTHROPIC, AnthropicProvider, "claude-haiku-4-5", "anthropic",
    ),
    "openai-responses": Case(
        "chat_streaming_responses_openai_gpt-5-nano_supports_streaming_responses",
        "providers", RESPONSES, OpenAIResponsesProvider, "gpt-5-nano", "openai",
    ),
    "azure-responses": Case(
        "chat_responses_protocol_dialects_with_azure_gpt-5-nano_streams_responses",
        "providers-cloud", RESPONSES, OpenAIResponsesProvider, "gpt-5-nano", "openai",
    ),
    "openrouter-chat-completions": Case(
        "chat_streaming_responses_openrouter_claude-haiku-4-5_supports_streaming_responses",
        "providers", CHAT, OpenAIProvider, "anthropic/claude-haiku-4.5", "openrouter",
    ),
    "ollama-chat-completions": Case(
        "chat_streaming_responses_ollama_qwen3_supports_streaming_responses",
        "providers", CHAT, OpenAIProvider, "qwen3", "openrouter",
    ),
    "azure-chat-completions": Case(
        "chat_streaming_responses_azure_grok-4-1-fast-non-reasoning_supports_streaming_responses",
        "providers-cloud", CHAT, OpenAIProvider, "grok-4-1-fast-non-reasoning", "openrouter",
    ),
    "gemini": Case(
        "chat_streaming_responses_gemini_gemini-2_5-flash_supports_streaming_responses",
        "providers", GEMINI, GeminiProvider, "gemini-2.5-flash", "anthropic",
    ),
    "vertex-gemini": Case(
        "chat_streaming_responses_vertexai_gemini-2_5-flash_supports_streaming_responses",
        "providers-cloud", GEMINI, GeminiProvider, "gemini-2.5-flash", "anthropic",
    ),
    "bedrock": Case(
        "chat_streaming_responses_bedrock_amazon_nova-2-lite-v1_0_supports_streaming_responses",
        "providers-cloud", None, BedrockProvider, "us.amazon.nova-2-lite-v1:0", "anthropic",
    ),
}  # fmt: skip


def streamed_answer(case: Case, answer: str) -> Interaction:
    folder = FIXTURES if case.folder == "providers" else CLOUD
    interactions = cassettes.cached(case.recording, folder).interactions
    recorded = [i for i in interactions if i.is_stream or i.response_bytes]  # SSE, or frames
    first = recorded[0]
    if case.family is None:
        return frames_with(first, pieces_of(answer))
    return sse_with(first, case.family, pieces_of(answer))


@pytest.fixture
def registered(aws_env) -> Iterator[Callable[[Case, Interaction], Cassette]]:
    names: list[str] = []

    def register(case: Case, interaction: Interaction) -> Cassette:
        cassette = Cassette(case.recording, [interaction])
        options: dict[str, Any] = {"transport": cassette.transport()}
        if case.provider is not BedrockProvider:
            options["api_key"] = "test-key"
        providers.register("partial-replay", case.provider(**options))
        names.append("partial-replay")
        return cassette

    yield register
    for name in names:
        providers.unregister(name)


@pytest.mark.parametrize("key", list(CASES), ids=list(CASES))
def test_a_structured_answer_streamed_in_the_family_format_sends_partials(key, registered):
    case = CASES[key]
    answer = recorded_answer(case.answer_from)
    cassette = registered(case, streamed_answer(case, answer))
    chat = agentloop.chat(f"partial-replay:{case.model}").with_schema(Person)
    seen: list[Any] = []

    message = chat.ask("Generate a person named John who is 30 years old", stream=seen.append)

    assert len(cassette.sent) == 1
    streamed = "".join(event.text for event in seen if isinstance(event, TextDelta))
    assert streamed == message.content == answer  # the pieces, in order, and nothing else
    values = [event.value for event in seen if isinstance(event, PartialOutput)]
    assert values[-1] == json.loads(answer) == message.parsed  # the recorded shape
    # '{"n', 'ame', '":"', 'Joh', 'n",', '"ag', 'e":', '30}': a value per change
    assert answer == '{"name":"John","age":30}'
    assert values == [{}, {"name": ""}, {"name": "Joh"}, {"name": "John"}, message.parsed]

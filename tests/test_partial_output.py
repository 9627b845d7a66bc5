"""Partial structured output (issue 44, item 1): a ``with_schema`` answer's JSON parsed and
validated as it streams, sent as ``PartialOutput`` to the stream callback (sync and async
verbs, in-memory and persisted chats), as ``partial_output`` live events from a background
step, and as ``data-agentloop-output`` parts of useChat's UI message stream; the final
validation and the stored row are as without streaming. Each provider family's wire format
is covered in tests/providers/test_partial_output_replay.py.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import pytest
from django.urls import reverse
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

import agentloop
from agentloop import live_events as events
from agentloop.engine import _effects
from agentloop.messages import PartialOutput, TextDelta
from agentloop.models import Chat
from agentloop.runners import wait_for_embedded_jobs
from agentloop.streaming import FinalMessageEvent, PartialOutputEvent, TextDeltaEvent
from agentloop.testing import stream
from tests import guardrail_checks as checks
from tests.helpers import wait_until

DEADLINE = 30.0


class Person(BaseModel):
    name: str
    age: int
    hobbies: list[str] = []


#: {"name": "John", "age": 30, "hobbies": ["chess", "go"]} as a model might stream it.
PIECES = ('{"na', 'me": "Jo', 'hn", "ag', 'e": 3', '0, "hob', 'bies": ["ch', 'ess", "g', 'o"]}')
#: what a callback sees: each value once, in order (30 only once both digits are there).
PARTIALS = [
    {},
    {"name": "Jo"},
    {"name": "John"},
    {"name": "John", "age": 30},
    {"name": "John", "age": 30, "hobbies": ["ch"]},
    {"name": "John", "age": 30, "hobbies": ["chess", "g"]},
    {"name": "John", "age": 30, "hobbies": ["chess", "go"]},
]
FINAL = {"name": "John", "age": 30, "hobbies": ["chess", "go"]}


@pytest.fixture
def memory_chat(scripted):
    return agentloop.chat("scripted:test").with_schema(Person)


def partials(seen: list[Any]) -> list[Any]:
    return [event.value for event in seen if isinstance(event, PartialOutput)]


# -- in-process: the stream callback ------------------------------------------------------------
def test_a_structured_answer_streams_as_partial_objects_each_a_new_one(memory_chat, scripted):
    scripted.add(stream(*PIECES))
    seen: list[Any] = []

    answer = memory_chat.ask("Invent John", stream=seen.append)

    assert partials(seen) == PARTIALS
    assert answer.parsed == FINAL
    assert answer.content == "".join(PIECES)


def test_each_partial_follows_the_text_chunk_that_made_it(memory_chat, scripted):
    scripted.add(stream(*PIECES))
    seen: list[Any] = []

    memory_chat.ask("Invent John", stream=seen.append)

    kinds = [event.kind for event in seen]
    assert kinds.count("text") == len(PIECES)
    assert all(kinds[i - 1] == "text" for i, kind in enumerate(kinds) if kind == "partial_output")
    assert "".join(event.text for event in seen if isinstance(event, TextDelta)) == "".join(PIECES)


def test_an_iterated_run_hands_out_each_partial_as_an_event(memory_chat, scripted):
    """``chat.stream()`` (docs/streaming.md) carries the partials too, after their text."""

    scripted.add(stream(*PIECES))

    seen = list(memory_chat.stream("Invent John"))

    assert [event.value for event in seen if isinstance(event, PartialOutputEvent)] == PARTIALS
    assert [type(event) for event in seen[:2]] == [TextDeltaEvent, PartialOutputEvent]
    assert isinstance(seen[-1], FinalMessageEvent) and seen[-1].message.parsed == FINAL


def test_an_async_iterated_run_hands_out_each_partial_as_an_event(memory_chat, scripted):
    scripted.add(stream(*PIECES))

    async def main() -> list[Any]:
        return [event async for event in memory_chat.astream("Invent John")]

    seen = asyncio.run(main())

    assert [event.value for event in seen if isinstance(event, PartialOutputEvent)] == PARTIALS


def test_a_chat_without_a_schema_gets_only_its_chunks(scripted):
    scripted.add(stream(*PIECES))
    seen: list[Any] = []

    agentloop.chat("scripted:test").ask("Invent John", stream=seen.append)

    assert {event.kind for event in seen} == {"text"}


def test_a_json_schema_streams_partials_parsed_but_not_validated(scripted):
    scripted.add(stream('{"name": "Jo', 'hn", "age": "thirty"}'))
    schema = {"type": "object", "properties": {"name": {"type": "string"}}}
    seen: list[Any] = []

    answer = agentloop.chat("scripted:test").with_schema(schema).ask("Hi", stream=seen.append)

    assert partials(seen) == [{"name": "Jo"}, {"name": "John", "age": "thirty"}]
    assert answer.parsed == {"name": "John", "age": "thirty"}


def test_text_that_is_not_json_never_raises_and_sends_no_partial(memory_chat, scripted):
    scripted.add(stream("Sure! ", "John is ", "30 {", "years old."))
    seen: list[Any] = []

    answer = memory_chat.ask("Invent John", stream=seen.append)

    assert partials(seen) == []
    assert (answer.content, answer.parsed) == ("Sure! John is 30 {years old.", None)


def test_broken_json_mid_stream_never_raises(memory_chat, scripted):
    scripted.add(stream('{"name": "John",', ' "age": 30,,', ' "x": ]', "}"))
    seen: list[Any] = []

    answer = memory_chat.ask("Invent John", stream=seen.append)

    assert partials(seen) == [{"name": "John"}]  # nothing after the JSON broke
    assert answer.parsed is None


def test_a_value_of_the_wrong_type_stops_the_partials_and_the_answer_is_kept_unparsed(
    memory_chat, scripted
):
    scripted.add(stream('{"name": "John", ', '"age": "thi', 'rty"}'))
    seen: list[Any] = []

    answer = memory_chat.ask("Invent John", stream=seen.append)

    assert partials(seen) == [{"name": "John"}]  # {"age": "thi"} is not an int: not sent
    assert (answer.content, answer.parsed) == ('{"name": "John", "age": "thirty"}', None)


def test_a_final_answer_missing_a_field_is_kept_with_parsed_none_as_today(memory_chat, scripted):
    scripted.add(stream('{"name": ', '"John"}'))
    seen: list[Any] = []

    answer = memory_chat.ask("Invent John", stream=seen.append)

    assert partials(seen) == [{}, {"name": "John"}]  # valid as far as it went
    assert (answer.content, answer.parsed) == ('{"name": "John"}', None)


def test_an_async_verb_awaits_an_async_callback_for_each_partial(memory_chat, scripted):
    scripted.add(stream(*PIECES))
    seen: list[Any] = []

    async def collect(event: Any) -> None:
        await asyncio.sleep(0)
        seen.append(event)

    answer = asyncio.run(memory_chat.aask("Invent John", stream=collect))

    assert partials(seen) == PARTIALS
    assert answer.parsed == FINAL


def test_partials_are_held_with_the_chunks_while_input_guardrails_judge(
    memory_chat, scripted, monkeypatch
):
    release = threading.Event()
    monkeypatch.setattr(checks, "RELEASE", release)
    memory_chat.with_guardrails(checks.slow_moderation)
    scripted.add(stream(*PIECES))
    seen: list[Any] = []
    answers: list[Any] = []
    thread = threading.Thread(
        target=lambda: answers.append(memory_chat.ask("Invent John", stream=seen.append))
    )
    thread.start()

    wait_until(lambda: scripted.remaining == 0, "the model call")
    assert seen == []  # not judged yet: neither the text nor the object shows
    release.set()
    thread.join(30)

    assert partials(seen) == PARTIALS
    kinds = [event.kind for event in seen]
    assert all(kinds[i - 1] == "text" for i, kind in enumerate(kinds) if kind == "partial_output")
    assert answers[0].parsed == FINAL


@pytest.mark.django_db
def test_a_persisted_chat_streams_partials_and_stores_the_validated_row(user, scripted):
    chat = Chat.objects.create(model="scripted:test", owner=user).with_schema(Person)
    scripted.add(stream('{"name": "John", "age": 30', "}"))
    seen: list[Any] = []

    answer = chat.ask("Invent John", stream=seen.append)

    assert partials(seen) == [{"name": "John"}, {"name": "John", "age": 30}]
    row = chat.messages.get(pk=answer.pk)
    # the row as without streaming: validated, the model's defaults filled in
    assert (row.status, row.parsed) == ("complete", {"name": "John", "age": 30, "hobbies": []})


def test_a_long_answer_is_parsed_in_linear_time(memory_chat, scripted, monkeypatch):
    """A 20 KB answer in 4-character deltas: about 5,000 deltas. Parsing the whole text at
    each one would read about 50 million characters (0.6 s here); parsed once it grew by a
    32nd, it reads about 33 times the answer (15 ms; bench/partial_output.py)."""
    document = {
        "name": "John",
        "age": 30,
        "hobbies": [f"hobby number {i}, practised with great care" for i in range(480)],
    }
    text = json.dumps(document)
    assert len(text) > 20_000
    read: list[int] = []
    real = _effects.from_json

    def counting(data: str, **options: Any) -> Any:
        read.append(len(data))
        return real(data, **options)

    monkeypatch.setattr(_effects, "from_json", counting)
    scripted.add(stream(*[text[i : i + 4] for i in range(0, len(text), 4)]))
    seen: list[Any] = []

    answer = memory_chat.ask("Invent John", stream=seen.append)

    bound = _effects.ALWAYS_PARSED**2 + (_effects.REPARSE_FRACTION + 2) * len(text)
    assert sum(read) < bound < len(text) ** 2 / 8 / 10  # a tenth of parsing every delta
    assert partials(seen)[-1] == document == answer.parsed  # the end is always parsed
    values = partials(seen)
    assert all(a != b for a, b in zip(values, values[1:], strict=False))  # each one new


def test_a_number_being_written_is_left_out_until_it_ends():
    parser = _effects.OutputParser(Person)

    started = parser.feed('{"age": 1')
    assert started is not None and started.value == {}  # not {"age": 1}
    assert parser.feed("2") is None  # nor {"age": 12} yet: it may go on
    grown = parser.feed(', "name": "A')

    assert grown is not None and grown.value == {"age": 12, "name": "A"}


# -- what arrives from a provider: any JSON, cut anywhere; any text -----------------------------
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


def cut(text: str, points: list[int]) -> list[str]:
    edges = sorted({0, len(text), *(point % (len(text) + 1) for point in points)})
    return [text[a:b] for a, b in zip(edges, edges[1:], strict=False)]


@settings(max_examples=100, deadline=None)
@given(JSON_VALUES, st.lists(st.integers(0, 10**6)))
def test_any_json_cut_anywhere_ends_as_itself_each_partial_new(document, points):
    text = json.dumps(document)
    parser = _effects.OutputParser(None)  # a JSON schema: parsed, not validated

    sent = [parser.feed(piece) for piece in cut(text, points)] + [parser.flush(ended=True)]

    values = [partial.value for partial in sent if partial is not None]
    assert values[-1] == document
    assert all(a != b for a, b in zip(values, values[1:], strict=False))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(), max_size=12))
def test_any_text_never_raises_and_a_model_sees_only_objects(pieces):
    parser = _effects.OutputParser(Person)

    sent = [parser.feed(piece) for piece in pieces] + [parser.flush(ended=True)]

    assert all(isinstance(partial.value, dict) for partial in sent if partial is not None)


# -- live events (Redis) from a background step ------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_a_background_step_publishes_each_partial_as_a_live_event(redis_events, user, scripted):
    chat = Chat.objects.create(model="scripted:test", owner=user).with_schema(Person)
    scripted.add(stream(*PIECES))

    chat.ask_later("Invent John")
    chat.complete_later()
    assert wait_for_embedded_jobs(DEADLINE)
    assert events.flush(DEADLINE)

    backend = events.get_backend()
    recorded = redis_events.xrange(backend.stream(events.chat_key(chat)))
    published = [json.loads(fields[b"event"]) for _, fields in recorded]
    kinds = [(event["type"], event["data"]) for event in published]
    assert [data["value"] for kind, data in kinds if kind == "partial_output"] == PARTIALS
    [answer] = [data for kind, data in kinds if kind == "message" and data["role"] == "assistant"]
    assert answer["parsed"] == FINAL


# -- useChat: data parts -----------------------------------------------------------------------
def ask_over_usechat(client: Any, chat: Chat, text: str) -> list[dict[str, Any]]:
    """POST the AI SDK's chat request for ``text``; the UI message stream's parts, to
    ``[DONE]`` (which must come)."""
    request = {
        "id": str(chat.pk),
        "trigger": "submit-message",
        "messages": [{"id": "m1", "role": "user", "parts": [{"type": "text", "text": text}]}],
    }
    response = client.post(
        reverse("agentloop:usechat"), json.dumps(request), content_type="application/json"
    )
    assert response.status_code == 200, response.content
    buffer, parts = b"", []
    deadline = time.monotonic() + DEADLINE
    for piece in response.streaming_content:
        buffer += piece
        while b"\n\n" in buffer:
            block, buffer = buffer.split(b"\n\n", 1)
            if block.startswith(b":"):
                continue  # a keep-alive comment
            data = block.removeprefix(b"data: ")
            if data == b"[DONE]":
                return parts
            parts.append(json.loads(data))
        assert time.monotonic() < deadline, f"no [DONE] in time; so far {parts}"
    raise AssertionError(f"the stream ended without [DONE]: {parts}")


@pytest.fixture
def fast_polls(settings):
    settings.AGENTLOOP = {**settings.AGENTLOOP, "EVENTS_POLL_INTERVAL": 0.02}
    yield
    wait_for_embedded_jobs(DEADLINE)


def output_parts(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [part for part in parts if part["type"] == "data-agentloop-output"]


@pytest.mark.django_db(transaction=True)
def test_with_redis_usechat_streams_the_partials_as_one_data_part_replaced(
    redis_events, fast_polls, owner, user, scripted
):
    chat = Chat.objects.create(model="scripted:test", owner=user).with_schema(Person)
    scripted.add(stream(*PIECES, delay=0.05))

    parts = ask_over_usechat(owner, chat, "Invent John")
    assert wait_for_embedded_jobs(DEADLINE)

    data = output_parts(parts)
    values = [part["data"] for part in data]
    # Live events are best effort: a loaded machine may end the stream from the saved row
    # before the last partials came (as chunks, text-delta parts). Those that came are in
    # order, the saved, validated one last.
    assert values[-1] == FINAL
    assert len(values) >= 2, parts  # partials while it streamed, not only the saved one
    order = [PARTIALS.index(value) for value in values[:-1]]
    assert order == sorted(set(order)), values
    assert {part["id"] for part in data} == {data[0]["id"]}  # one part, replaced each time
    first = parts.index(data[0])
    assert parts[first - 1]["type"] in ("text-delta", "start-step")
    assert parts[-1] == {"type": "finish", "finishReason": "stop"}


@pytest.mark.django_db(transaction=True)
def test_without_redis_usechat_sends_the_saved_output_and_the_history_keeps_it(
    fast_polls, owner, user, scripted
):
    chat = Chat.objects.create(model="scripted:test", owner=user).with_schema(Person)
    scripted.add(stream(*PIECES))

    parts = ask_over_usechat(owner, chat, "Invent John")
    assert wait_for_embedded_jobs(DEADLINE)
    history = owner.get(reverse("agentloop:usechat-messages", args=[chat.pk])).json()

    # the database backend has no per-chunk events: the saved answer brings the output
    assert [part["data"] for part in output_parts(parts)] == [FINAL]
    answer = chat.messages.get(role="assistant")
    [message] = [m for m in history["messages"] if m["role"] == "assistant"]
    assert output_parts(message["parts"]) == [
        {"type": "data-agentloop-output", "id": f"output-{answer.pk}", "data": FINAL}
    ]


@pytest.mark.django_db(transaction=True)
def test_an_answer_that_fails_validation_sends_no_final_output(fast_polls, owner, user, scripted):
    chat = Chat.objects.create(model="scripted:test", owner=user).with_schema(Person)
    scripted.add(stream('{"name": "John"}'))

    parts = ask_over_usechat(owner, chat, "Invent John")
    assert wait_for_embedded_jobs(DEADLINE)

    assert output_parts(parts) == []
    assert chat.messages.get(role="assistant").parsed is None
    assert parts[-1] == {"type": "finish", "finishReason": "stop"}


def test_the_benchmark_runs_and_parses_far_less_than_at_every_delta():
    from bench.partial_output import main  # the benchmark script, run small (timed nowhere)

    figures = main(["--size", "4000", "--repeat", "1"])

    ours, every = figures["as the engine parses"], figures["parsed at every delta"]
    assert ours["parsed"] * 5 < every["parsed"]
    assert 0 < ours["partials"] < every["partials"]

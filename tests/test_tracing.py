"""OpenTelemetry tracing (docs/tracing.md): spans after the GenAI semantic conventions, a
turn's trace across verbs and processes, content only on request, nothing while off.

Spans are collected with the SDK's in-memory exporter here; a Celery worker process writes
its spans to a file (tests/span_files.py) that the cross-job test reads.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from opentelemetry import trace

import agentloop
from agentloop import Agent
from agentloop.exceptions import RateLimitError, ServerError
from agentloop.models import Chat
from agentloop.testing import ScriptedProvider, reply, tool_call
from tests import workers
from tests.span_files import memory_exporter, read_span_file
from tests.tools import add, explode, step_one, step_three, step_two

Span = dict[str, Any]


def records() -> list[Span]:
    """The finished spans, in the order they ended."""
    # Function-local: the record shape is the worker file's too (one definition).
    from tests.span_files import as_record

    return [as_record(span) for span in memory_exporter().get_finished_spans()]


def named(spans: list[Span], prefix: str) -> list[Span]:
    return [span for span in spans if span["name"].startswith(prefix)]


def only(spans: list[Span], prefix: str) -> Span:
    found = named(spans, prefix)
    assert len(found) == 1, [span["name"] for span in spans]
    return found[0]


def agentloop_with(**values: Any) -> dict[str, Any]:
    return {**settings.AGENTLOOP, "MODEL_RETRIES": 0, **values}


@pytest.fixture
def spans() -> Iterator[list[Span]]:
    """TRACING on; the spans finished so far are read with ``records()``."""
    memory_exporter().clear()
    with override_settings(AGENTLOOP=agentloop_with(TRACING=True)):
        yield []
    memory_exporter().clear()


@pytest.fixture
def content() -> Iterator[None]:
    """TRACING and TRACE_CONTENT on."""
    memory_exporter().clear()
    with override_settings(AGENTLOOP=agentloop_with(TRACING=True, TRACE_CONTENT=True)):
        yield
    memory_exporter().clear()


def two_rounds(scripted: ScriptedProvider) -> None:
    scripted.add(
        reply("", tool_call("add", {"a": 2, "b": 3}, id="call_a")),
        reply("It is 5.", usage=agentloop.messages.TokenUsage(input_tokens=30, output_tokens=4)),
    )


# -- the spans of a turn --------------------------------------------------------------------
def test_a_memory_turn_is_one_trace_an_agent_span_over_model_and_tool_spans(spans, scripted):
    two_rounds(scripted)
    chat = agentloop.chat("scripted:test", tools=[add])

    chat.ask("What is 2 + 3?")

    finished = records()
    assert [span["name"] for span in finished] == [
        "chat test", "execute_tool add", "chat test", "invoke_agent",
    ]  # fmt: skip
    turn = only(finished, "invoke_agent")
    assert turn["parent_id"] is None and turn["kind"] == "INTERNAL"
    assert {span["trace_id"] for span in finished} == {turn["trace_id"]}
    assert all(span["parent_id"] == turn["span_id"] for span in finished if span is not turn)
    chat_id = turn["attributes"]["agentloop.chat.id"]
    assert chat_id and all(s["attributes"]["agentloop.chat.id"] == chat_id for s in finished)
    assert turn["attributes"]["gen_ai.operation.name"] == "invoke_agent"
    assert "gen_ai.agent.name" not in turn["attributes"]


def test_a_model_call_span_carries_the_conventions_attributes(spans, scripted):
    two_rounds(scripted)
    chat = agentloop.chat("scripted:test", tools=[add]).with_temperature(0.2)

    chat.ask("What is 2 + 3?")

    first, last = named(records(), "chat ")
    assert first["kind"] == "CLIENT" and first["status"] == "UNSET"
    attributes = last["attributes"]
    assert {key: attributes[key] for key in attributes if key.startswith("gen_ai.")} == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "scripted",
        "gen_ai.request.model": "test",
        "gen_ai.request.temperature": 0.2,
        "gen_ai.response.model": "test",
        "gen_ai.usage.input_tokens": 30,
        "gen_ai.usage.output_tokens": 4,
        "gen_ai.response.finish_reasons": ["stop"],
        "gen_ai.conversation.id": attributes["agentloop.chat.id"],
    }
    assert first["attributes"]["gen_ai.response.finish_reasons"] == ["tool_calls"]


def test_a_tool_span_names_the_tool_and_its_call(spans, scripted):
    two_rounds(scripted)

    agentloop.chat("scripted:test", tools=[add]).ask("What is 2 + 3?")

    span = only(records(), "execute_tool")
    assert span["name"] == "execute_tool add" and span["kind"] == "INTERNAL"
    assert span["status"] == "UNSET"
    assert span["attributes"]["gen_ai.operation.name"] == "execute_tool"
    assert span["attributes"]["gen_ai.tool.name"] == "add"
    assert span["attributes"]["gen_ai.tool.call.id"] == "call_a"
    assert span["attributes"]["gen_ai.tool.type"] == "function"


def test_the_response_id_is_recorded_when_the_provider_gives_one(spans, scripted):
    answer = reply("Hi.")
    answer.provider_data["id"] = "resp_123"
    scripted.add(answer)

    agentloop.chat("scripted:test").ask("Hello")

    assert only(records(), "chat ")["attributes"]["gen_ai.response.id"] == "resp_123"


class Support(Agent):
    """Answers support questions (importable: a persisted chat names it by path)."""

    model = "scripted:test"
    instructions = "Help."


def test_an_agent_chat_names_its_agent(spans, scripted):
    scripted.add("Hello.")

    Support.chat().ask("Hi")

    turn = only(records(), "invoke_agent")
    assert turn["name"] == "invoke_agent Support"
    assert turn["attributes"]["gen_ai.agent.name"] == "Support"


def test_tools_run_on_threads_have_their_spans_under_the_verb(spans, scripted):
    scripted.add(
        reply("", tool_call("add", {"a": 1, "b": 2}), tool_call("add", {"a": 3, "b": 4})),
        "Done.",
    )
    chat = agentloop.chat("scripted:test", tools=[add]).with_tool_options(concurrency="threads")

    chat.ask("Add twice")

    finished = records()
    turn = only(finished, "invoke_agent")
    tools = named(finished, "execute_tool")
    assert len(tools) == 2
    assert {span["parent_id"] for span in tools} == {turn["span_id"]}
    assert {span["trace_id"] for span in tools} == {turn["trace_id"]}


# -- failures ------------------------------------------------------------------------------------
def test_a_failed_attempt_has_an_error_span_and_the_retry_a_span_of_its_own(spans, scripted):
    scripted.add(RateLimitError("slow down"), "Recovered.")
    chat = agentloop.chat("scripted:test")

    with override_settings(AGENTLOOP=agentloop_with(TRACING=True, MODEL_RETRIES=1,
                                                    RETRY_BACKOFF=0)):  # fmt: skip
        chat.ask("Hi")

    failed, succeeded = named(records(), "chat ")
    assert failed["status"] == "ERROR"
    assert failed["attributes"]["error.type"] == "RateLimitError"
    assert "gen_ai.response.model" not in failed["attributes"]
    assert succeeded["status"] == "UNSET" and "error.type" not in succeeded["attributes"]


def test_a_fallback_model_gets_a_span_per_attempt(spans, scripted):
    backup = ScriptedProvider("From the backup.")
    agentloop.providers.register("backup", backup)
    try:
        scripted.add(ServerError("down", status=503))
        chat = agentloop.chat("scripted:test").with_fallbacks("backup:spare")

        chat.ask("Hi")
    finally:
        agentloop.providers.unregister("backup")

    first, second = named(records(), "chat ")
    assert (first["name"], first["status"]) == ("chat test", "ERROR")
    assert first["attributes"]["error.type"] == "ServerError"
    assert (second["name"], second["status"]) == ("chat spare", "UNSET")
    assert second["attributes"]["gen_ai.provider.name"] == "backup"
    assert first["parent_id"] == second["parent_id"] == only(records(), "invoke_agent")["span_id"]


def test_a_tool_that_raises_has_an_error_span(spans, scripted):
    scripted.add(tool_call("explode"), "It broke.")

    agentloop.chat("scripted:test", tools=[explode]).ask("Go")

    span = only(records(), "execute_tool")
    assert span["status"] == "ERROR"
    assert span["attributes"]["error.type"] == "RuntimeError"


def test_a_model_error_that_ends_the_turn_marks_the_turn_span_failed(spans, scripted):
    scripted.add(RateLimitError("slow down"))

    with pytest.raises(RateLimitError):
        agentloop.chat("scripted:test").ask("Hi")

    turn = only(records(), "invoke_agent")
    assert turn["status"] == "ERROR" and turn["attributes"]["error.type"] == "RateLimitError"


# -- content --------------------------------------------------------------------------------------
CONTENT_KEYS = {
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.system_instructions",
    "gen_ai.tool.call.arguments",
    "gen_ai.tool.call.result",
}


def test_content_stays_off_the_spans_by_default(spans, scripted):
    two_rounds(scripted)

    agentloop.chat("scripted:test", tools=[add], instructions="Be terse.").ask("2 + 3?")

    finished = records()
    assert len(finished) == 4
    assert all(not CONTENT_KEYS & set(span["attributes"]) for span in finished)


def test_trace_content_puts_messages_arguments_and_results_on_the_spans(content, scripted):
    two_rounds(scripted)

    agentloop.chat("scripted:test", tools=[add], instructions="Be terse.").ask("2 + 3?")

    finished = records()
    first, last = named(finished, "chat ")
    assert json.loads(first["attributes"]["gen_ai.system_instructions"]) == [
        {"type": "text", "content": "Be terse."}
    ]
    assert json.loads(first["attributes"]["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": "2 + 3?"}]}
    ]
    assert json.loads(first["attributes"]["gen_ai.output.messages"]) == [
        {
            "role": "assistant",
            "parts": [
                {"type": "tool_call", "id": "call_a", "name": "add", "arguments": {"a": 2, "b": 3}}
            ],
            "finish_reason": "tool_calls",
        }
    ]
    assert json.loads(last["attributes"]["gen_ai.input.messages"])[1:] == [
        {
            "role": "assistant",
            "parts": [
                {"type": "tool_call", "id": "call_a", "name": "add", "arguments": {"a": 2, "b": 3}}
            ],
        },
        {
            "role": "tool",
            "parts": [{"type": "tool_call_response", "id": "call_a", "response": "5"}],
        },
    ]
    tool = only(finished, "execute_tool")
    assert json.loads(tool["attributes"]["gen_ai.tool.call.arguments"]) == {"a": 2, "b": 3}
    assert tool["attributes"]["gen_ai.tool.call.result"] == "5"
    turn = only(finished, "invoke_agent")
    assert json.loads(turn["attributes"]["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": "2 + 3?"}]}
    ]


# -- off ---------------------------------------------------------------------------------------
def test_tracing_off_makes_no_span_and_stores_no_context(scripted, user):
    memory_exporter().clear()
    two_rounds(scripted)
    chat = Chat.objects.create(model="scripted:test", owner=user).with_tools(add)

    chat.ask("What is 2 + 3?")

    assert memory_exporter().get_finished_spans() == ()
    chat.refresh_from_db()
    assert chat.trace_context == {}
    assert chat.messages.count() == 4  # the turn ran


def test_without_the_package_tracing_on_makes_no_span(spans, scripted, monkeypatch):
    # None in sys.modules makes ``import opentelemetry.trace`` fail, as when not installed.
    monkeypatch.setitem(sys.modules, "opentelemetry.trace", None)
    with override_settings(AGENTLOOP=agentloop_with(TRACING=True, MODEL_RETRIES=1)):
        scripted.add("Hi.")
        agentloop.chat("scripted:test").ask("Hello")

    assert records() == []


def test_the_check_warns_when_tracing_is_on_without_the_package(monkeypatch):
    from django.core.checks import run_checks

    with override_settings(AGENTLOOP=agentloop_with(TRACING=True)):
        assert [m.id for m in run_checks() if m.id == "agentloop.W004"] == []
        monkeypatch.setitem(sys.modules, "opentelemetry.trace", None)
        assert [m.id for m in run_checks() if m.id == "agentloop.W004"] == ["agentloop.W004"]


def test_tracing_must_be_a_boolean():
    from django.core.checks import run_checks

    with override_settings(AGENTLOOP={**settings.AGENTLOOP, "TRACING": "yes"}):
        errors = [m for m in run_checks() if m.id == "agentloop.E007"]

    assert len(errors) == 1 and "TRACING" in errors[0].msg


# -- a persisted chat: the turn's context on the row --------------------------------------------
@pytest.mark.django_db
def test_a_persisted_turn_stores_its_context_and_a_later_verb_joins_it(spans, scripted, user):
    two_rounds(scripted)
    chat = Chat.objects.create(model="scripted:test", owner=user).with_tools(add)

    chat.ask_later("What is 2 + 3?")
    # Another process would load the chat afresh: so does this.
    Chat.objects.get(pk=chat.pk).complete()

    finished = records()
    turn = only(finished, "invoke_agent")
    stored = Chat.objects.get(pk=chat.pk).trace_context
    assert stored["traceparent"].startswith(f"00-{turn['trace_id']}-{turn['span_id']}-")
    later = only(finished, "agentloop.complete")
    assert later["parent_id"] == turn["span_id"]
    assert {span["trace_id"] for span in finished} == {turn["trace_id"]}
    assert [span["parent_id"] for span in named(finished, "chat ")] == [later["span_id"]] * 2
    assert only(finished, "execute_tool")["parent_id"] == later["span_id"]
    assert {span["attributes"]["agentloop.chat.id"] for span in finished} == {str(chat.pk)}


@pytest.mark.django_db
def test_a_new_turn_replaces_the_stored_context(spans, scripted, user):
    scripted.add("One.", "Two.")
    chat = Chat.objects.create(model="scripted:test", owner=user)

    chat.ask("First")
    first = chat.trace_context["traceparent"]
    chat.ask("Second")

    turns = named(records(), "invoke_agent")
    assert len(turns) == 2 and turns[0]["trace_id"] != turns[1]["trace_id"]
    assert Chat.objects.get(pk=chat.pk).trace_context["traceparent"] != first
    assert turns[1]["trace_id"] in Chat.objects.get(pk=chat.pk).trace_context["traceparent"]


@pytest.mark.django_db
def test_a_turn_started_under_a_current_span_joins_its_trace(spans, scripted, user):
    scripted.add("Hello.")
    chat = Chat.objects.create(model="scripted:test", owner=user)

    with trace.get_tracer("a web app").start_as_current_span("POST /chats/1/messages"):
        chat.ask_later("Hi")
    chat.complete()

    finished = records()
    request = only(finished, "POST ")
    assert only(finished, "invoke_agent")["parent_id"] == request["span_id"]
    assert {span["trace_id"] for span in finished} == {request["trace_id"]}


@pytest.mark.django_db
def test_a_persisted_agent_chat_names_its_agent(spans, scripted, user):
    scripted.add("Hello.")
    chat = Support.create(owner=user)

    chat.ask("Hi")

    turn = only(records(), "invoke_agent")
    assert turn["name"] == "invoke_agent Support"
    assert turn["attributes"]["gen_ai.agent.name"] == "Support"


@pytest.mark.django_db
def test_a_subagents_turn_is_under_the_parents_tool_span(spans, user):
    # Function-local: the agents' provider and agents are only this test's.
    from tests.agents import Lead, register_agents_provider

    brains = register_agents_provider()
    try:
        brains.script(
            "You are LEAD.",
            tool_call("research", {"task": "When do owls hunt?", "topic": "owls"}, id="c1"),
            "At night, says research.",
        )
        brains.script("You are RESEARCH.", "At night.")
        lead = Lead.create(owner=user)

        lead.ask("Tell me about owls")
    finally:
        agentloop.providers.unregister("agents")

    finished = records()
    parent_turn = only(finished, "invoke_agent Lead")
    tool = only(finished, "execute_tool research")
    child_turn = only(finished, "invoke_agent Research")
    assert tool["parent_id"] == parent_turn["span_id"]
    assert child_turn["parent_id"] == tool["span_id"]
    child = Chat.objects.get(parent=lead)
    # The child's ask_later opened its turn; its complete() goes on under that turn.
    child_run = only(finished, "agentloop.complete")
    assert child_run["parent_id"] == child_turn["span_id"]
    child_calls = [s for s in named(finished, "chat ") if s["parent_id"] == child_run["span_id"]]
    assert len(child_calls) == 1
    assert child_calls[0]["attributes"]["agentloop.chat.id"] == str(child.pk)
    assert {span["trace_id"] for span in finished} == {parent_turn["trace_id"]}


@pytest.mark.django_db
def test_starting_a_traced_turn_costs_one_more_statement(scripted, user):
    memory_exporter()  # an SDK records the spans (without one there is no context to keep)
    chat = Chat.objects.create(model="scripted:test", owner=user)
    counts = []
    for tracing in (False, True):
        with override_settings(AGENTLOOP=agentloop_with(TRACING=tracing)):
            with CaptureQueriesContext(connection) as queries:
                chat.ask_later(f"tracing {tracing}")
            chat.messages.filter(role="user").delete()  # the same starting point
        counts.append(len(queries))

    assert counts[1] == counts[0] + 1
    written = [q["sql"] for q in queries.captured_queries if 'SET "trace_context"' in q["sql"]]
    assert len(written) == 1 and "traceparent" in written[0]


# -- across Celery jobs -------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
@pytest.mark.subprocess
def test_a_tool_turn_run_by_a_celery_worker_is_one_trace(background, user, tmp_path, monkeypatch):
    span_file = tmp_path / "worker-spans.jsonl"
    monkeypatch.setenv("AGENTLOOP_TEST_SPANS", str(span_file))
    background.start_worker("w1", TRACING=True)
    memory_exporter().clear()
    chat = workers.new_chat(user, step_one, step_two, step_three)

    with override_settings(AGENTLOOP={**settings.AGENTLOOP, "TRACING": True}):
        chat.ask_later("tools:step_one|step_two,step_three").complete_later()
    background.wait(lambda: workers.settled(chat), "the chat to settle")
    worker_spans = background.wait(
        lambda: (found := read_span_file(span_file)) and len(named(found, "agentloop.step")) >= 5
        and found, "the worker's spans",
    )  # fmt: skip

    turn = only(records(), "invoke_agent")
    assert turn["pid"] == os.getpid()
    steps = named(worker_spans, "agentloop.step")
    assert {span["pid"] for span in worker_spans} != {os.getpid()}
    assert {span["trace_id"] for span in worker_spans} == {turn["trace_id"]}
    assert {span["parent_id"] for span in steps} == {turn["span_id"]}
    step_ids = {span["span_id"] for span in steps}
    model_calls = named(worker_spans, "chat ")
    tools = named(worker_spans, "execute_tool")
    assert len(model_calls) == 3
    assert sorted(span["name"] for span in tools) == [
        "execute_tool step_one", "execute_tool step_three", "execute_tool step_two",
    ]  # fmt: skip
    assert all(span["parent_id"] in step_ids for span in model_calls + tools)
    assert {span["attributes"]["agentloop.chat.id"] for span in worker_spans} == {str(chat.pk)}


# -- async verbs (docs/async.md): the same spans, and nothing left current afterwards ------------
@agentloop.tool
async def async_add(a: int, b: int) -> int:
    """Add two numbers (awaited on the verb's loop)."""
    return a + b


def _async_two_rounds(scripted: ScriptedProvider, name: str) -> None:
    scripted.add(
        reply("", tool_call(name, {"a": 2, "b": 3}, id="call_a")),
        reply("It is 5.", tool_call(name, {"a": 5, "b": 1}, id="call_b")),
        "It is 5, then 6.",
    )


def _assert_one_turn(finished: list[Span], tool_name: str) -> None:
    assert [span["name"] for span in finished] == [
        "chat test", f"execute_tool {tool_name}", "chat test", f"execute_tool {tool_name}",
        "chat test", "invoke_agent",
    ]  # fmt: skip
    turn = only(finished, "invoke_agent")
    assert {span["trace_id"] for span in finished} == {turn["trace_id"]}
    assert all(span["parent_id"] == turn["span_id"] for span in finished if span is not turn)


@pytest.mark.parametrize("tool_class", [add, async_add], ids=["sync tool", "async tool"])
def test_an_async_memory_turn_traces_as_a_sync_one_and_leaves_no_span_current(
    spans, scripted, tool_class
):
    _async_two_rounds(scripted, tool_class.name)
    chat = agentloop.chat("scripted:test", tools=[tool_class])

    async def turn() -> bool:
        await chat.aask("What is 2 + 3, plus 1?")
        return trace.get_current_span().get_span_context().is_valid

    assert async_to_sync(turn)() is False  # the verb restored the caller's context
    _assert_one_turn(records(), tool_class.name)


@pytest.mark.django_db
@pytest.mark.parametrize("tool_class", [add, async_add], ids=["sync tool", "async tool"])
def test_an_async_persisted_turn_traces_across_its_database_phases(
    spans, scripted, user, tool_class
):
    _async_two_rounds(scripted, tool_class.name)
    chat = Chat.objects.create(model="scripted:test", owner=user).with_tools(tool_class)

    async def turn() -> bool:
        await chat.aask("What is 2 + 3, plus 1?")
        return trace.get_current_span().get_span_context().is_valid

    assert async_to_sync(turn)() is False
    finished = records()
    _assert_one_turn(finished, tool_class.name)
    chat.refresh_from_db()
    assert only(finished, "invoke_agent")["trace_id"] in chat.trace_context["traceparent"]

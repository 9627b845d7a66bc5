"""Cancelling a persisted chat at each checkpoint (docs/design.md §4): start of a verb, before the
model request, between streamed chunks (from another thread and another process), between
tools and after a tool. What already happened is kept, the flag is cleared, and the chat
works again at once."""

from __future__ import annotations

import json
import threading

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from agentloop import CancelledError
from agentloop.engine._conversation import CANCELLED_TOOL_RESULT
from agentloop.messages import MessageStatus, ToolCallState
from agentloop.models import Chat, Usage
from agentloop.testing import stream, tool_call
from tests.processes import start_script
from tests.step_queries import GENERATE_TEXT_QUERIES
from tests.tools import CancelViaDatabase, add

WORDS = [f"word{i} " for i in range(600)]  # 30 s at 0.05 s a chunk: a cancel always lands first


def flag(chat):
    return Chat.objects.values_list("cancel_requested_at", flat=True).get(pk=chat.pk)


def rows(chat):
    return [(m.role, m.content, m.status) for m in chat.messages.all()]


def cancel_queued(chat):
    """Cancel a run that is queued (a job on its way): the next verb's first checkpoint
    stops it. A chat with no run can't be cancelled (see test_a_cancel_with_nothing_...)."""
    Chat.objects.filter(pk=chat.pk).update(state="queued")
    assert Chat.objects.get(pk=chat.pk).cancel() is True


# -- (a) at the start of a verb -----------------------------------------------------------
@pytest.mark.django_db
def test_cancel_is_one_update_of_the_flag(chat):
    Chat.objects.filter(pk=chat.pk).update(state="queued")
    with CaptureQueriesContext(connection) as captured:
        assert Chat.objects.get(pk=chat.pk).cancel() is True

    # the get, one UPDATE of the chat's flag, one of its running subagents' flags, and the
    # conditional UPDATE that applies a cancel at once to a chat waiting for a person with no
    # run to see the flag (it matches nothing here: a job is on its way). The savepoints
    # are the test's own transaction's.
    statements = [q["sql"].split()[0] for q in captured.captured_queries]
    statements = [word for word in statements if word not in ("SAVEPOINT", "RELEASE")]
    assert statements == ["SELECT", "UPDATE", "UPDATE", "UPDATE"]
    assert flag(chat) is not None


@pytest.mark.django_db
@pytest.mark.parametrize("verb", ["generate", "run_tools", "step", "complete"])
def test_a_cancel_before_a_verb_stops_it_at_once_and_writes_nothing(chat, scripted, verb):
    chat.ask_later("Hello")
    scripted.add("never sent")
    cancel_queued(chat)

    with pytest.raises(CancelledError):
        getattr(chat, verb)()

    assert flag(chat) is None
    assert rows(chat) == [("user", "Hello", "complete")]
    assert Usage.objects.count() == 0
    assert scripted.requests == []


@pytest.mark.django_db
def test_after_a_cancel_at_the_start_the_chat_works_again(chat, scripted):
    chat.ask_later("Hello")
    cancel_queued(chat)
    with pytest.raises(CancelledError):
        chat.step()
    scripted.add("Hi")

    answer = chat.step()

    assert answer.content == "Hi"
    assert chat.is_complete()


@pytest.mark.django_db
def test_a_cancel_with_nothing_running_sets_nothing_and_says_so(chat, scripted):
    chat.ask_later("Hello")

    assert Chat.objects.get(pk=chat.pk).cancel() is False

    assert flag(chat) is None
    scripted.add("Hi")
    assert chat.step().content == "Hi"  # the next run is not stopped by a stale cancel


# -- (b) before the model request ---------------------------------------------------------
@pytest.mark.django_db
@override_settings(AGENTLOOP={"CANCEL_POLL_INTERVAL": 0})
def test_a_cancel_just_before_the_model_request_sends_no_request(chat, scripted):
    chat.ask_later("Hello")
    scripted.add("never sent")
    chat.before_message(lambda: Chat.objects.get(pk=chat.pk).cancel())

    with pytest.raises(CancelledError):
        chat.generate()

    assert scripted.requests == []
    assert rows(chat) == [("user", "Hello", "complete")]
    assert Usage.objects.count() == 0
    assert flag(chat) is None


# -- (b) between streamed chunks, from another thread -------------------------------------
@pytest.fixture
def cancelled_from_a_thread(chat, scripted):
    """A streaming answer cancelled by another thread through its own Chat instance.
    Returns the chat and the text chunks the stream callback received."""
    chat.ask_later("Tell me a long story")
    scripted.add(stream(*WORDS, delay=0.05))
    streaming = threading.Event()
    received: list[str] = []

    def on_chunk(chunk):
        received.append(chunk.text)
        streaming.set()

    def cancel_once_streaming():
        try:
            assert streaming.wait(timeout=30)
            Chat.objects.get(pk=chat.pk).cancel()
        finally:
            connection.close()

    canceller = threading.Thread(target=cancel_once_streaming)
    canceller.start()
    try:
        with pytest.raises(CancelledError):
            chat.generate(stream=on_chunk)
    finally:
        canceller.join(timeout=30)
    return chat, received


@pytest.mark.django_db(transaction=True)
def test_a_cancel_from_another_thread_keeps_the_streamed_text_as_a_cancelled_message(
    cancelled_from_a_thread,
):
    chat, received = cancelled_from_a_thread

    assert 0 < len(received) < len(WORDS)
    (partial,) = chat.messages.filter(role="assistant")
    assert partial.status == MessageStatus.CANCELLED
    assert partial.content == "".join(received)


@pytest.mark.django_db(transaction=True)
def test_a_cancelled_stream_records_a_cancelled_usage_row(cancelled_from_a_thread, user):
    chat, _ = cancelled_from_a_thread

    (usage,) = Usage.objects.filter(chat=chat)
    assert usage.status == "cancelled"
    assert usage.message_id == chat.messages.get(role="assistant").pk
    assert usage.owner_id == user.pk


@pytest.mark.django_db(transaction=True)
def test_a_cancelled_stream_clears_the_flag_and_the_chat_answers_again(
    cancelled_from_a_thread, scripted
):
    chat, _ = cancelled_from_a_thread
    assert flag(chat) is None
    scripted.add("A short one, then.")

    answer = Chat.objects.get(pk=chat.pk).ask("Shorter, please")

    assert answer.content == "A short one, then."
    assert [(role, status) for role, _, status in rows(chat)] == [
        ("user", "complete"),
        ("assistant", "cancelled"),
        ("user", "complete"),
        ("assistant", "complete"),
    ]
    # The cut-short answer is a record, not part of what the model is sent.
    assert [m.role for m in scripted.requests[1].messages] == ["user", "user"]


# -- (c) between streamed chunks, from another process ------------------------------------
@pytest.mark.django_db(transaction=True)
@pytest.mark.subprocess
def test_a_cancel_from_another_process_stops_the_stream(chat, scripted):
    chat.ask_later("Tell me a long story")
    scripted.add(stream(*WORDS, delay=0.05))
    received: list[str] = []
    processes = []

    def on_chunk(chunk):
        received.append(chunk.text)
        if not processes:  # streaming has begun: another process cancels the chat
            processes.append(start_script("drive_chat.py", chat.pk, json.dumps({"verb": "cancel"})))

    outcome = None
    try:
        chat.generate(stream=on_chunk)
    except CancelledError as exc:
        outcome = exc
    finally:
        outputs = [process.communicate(timeout=60) for process in processes]
    assert [process.returncode for process in processes] == [0], outputs
    assert isinstance(outcome, CancelledError)
    assert len(received) < len(WORDS)
    (partial,) = chat.messages.filter(role="assistant")
    assert (partial.status, partial.content) == (MessageStatus.CANCELLED, "".join(received))
    assert [u.status for u in Usage.objects.filter(chat=chat)] == ["cancelled"]
    assert flag(chat) is None


# -- (d) between tools ----------------------------------------------------------------------
@pytest.fixture
def cancelled_between_tools(chat, scripted):
    """A three-call round whose first tool requests cancellation through another instance."""
    chat.with_tools(CancelViaDatabase, add)
    scripted.add(
        [
            tool_call("cancel_via_database", id="c1"),
            tool_call("add", {"a": 1, "b": 2}, id="c2"),
            tool_call("add", {"a": 3, "b": 4}, id="c3"),
        ]
    )
    chat.ask_later("Go").generate()
    with pytest.raises(CancelledError):
        chat.run_tools()
    return chat


@pytest.mark.django_db
def test_a_cancel_between_tools_keeps_the_finished_result_and_runs_no_other_tool(
    cancelled_between_tools,
):
    chat = cancelled_between_tools

    assert [(m.tool_call.call_id, m.content) for m in chat.messages.filter(role="tool")] == [
        ("c1", "cancel requested")
    ]
    assert {c.call_id: c.state for c in chat.tool_calls.all()} == {
        "c1": ToolCallState.SUCCEEDED,
        "c2": ToolCallState.CANCELLED,
        "c3": ToolCallState.CANCELLED,
    }
    assert flag(chat) is None


@pytest.mark.django_db
def test_a_call_cancelled_before_it_ran_has_no_result_yet_and_says_none(cancelled_between_tools):
    calls = {c.call_id: c for c in cancelled_between_tools.tool_calls.all()}

    assert calls["c1"].result.content == "cancel requested"
    assert calls["c2"].state == ToolCallState.CANCELLED
    assert calls["c2"].result is None  # not RelatedObjectDoesNotExist
    listed = cancelled_between_tools.tool_calls.select_related("result").order_by("pk")
    assert [call.result is None for call in listed] == [False, True, True]


@pytest.mark.django_db
def test_a_cancelled_calls_result_is_the_one_ask_later_writes(cancelled_between_tools, scripted):
    scripted.add("Fine.")
    cancelled_between_tools.ask("Never mind")

    call = cancelled_between_tools.tool_calls.get(call_id="c2")
    assert (call.result.content, call.result.is_error) == (CANCELLED_TOOL_RESULT, True)


def test_the_result_link_needs_no_migration_of_its_own():
    from agentloop.models import Message, ToolResultField

    field = Message._meta.get_field("tool_call")
    assert isinstance(field, ToolResultField)
    assert field.deconstruct()[1] == "django.db.models.OneToOneField"


@pytest.mark.django_db
def test_after_a_cancel_between_tools_ask_later_answers_the_cancelled_calls_first(
    cancelled_between_tools,
):
    chat = cancelled_between_tools

    chat.ask_later("Never mind, just say hi")

    transcript = [
        (m.role, m.tool_call.call_id if m.tool_call else None, m.content, m.is_error)
        for m in chat.messages.all()
    ]
    assert transcript == [
        ("user", None, "Go", False),
        ("assistant", None, "", False),
        ("tool", "c1", "cancel requested", False),
        ("tool", "c2", CANCELLED_TOOL_RESULT, True),
        ("tool", "c3", CANCELLED_TOOL_RESULT, True),
        ("user", None, "Never mind, just say hi", False),
    ]
    assert {c.call_id: c.state for c in chat.tool_calls.all()} == {
        "c1": ToolCallState.SUCCEEDED,
        "c2": ToolCallState.CANCELLED,
        "c3": ToolCallState.CANCELLED,
    }


@pytest.mark.django_db
def test_after_a_cancel_between_tools_the_model_gets_a_result_for_every_call(
    cancelled_between_tools, scripted
):
    chat = cancelled_between_tools
    scripted.add("Hi!")

    answer = chat.ask("Never mind, just say hi")

    assert answer.content == "Hi!"
    sent = scripted.requests[-1].messages
    assert [(m.role, m.tool_call_id) for m in sent] == [
        ("user", None),
        ("assistant", None),
        ("tool", "c1"),
        ("tool", "c2"),
        ("tool", "c3"),
        ("user", None),
    ]


# -- (e) after the last tool ----------------------------------------------------------------
@pytest.mark.django_db
def test_a_cancel_during_the_last_tool_keeps_its_result_and_makes_no_model_call(chat, scripted):
    chat.with_tools(CancelViaDatabase, add)
    scripted.add(
        [tool_call("add", {"a": 1, "b": 2}, id="c1"), tool_call("cancel_via_database", id="c2")],
        "never sent",
    )

    with pytest.raises(CancelledError):
        chat.ask("Go")

    assert len(scripted.requests) == 1
    assert scripted.remaining == 1
    assert [(m.tool_call.call_id, m.content) for m in chat.messages.filter(role="tool")] == [
        ("c1", "3"),
        ("c2", "cancel requested"),
    ]
    assert [c.state for c in chat.tool_calls.all()] == [ToolCallState.SUCCEEDED] * 2
    assert [u.status for u in Usage.objects.filter(chat=chat)] == ["succeeded"]
    assert flag(chat) is None
    assert not chat.is_complete()  # the results wait for the model: complete() goes on


# -- (f) the stream's cancel checks cost no query per chunk ------------------------------------
@pytest.mark.django_db
@override_settings(AGENTLOOP={"CANCEL_POLL_INTERVAL": 10, "PARTIAL_SAVE_INTERVAL": 10})
def test_streaming_costs_the_same_queries_for_10_and_100_chunks(user, scripted):
    counts = {}
    for chunks in (10, 100):
        chat = Chat.objects.create(model="scripted:test", owner=user)
        chat.ask_later("Stream, please")
        scripted.add(stream(*WORDS[:chunks]))
        received = []
        with CaptureQueriesContext(connection) as captured:
            chat.generate(stream=received.append)
        assert len(received) == chunks
        counts[chunks] = len(captured)

    # As in test_query_counts: generate with a text answer.
    assert counts[10] == counts[100] == GENERATE_TEXT_QUERIES

"""Deferred tools: agentloop never runs the call; the chat waits until submit_result()."""

from __future__ import annotations

import json

import pytest
from django.conf import settings
from django.test import override_settings

import agentloop
from agentloop import DecisionConflictError
from agentloop.exceptions import ToolCallNotWaitingError
from agentloop.messages import ToolCallState
from agentloop.models import Chat, ChatState, ToolCall
from agentloop.runners import wait_for_embedded_jobs
from agentloop.testing import tool_call
from tests.control_tools import OperatorCheck, ask_accounting
from tests.processes import run_script, summary

ASK = tool_call("ask_accounting", {"invoice": "INV-7"}, id="d1")


@pytest.fixture
def memory(scripted):
    chat = agentloop.chat("scripted:test", tools=[ask_accounting, OperatorCheck])
    scripted.add(ASK, "INV-7 is paid.")
    chat.ask("Is INV-7 paid?")
    return chat


def test_a_deferred_call_is_not_run_and_the_chat_waits_for_its_result(memory, scripted):
    assert memory.is_waiting()
    (call,) = memory.pending_results()
    assert (call.id, call.state, call.wait_reason) == ("d1", ToolCallState.WAITING, "deferred")
    assert memory.complete() is not None  # nothing to do: still waiting
    assert len(scripted.requests) == 1
    assert [m.role for m in memory.messages] == ["user", "assistant"]


def test_a_submitted_result_is_the_calls_result_and_the_chat_carries_on(memory, scripted):
    memory.submit_result("d1", {"invoice": "INV-7", "paid": True})
    assert memory.complete().content == "INV-7 is paid."
    (result,) = [m for m in memory.messages if m.role == "tool"]
    assert (result.content, result.is_error) == ('{"invoice": "INV-7", "paid": true}', False)
    assert scripted.requests[1].messages[-1].content == result.content


def test_a_second_submit_gets_a_decision_conflict(memory):
    memory.submit_result("d1", "paid")
    with pytest.raises(DecisionConflictError):
        memory.submit_result("d1", "not paid")
    assert [m.content for m in memory.messages if m.role == "tool"] == ["paid"]


def test_an_error_result_is_given_to_the_model_as_an_error(memory):
    memory.submit_result("d1", "accounting is down", error=True)
    (call,) = [c for m in memory.messages for c in m.tool_calls]
    (result,) = [m for m in memory.messages if m.role == "tool"]
    assert (result.is_error, call.state) == (True, ToolCallState.FAILED)


def test_a_tool_class_with_deferred_waits_too(scripted):
    chat = agentloop.chat("scripted:test", tools=[OperatorCheck])
    scripted.add(tool_call("operator_check", {"order": "o-1"}, id="o1"), "Checked.")
    chat.ask("Check order o-1")
    assert [c.id for c in chat.pending_results()] == ["o1"]
    chat.submit_result("o1", "looks fine")
    assert chat.complete().content == "Checked."


def test_submit_result_for_a_call_that_is_not_deferred_is_refused(scripted):
    chat = agentloop.chat("scripted:test", tools=[OperatorCheck])
    scripted.add(tool_call("operator_check", {"order": "o-1"}, id="o1"))
    chat.ask("Check order o-1")
    with pytest.raises(ToolCallNotWaitingError, match="No pending tool call 'nope'"):
        chat.submit_result("nope", "x")
    with pytest.raises(ToolCallNotWaitingError, match="not waiting for approval"):
        chat.approve("o1")


# -- persisted, in the background -----------------------------------------------------------------
@pytest.mark.django_db
def test_a_persisted_deferred_call_is_recorded_as_submitted(user, scripted):
    chat = Chat.objects.create(model="scripted:test", owner=user).with_tools(ask_accounting)
    scripted.add(ASK, "INV-7 is paid.")
    chat.ask("Is INV-7 paid?")
    (waiting,) = chat.pending_results()
    assert waiting.call_id == "d1"

    chat.submit_result(waiting, "paid")
    assert chat.complete().content == "INV-7 is paid."
    row = ToolCall.objects.get(call_id="d1")
    assert (row.state, row.decision, row.wait_reason) == ("succeeded", "submitted", "deferred")
    with pytest.raises(DecisionConflictError):
        chat.submit_result("d1", "again")


@pytest.mark.subprocess
@pytest.mark.django_db(transaction=True)
def test_submit_result_from_another_process_resumes_a_background_chat_to_the_end(user, scripted):
    chat = Chat.objects.create(model="scripted:test", owner=user).with_tools(ask_accounting)
    scripted.add(ASK)
    embedded = {**settings.AGENTLOOP, "BACKGROUND": "embedded"}
    with override_settings(AGENTLOOP=embedded):
        chat.ask_later("Is INV-7 paid?").complete_later()
        assert wait_for_embedded_jobs(60)
    chat.refresh_from_db()
    assert chat.state == ChatState.WAITING

    spec = {
        "verb": "submit_result",
        "call": "d1",
        "content": "paid on the 3rd",
        "replies": [{"text": "INV-7 was paid on the 3rd."}],
        "settings": {"BACKGROUND": "embedded"},
    }
    done = run_script("drive_chat.py", chat.pk, json.dumps(spec))
    assert done.returncode == 0, done.stderr

    chat.refresh_from_db()
    assert chat.state == ChatState.IDLE
    assert [(m.role, m.content) for m in chat.messages.order_by("id")] == [
        ("user", "Is INV-7 paid?"),
        ("assistant", ""),
        ("tool", "paid on the 3rd"),
        ("assistant", "INV-7 was paid on the 3rd."),
    ]
    assert summary(done.stdout)["unused_replies"] == 0
    second = run_script("drive_chat.py", chat.pk, json.dumps({**spec, "replies": []}))
    assert second.returncode != 0
    assert "DecisionConflictError" in second.stderr

"""In process, a parent drives its subagents: complete() goes on once a person unblocked the
child, the parent lists and decides its subagents' calls, and a cancel reaches children
that wait for a person."""

from __future__ import annotations

import pytest

from agentloop import DecisionConflictError
from agentloop.agents.subagents import SUBAGENT_CANCELLED_RESULT
from agentloop.exceptions import ToolCallNotWaitingError
from agentloop.messages import ToolCallState
from agentloop.models import Chat, ToolCall
from agentloop.testing import tool_call
from tests.agents import Lead
from tests.helpers import transcript

pytestmark = pytest.mark.django_db


def runs(path) -> list[str]:
    return path.read_text().split() if path.exists() else []


@pytest.fixture
def paying(brains, user, run_log):
    """A Lead chat whose Payer child waits for approval of a transfer (in process)."""
    brains.script("You are LEAD.", tool_call("payer", {"task": "Pay Bob 5"}, id="c1"))
    brains.script("You are PAYER.", tool_call("transfer", {"amount": 5, "to": "bob"}, id="t1"))
    chat = Lead.create(owner=user)
    chat.ask("Pay Bob")
    return chat, Chat.objects.get(parent=chat)


def test_the_parent_lists_its_subagents_approvals(paying):
    chat, child = paying
    (pending,) = chat.pending_approvals()
    assert (pending.call_id, pending.chat_id) == ("t1", child.pk)
    assert chat.pending_questions() == []


def test_parent_complete_drives_the_child_on_once_its_approval_is_given(
    paying, brains, user, run_log
):
    chat, child = paying
    brains.script("You are PAYER.", "Paid Bob 5.")
    brains.script("You are LEAD.", "Bob is paid.")

    child.approve("t1", by=user)
    answer = chat.complete()

    assert answer.content == "Bob is paid."
    assert transcript(chat)[-2:] == [("tool", "Paid Bob 5."), ("assistant", "Bob is paid.")]
    assert runs(run_log) == ["transfer"]
    brains.assert_complete()


def test_approve_on_the_parent_finds_the_subagents_call(paying, brains, user, run_log):
    chat, child = paying
    brains.script("You are PAYER.", "Paid Bob 5.")
    brains.script("You are LEAD.", "Bob is paid.")

    chat.approve("t1", by=user)

    row = ToolCall.objects.get(call_id="t1")
    assert (row.chat_id, row.decision, row.decided_by) == (child.pk, "approved", user)
    with pytest.raises(DecisionConflictError):
        chat.approve("t1", by=user)  # decided already: a second approval changes nothing
    assert chat.complete().content == "Bob is paid."


def test_deny_on_the_parent_with_the_row_reaches_the_child(paying, brains, user, run_log):
    chat, _ = paying
    brains.script("You are PAYER.", "I was not allowed to pay Bob.")
    brains.script("You are LEAD.", "Bob was not paid.")

    (pending,) = chat.pending_approvals()
    chat.deny(pending, reason="not today", by=user)

    assert chat.complete().content == "Bob was not paid."
    assert runs(run_log) == []


def test_a_parent_still_waiting_for_a_person_does_nothing(paying, brains, run_log):
    chat, child = paying
    assert chat.complete().role == "assistant"  # no step, no model call
    assert len(brains.seen) == 2
    assert child.is_waiting() and chat.is_waiting()


def test_a_decision_on_a_call_nobody_waits_for_is_refused(paying):
    chat, _ = paying
    with pytest.raises(ToolCallNotWaitingError, match="No pending tool call 'nope'"):
        chat.approve("nope")


def test_cancelling_the_parent_cancels_the_child_waiting_for_a_person(paying, brains, run_log):
    chat, child = paying

    assert chat.cancel() is True

    row = ToolCall.objects.get(call_id="t1")
    assert row.state == ToolCallState.CANCELLED
    assert child.pending_approvals() == [] and chat.pending_approvals() == []
    parent_call = ToolCall.objects.get(call_id="c1")
    assert parent_call.state == ToolCallState.FAILED
    assert transcript(chat)[-1] == ("tool", SUBAGENT_CANCELLED_RESULT)
    assert runs(run_log) == []

    # The parent is usable again at once (its cancel applied to the round it waited on).
    brains.script("You are LEAD.", "Starting over.")
    assert chat.ask("Never mind").content == "Starting over."

"""People in the loop (docs/design.md §5): approvals that fail closed and are bound to arguments,
denials the model hears about, questions a person answers, and chats a worker left
waiting that go on once released."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.test import override_settings
from django.urls import reverse

from agentloop import CancelledError, PendingToolCallsError, signals
from agentloop import chat as memory_chat
from agentloop.django_store.leases import Lease
from agentloop.engine import CANCELLED_TOOL_RESULT
from agentloop.engine._tool_rounds import DENIED_RESULT
from agentloop.exceptions import (
    DecisionConflictError,
    InvalidArgumentsError,
    ToolCallNotWaitingError,
)
from agentloop.messages import ToolCallState
from agentloop.models import Chat, ToolCall
from agentloop.runners import wait_for_embedded_jobs
from agentloop.testing import tool_call
from agentloop.tools import AskPerson
from tests.control_tools import ask_accounting
from tests.processes import run_script, start_script, summary
from tests.tools import Wire, add, archive, ask_manager, refund, transfer

EMBEDDED = {"BACKGROUND": "embedded", "CANCEL_POLL_INTERVAL": 0.05}


def finish(process, timeout=90):
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err
    return summary(out)


def runs(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


@pytest.fixture
def chat(user):
    return Chat.objects.create(model="scripted:test", owner=user).with_tools(
        transfer, refund, add, archive, Wire, AskPerson, ask_manager
    )


def results(chat):
    return {m.tool_call.call_id: (m.content, m.is_error) for m in chat.messages.filter(role="tool")}


@pytest.fixture
def waiting(chat, scripted, run_log):
    """A chat whose model asked for a transfer that waits for approval (call id "t1")."""
    scripted.add(tool_call("transfer", {"amount": 5, "to": "bob"}, id="t1"))
    chat.ask("Pay Bob 5")
    return chat


# -- approval: fail closed ----------------------------------------------------------------------
@pytest.mark.django_db
def test_a_call_that_needs_approval_waits_and_does_not_run(waiting, scripted, run_log):
    call = ToolCall.objects.get(call_id="t1")

    assert (call.state, call.wait_reason, call.decision) == (ToolCallState.WAITING, "approval", "")
    assert waiting.is_waiting()
    assert results(waiting) == {}
    assert runs(run_log) == []
    assert len(scripted.requests) == 1


@pytest.mark.django_db
def test_pending_approvals_lists_the_waiting_call_with_its_arguments(waiting):
    (pending,) = waiting.pending_approvals()

    assert (pending.call_id, pending.name) == ("t1", "transfer")
    assert pending.arguments == {"amount": 5, "to": "bob"}
    assert pending.pk == ToolCall.objects.get(call_id="t1").pk
    assert waiting.pending_questions() == []


@pytest.mark.django_db
def test_without_a_decision_stepping_again_runs_nothing(waiting, scripted, run_log):
    assert waiting.step() is None
    waiting.complete()
    waiting.run_tools()

    assert runs(run_log) == []
    assert len(scripted.requests) == 1
    assert ToolCall.objects.get(call_id="t1").state == ToolCallState.WAITING


@pytest.mark.django_db
def test_without_a_decision_a_freshly_loaded_chat_runs_nothing(waiting, scripted, run_log):
    fresh = Chat.objects.get(pk=waiting.pk)

    fresh.complete()

    assert fresh.is_waiting()
    assert runs(run_log) == []
    assert len(scripted.requests) == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.subprocess
def test_without_a_decision_another_process_runs_nothing(waiting, run_log):
    done = run_script(
        "drive_chat.py",
        waiting.pk,
        json.dumps({"verb": "complete"}),  # no scripted replies: a model call would fail
        env={"AGENTLOOP_TEST_RUN_LOG": run_log},
    )

    assert done.returncode == 0, done.stderr
    assert summary(done.stdout)["requests"] == []
    assert runs(run_log) == []
    assert ToolCall.objects.get(call_id="t1").state == ToolCallState.WAITING


@pytest.mark.django_db(transaction=True)
@pytest.mark.subprocess
def test_an_approval_given_here_lets_another_process_run_the_call(waiting, user, run_log):
    waiting.approve("t1", by=user)
    spec = {"verb": "complete", "replies": [{"text": "Sent."}]}

    done = run_script(
        "drive_chat.py", waiting.pk, json.dumps(spec), env={"AGENTLOOP_TEST_RUN_LOG": run_log}
    )

    assert done.returncode == 0, done.stderr
    assert summary(done.stdout)["result"] == {"role": "assistant", "content": "Sent."}
    assert runs(run_log) == ["transfer"]
    assert results(waiting) == {"t1": ("sent 5 to bob", False)}


@pytest.mark.django_db
def test_ask_later_refuses_while_a_call_waits_for_approval(waiting):
    with pytest.raises(PendingToolCallsError):
        waiting.ask_later("Never mind")


# -- approve ----------------------------------------------------------------------------------
@pytest.mark.django_db
def test_an_approved_call_runs_at_the_next_step_and_the_model_gets_its_result(
    waiting, scripted, user, run_log
):
    waiting.approve("t1", by=user)
    assert runs(run_log) == []  # approving runs nothing by itself
    scripted.add("Sent 5 to Bob.")

    answer = waiting.complete()

    assert answer.content == "Sent 5 to Bob."
    assert runs(run_log) == ["transfer"]
    assert results(waiting) == {"t1": ("sent 5 to bob", False)}
    assert scripted.requests[1].messages[-1].content == "sent 5 to bob"


@pytest.mark.django_db
def test_an_approval_is_recorded_with_who_when_and_the_arguments_digest(waiting, user):
    waiting.approve("t1", by=user)

    call = ToolCall.objects.get(call_id="t1")
    assert (call.decision, call.decided_by, call.state) == ("approved", user, "pending")
    assert call.decided_at is not None
    assert len(call.decision_digest) == 64


@pytest.mark.django_db
@pytest.mark.parametrize("name_it", ["call id", "primary key", "row"])
def test_a_call_can_be_named_by_its_call_id_its_primary_key_or_its_row(waiting, user, name_it):
    row = waiting.pending_approvals()[0]
    name = {"call id": "t1", "primary key": row.pk, "row": row}[name_it]

    waiting.approve(name, by=user)

    assert ToolCall.objects.get(call_id="t1").decision == "approved"


@pytest.mark.django_db
def test_an_approval_without_a_person_is_recorded_without_one(waiting):
    waiting.approve("t1")

    call = ToolCall.objects.get(call_id="t1")
    assert (call.decision, call.decided_by) == ("approved", None)


# -- the decision is bound to the arguments -------------------------------------------------
@pytest.mark.django_db
def test_an_approved_call_whose_arguments_changed_waits_again_and_does_not_run(
    waiting, scripted, user, run_log
):
    waiting.approve("t1", by=user)
    ToolCall.objects.filter(call_id="t1").update(arguments={"amount": 5000, "to": "mallory"})

    waiting.complete()

    call = ToolCall.objects.get(call_id="t1")
    assert (call.state, call.wait_reason) == (ToolCallState.WAITING, "approval")
    assert runs(run_log) == []
    assert len(scripted.requests) == 1
    assert [c.arguments for c in waiting.pending_approvals()] == [{"amount": 5000, "to": "mallory"}]


@pytest.mark.django_db
def test_approving_the_changed_arguments_lets_them_run(waiting, scripted, user, run_log):
    waiting.approve("t1", by=user)
    ToolCall.objects.filter(call_id="t1").update(arguments={"amount": 7, "to": "bob"})
    waiting.complete()
    scripted.add("Sent 7.")

    waiting.approve("t1", by=user)
    waiting.complete()

    assert results(waiting) == {"t1": ("sent 7 to bob", False)}
    assert runs(run_log) == ["transfer"]


@pytest.mark.django_db
def test_an_approval_with_a_digest_of_other_arguments_does_not_run_the_call(
    waiting, scripted, user, run_log
):
    # As if the decision row were written for another call (or tampered with).
    waiting.approve("t1", by=user)
    ToolCall.objects.filter(call_id="t1").update(decision_digest="0" * 64)

    waiting.complete()

    assert ToolCall.objects.get(call_id="t1").state == ToolCallState.WAITING
    assert runs(run_log) == []


# -- deny ----------------------------------------------------------------------------------------
@pytest.mark.django_db
def test_a_denied_call_gets_an_error_result_saying_so_and_never_runs(waiting, scripted, run_log):
    scripted.add("Ok, I won't pay Bob.")

    waiting.deny("t1", reason="Bob was paid yesterday")
    answer = waiting.complete()

    content, is_error = results(waiting)["t1"]
    assert is_error
    assert content == DENIED_RESULT + " Reason: Bob was paid yesterday"
    assert runs(run_log) == []
    sent = scripted.requests[1].messages[-1]
    assert (sent.role, sent.is_error, sent.content) == ("tool", True, content)
    assert answer.content == "Ok, I won't pay Bob."


@pytest.mark.django_db
def test_a_denial_without_a_reason_just_says_the_user_denied_it(waiting):
    waiting.deny("t1")

    assert results(waiting) == {"t1": (DENIED_RESULT, True)}


@pytest.mark.django_db
def test_a_denial_is_recorded_with_who_when_and_why(waiting, user):
    waiting.deny("t1", reason="Not today", by=user)

    call = ToolCall.objects.get(call_id="t1")
    assert (call.decision, call.decided_by, call.decision_reason) == ("denied", user, "Not today")
    assert call.decided_at is not None
    assert call.state == ToolCallState.FAILED


@pytest.mark.django_db
def test_a_denial_returns_the_result_message_and_reports_it_to_callbacks(waiting):
    seen = []
    waiting.after_tool_result(seen.append)

    record = waiting.deny("t1")

    assert record == waiting.messages.get(role="tool")
    assert seen == [record]


# -- calls in the same round -----------------------------------------------------------------
@pytest.mark.django_db
def test_calls_needing_no_approval_in_the_same_round_still_run(chat, scripted, run_log):
    scripted.add(
        [
            tool_call("transfer", {"amount": 5, "to": "bob"}, id="t1"),
            tool_call("add", {"a": 2, "b": 3}, id="a1"),
        ]
    )

    chat.ask("Pay Bob and add")

    assert results(chat) == {"a1": ("5", False)}
    assert ToolCall.objects.get(call_id="t1").state == ToolCallState.WAITING
    assert len(scripted.requests) == 1  # no model call while a call of the round waits


@pytest.mark.django_db
def test_the_model_is_called_once_every_call_of_the_round_has_a_result(
    chat, scripted, user, run_log
):
    scripted.add(
        [
            tool_call("transfer", {"amount": 5, "to": "bob"}, id="t1"),
            tool_call("add", {"a": 2, "b": 3}, id="a1"),
        ],
        "Paid and added.",
    )
    chat.ask("Pay Bob and add")

    chat.approve("t1", by=user)
    answer = chat.complete()

    assert answer.content == "Paid and added."
    assert [m.tool_call_id for m in scripted.requests[1].messages if m.role == "tool"] == [
        "a1",
        "t1",
    ]
    assert runs(run_log) == ["transfer"]


@pytest.mark.django_db
@override_settings(AGENTLOOP={"TOOL_CONCURRENCY": "threads"})
def test_calls_needing_no_approval_run_on_threads_while_another_waits(chat, scripted, run_log):
    scripted.add(
        [
            tool_call("transfer", {"amount": 5, "to": "bob"}, id="t1"),
            tool_call("add", {"a": 2, "b": 3}, id="a1"),
            tool_call("refund", {"amount": 10}, id="r1"),
        ]
    )

    chat.ask("Three things")

    assert results(chat) == {"a1": ("5", False), "r1": ("refunded 10", False)}
    assert ToolCall.objects.get(call_id="t1").state == ToolCallState.WAITING


# -- requires_approval deciding per call --------------------------------------------------------
@pytest.mark.django_db
def test_a_callable_rule_decides_per_call(chat, scripted, run_log):
    scripted.add(
        [
            tool_call("refund", {"amount": 50}, id="small"),
            tool_call("refund", {"amount": 500}, id="large"),
        ]
    )

    chat.ask("Two refunds")

    assert results(chat) == {"small": ("refunded 50", False)}
    assert [c.call_id for c in chat.pending_approvals()] == ["large"]
    assert runs(run_log) == ["refund"]


@pytest.mark.django_db
def test_a_rule_that_raises_holds_the_call_fail_closed(chat, scripted, run_log):
    scripted.add(tool_call("archive", {"name": "ledger"}, id="x1"))

    chat.ask("Archive the ledger")

    assert [c.call_id for c in chat.pending_approvals()] == ["x1"]
    assert runs(run_log) == []


@pytest.mark.django_db
def test_a_tool_class_with_requires_approval_waits(chat, scripted, run_log):
    scripted.add(tool_call("wire", {"iban": "DE00"}, id="w1"))

    chat.ask("Wire it")

    assert [c.call_id for c in chat.pending_approvals()] == ["w1"]
    assert runs(run_log) == []


def test_needs_approval_reads_the_rule_of_each_kind_of_tool():
    assert transfer.needs_approval({"amount": 1, "to": "x"}) is True
    assert refund.needs_approval({"amount": 100}) is False
    assert refund.needs_approval({"amount": 101}) is True
    assert archive.needs_approval({"name": "x"}) is True  # the rule raised
    assert Wire.needs_approval({"iban": "x"}) is True
    assert add.needs_approval({"a": 1, "b": 2}) is False


# -- questions ----------------------------------------------------------------------------------
@pytest.fixture
def asking(chat, scripted):
    """A chat whose model asked the person a question (call id "q1")."""
    scripted.add(tool_call("ask_person", {"question": "Which account?"}, id="q1"))
    chat.ask("Pay the bill")
    return chat


@pytest.mark.django_db
def test_ask_person_makes_the_call_wait_for_an_answer(asking):
    (pending,) = asking.pending_questions()

    assert (pending.call_id, pending.question) == ("q1", "Which account?")
    assert asking.pending_approvals() == []
    assert asking.is_waiting()
    assert ToolCall.objects.get(call_id="q1").wait_reason == "question"


@pytest.mark.django_db
def test_the_answer_becomes_the_calls_result_and_the_model_goes_on(asking, scripted, user):
    scripted.add("Paying from savings.")

    record = asking.answer("q1", "Savings", by=user)
    answer = asking.complete()

    assert (record.role, record.content) == ("tool", "Savings")
    assert results(asking) == {"q1": ("Savings", False)}
    assert scripted.requests[1].messages[-1].content == "Savings"
    assert answer.content == "Paying from savings."


@pytest.mark.django_db
def test_an_answer_is_recorded_with_who_and_when(asking, user):
    asking.answer("q1", "Savings", by=user)

    call = ToolCall.objects.get(call_id="q1")
    assert (call.decision, call.decided_by, call.state) == ("answered", user, "succeeded")
    assert call.decided_at is not None


@pytest.mark.django_db
def test_a_tool_raising_needs_input_waits_for_an_answer(chat, scripted, user):
    scripted.add(tool_call("ask_manager", {"question": "May I spend 50?"}, id="m1"), "Spending.")
    chat.ask("Buy it")

    (pending,) = chat.pending_questions()
    chat.answer(pending.pk, "Yes", by=user)
    answer = chat.complete()

    assert pending.question == "May I spend 50?"
    assert results(chat) == {"m1": ("Yes", False)}
    assert answer.content == "Spending."


# -- decisions for calls that don't wait for them ---------------------------------------------
@pytest.mark.django_db
def test_approving_a_call_twice_is_a_decision_conflict(waiting, user):
    waiting.approve("t1", by=user)

    with pytest.raises(DecisionConflictError, match="already approved"):
        waiting.approve("t1", by=user)


@pytest.mark.django_db
def test_denying_an_approved_call_raises_not_waiting(waiting, user):
    waiting.approve("t1", by=user)

    with pytest.raises(ToolCallNotWaitingError):
        waiting.deny("t1", by=user)


@pytest.mark.django_db
def test_answering_a_call_that_waits_for_approval_raises_not_waiting(waiting):
    with pytest.raises(ToolCallNotWaitingError, match="not waiting for an answer"):
        waiting.answer("t1", "yes")

    assert ToolCall.objects.get(call_id="t1").decision == ""


@pytest.mark.django_db
def test_approving_a_question_raises_not_waiting(asking):
    with pytest.raises(ToolCallNotWaitingError):
        asking.approve("q1")


@pytest.mark.django_db
def test_deciding_a_call_that_already_has_a_result_raises_not_waiting(chat, scripted):
    scripted.add(tool_call("add", {"a": 1, "b": 1}, id="a1"), "2")
    chat.ask("1 + 1")

    with pytest.raises(ToolCallNotWaitingError, match="No pending tool call"):
        chat.approve("a1")


@pytest.mark.django_db
def test_deciding_an_unknown_call_raises_not_waiting(waiting):
    with pytest.raises(ToolCallNotWaitingError, match="No pending tool call 'nope'"):
        waiting.deny("nope")


@pytest.mark.django_db
def test_a_call_of_another_chat_cannot_be_decided_through_this_one(waiting, user):
    other = Chat.objects.create(model="scripted:test", owner=user)
    row = ToolCall.objects.get(call_id="t1")

    with pytest.raises(ToolCallNotWaitingError):
        other.approve(row.pk, by=user)

    assert ToolCall.objects.get(call_id="t1").decision == ""


# -- in-process chats stay in-process; chats a worker left waiting go on in the background -------
@pytest.mark.django_db(transaction=True)
@override_settings(AGENTLOOP=EMBEDDED)
def test_approving_an_in_process_chat_enqueues_nothing(waiting, run_log):
    waiting.approve("t1")
    assert wait_for_embedded_jobs(timeout=30)

    assert Chat.objects.get(pk=waiting.pk).state == "idle"
    assert runs(run_log) == []


@pytest.fixture
def waiting_in_background(chat, scripted, run_log, settings):
    """The chat, run by workers, waiting for approval of "t1" and an answer to "q1"."""
    settings.AGENTLOOP = EMBEDDED
    scripted.add(
        [
            tool_call("transfer", {"amount": 5, "to": "bob"}, id="t1"),
            tool_call("ask_person", {"question": "Which account?"}, id="q1"),
        ]
    )
    chat.ask_later("Pay Bob").complete_later()
    assert wait_for_embedded_jobs(timeout=30)
    chat.refresh_from_db()
    return chat


@pytest.mark.django_db(transaction=True)
def test_a_worker_leaves_a_chat_waiting_for_a_person(waiting_in_background, run_log):
    chat = waiting_in_background

    assert chat.state == "waiting"
    assert [c.call_id for c in chat.pending_approvals()] == ["t1"]
    assert [c.call_id for c in chat.pending_questions()] == ["q1"]
    assert runs(run_log) == []


@pytest.mark.django_db(transaction=True)
def test_a_decision_that_leaves_another_call_waiting_enqueues_nothing(waiting_in_background):
    chat = waiting_in_background

    chat.answer("q1", "Savings")
    assert wait_for_embedded_jobs(timeout=30)

    chat.refresh_from_db()
    assert chat.state == "waiting"
    assert [c.call_id for c in chat.pending_approvals()] == ["t1"]


@pytest.mark.django_db(transaction=True)
def test_the_last_decision_resumes_the_chat_in_the_background(
    waiting_in_background, scripted, user, run_log
):
    chat = waiting_in_background
    scripted.add("Paid Bob 5 from savings.")

    chat.answer("q1", "Savings", by=user)
    chat.approve("t1", by=user)
    assert wait_for_embedded_jobs(timeout=30)

    chat.refresh_from_db()
    assert chat.state == "idle"
    assert chat.messages.last().content == "Paid Bob 5 from savings."
    assert results(chat) == {"t1": ("sent 5 to bob", False), "q1": ("Savings", False)}
    assert runs(run_log) == ["transfer"]


@pytest.mark.django_db(transaction=True)
def test_a_denial_resumes_a_background_chat_without_running_the_tool(
    waiting_in_background, scripted, run_log
):
    chat = waiting_in_background
    scripted.add("Not paid.")

    chat.answer("q1", "Savings")
    chat.deny("t1", reason="No")
    assert wait_for_embedded_jobs(timeout=30)

    chat.refresh_from_db()
    assert (chat.state, chat.messages.last().content) == ("idle", "Not paid.")
    assert runs(run_log) == []


# -- cancelling a chat that waits for a person ------------------------------------------------
def held_calls(chat):
    return {
        call.call_id: (call.state, call.decision)
        for call in ToolCall.objects.filter(chat=chat, call_id__in=["t1", "q1"])
    }


CANCELLED = (ToolCallState.CANCELLED, "cancelled")


@pytest.mark.django_db(transaction=True)
def test_cancelling_a_background_chat_waiting_for_a_person_cancels_its_held_calls(
    waiting_in_background, scripted, run_log
):
    chat = waiting_in_background
    asked = len(scripted.requests)

    assert Chat.objects.get(pk=chat.pk).cancel() is True
    assert wait_for_embedded_jobs(timeout=30)

    chat.refresh_from_db()
    assert (chat.state, chat.cancel_requested_at) == ("idle", None)
    assert held_calls(chat) == {"t1": CANCELLED, "q1": CANCELLED}
    assert results(chat) == {
        "t1": (CANCELLED_TOOL_RESULT, True),
        "q1": (CANCELLED_TOOL_RESULT, True),
    }
    assert (chat.pending_approvals(), chat.pending_questions()) == ([], [])
    assert runs(run_log) == [] and len(scripted.requests) == asked  # nothing ran


@pytest.mark.django_db(transaction=True)
def test_after_cancelling_a_waiting_chat_the_next_message_is_answered(
    waiting_in_background, scripted
):
    chat = waiting_in_background
    Chat.objects.get(pk=chat.pk).cancel()
    scripted.add("Fine, nothing was paid.")

    Chat.objects.get(pk=chat.pk).ask_later("Never mind").complete_later()
    assert wait_for_embedded_jobs(timeout=30)

    chat.refresh_from_db()
    assert chat.state == "idle"
    assert [m.content for m in chat.messages.order_by("id")][-2:] == [
        "Never mind", "Fine, nothing was paid.",
    ]  # fmt: skip
    last_request = scripted.requests[-1].messages
    assert [m.content for m in last_request if m.role == "tool"] == [CANCELLED_TOOL_RESULT] * 2


@pytest.mark.django_db(transaction=True)
def test_a_decision_after_the_cancel_is_a_conflict(waiting_in_background, user):
    chat = waiting_in_background
    Chat.objects.get(pk=chat.pk).cancel()

    with pytest.raises(DecisionConflictError, match="already cancelled"):
        chat.approve("t1", by=user)
    with pytest.raises(DecisionConflictError, match="already cancelled"):
        chat.answer("q1", "Savings", by=user)
    assert held_calls(chat) == {"t1": CANCELLED, "q1": CANCELLED}


@pytest.mark.django_db(transaction=True)
def test_cancelling_a_waiting_chat_sends_the_signals_of_a_cancel(waiting_in_background):
    chat = waiting_in_background
    seen = []
    cancelled = lambda sender, chat, **kwargs: seen.append(("cancelled", chat.pk))  # noqa: E731
    added = lambda sender, chat, message, **kwargs: seen.append(("message", message.role))  # noqa: E731
    signals.chat_cancelled.connect(cancelled)
    signals.message_added.connect(added)
    try:
        Chat.objects.get(pk=chat.pk).cancel()
    finally:
        signals.chat_cancelled.disconnect(cancelled)
        signals.message_added.disconnect(added)

    assert seen == [("message", "tool"), ("message", "tool"), ("cancelled", chat.pk)]


@pytest.mark.django_db
def test_cancelling_a_chat_waiting_in_process_cancels_the_held_call(waiting, scripted, run_log):
    assert Chat.objects.get(pk=waiting.pk).cancel() is True

    assert held_calls(waiting) == {"t1": CANCELLED}
    assert results(waiting) == {"t1": (CANCELLED_TOOL_RESULT, True)}
    scripted.add("OK.")
    assert waiting.ask("Something else").content == "OK."
    assert runs(run_log) == []


@pytest.mark.django_db
def test_a_cancel_a_run_saw_while_holding_the_chat_cancels_the_held_calls_at_the_next_verb(
    waiting, scripted, run_log
):
    # The cancel came while a run held the chat, which let go of it as waiting: the next
    # verb applies the cancel to the held round instead of leaving it waiting.
    held = Lease.take(Chat, waiting.pk)
    assert Chat.objects.get(pk=waiting.pk).cancel() is True
    assert ToolCall.objects.get(call_id="t1").state == ToolCallState.WAITING  # the run's to do
    assert held.release()

    with pytest.raises(CancelledError):
        Chat.objects.get(pk=waiting.pk).complete()

    assert held_calls(waiting) == {"t1": CANCELLED}
    scripted.add("OK.")
    assert waiting.ask("Something else").content == "OK."
    assert runs(run_log) == []


@pytest.mark.django_db
def test_the_admin_action_cancels_a_waiting_chat_and_its_page_shows_it(waiting, admin_client):
    response = admin_client.post(
        reverse("admin:agentloop_chat_changelist"),
        {"action": "cancel_chats", "_selected_action": [waiting.pk]},
    )
    assert response.status_code == 302

    page = admin_client.get(reverse("admin:agentloop_chat_change", args=[waiting.pk]))
    content = page.content.decode()
    assert CANCELLED_TOOL_RESULT in content
    assert held_calls(waiting) == {"t1": CANCELLED}


def test_cancelling_a_memory_chat_waiting_for_a_person_cancels_the_held_call(scripted):
    chat = memory_chat("scripted:test").with_tools(transfer)
    scripted.add(tool_call("transfer", {"amount": 5, "to": "bob"}, id="t1"))
    chat.ask("Pay Bob 5")
    cancelled = []
    chat.on("cancelled", lambda: cancelled.append(True))

    assert chat.cancel() is True

    (call,) = chat.messages[-2].tool_calls
    assert (call.state, call.decision, cancelled) == (ToolCallState.CANCELLED, "cancelled", [True])
    assert (chat.messages[-1].content, chat.messages[-1].is_error) == (CANCELLED_TOOL_RESULT, True)
    assert chat.store.stopping.cancel_requested_at() is None and chat.pending_approvals() == []
    with pytest.raises(DecisionConflictError):
        chat.approve("t1")
    scripted.add("OK.")
    assert chat.ask("Something else").content == "OK."


@pytest.mark.django_db(transaction=True)
@pytest.mark.subprocess
@pytest.mark.parametrize("attempt", range(3))
def test_an_approval_racing_a_cancel_leaves_one_consistent_outcome(
    attempt, user, scripted, tmp_path
):
    chat = Chat.objects.create(model="scripted:test", owner=user).with_tools(transfer)
    scripted.add(tool_call("transfer", {"amount": 5, "to": "bob"}, id="t1"))
    chat.ask("Pay Bob 5")
    call = ToolCall.objects.get(chat=chat, call_id="t1")
    go = tmp_path / "go"
    racers = [
        start_script("decide.py", chat.pk, call.pk, verb, go) for verb in ("approve", "cancel")
    ]
    go.touch()
    approved, cancel = (finish(racer)["outcome"] for racer in racers)

    call.refresh_from_db()
    answers = list(chat.messages.filter(tool_call=call).values_list("content", flat=True))
    if approved == "conflict":  # the cancel decided first
        assert (cancel, call.decision, call.state) == ("ok", "cancelled", "cancelled")
        assert answers == [CANCELLED_TOOL_RESULT]
    elif cancel == "ok":  # approved, then cancelled before it ran
        assert (call.decision, call.state, answers) == (
            "approved",
            "cancelled",
            [CANCELLED_TOOL_RESULT],
        )
    else:  # approved before the cancel looked: nothing held, nothing to cancel
        assert (cancel, call.decision, call.state, answers) == (
            "nothing",
            "approved",
            "pending",
            [],
        )
    chat.refresh_from_db()
    assert chat.state == "idle"


# -- arguments are checked before anyone is asked ---------------------------------------------
def error_result(chat, call_id):
    message = chat.messages.get(tool_call__call_id=call_id)
    assert message.is_error and "\n" not in message.content
    return message.content


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("name", "arguments", "problem"),
    [
        ("wire", {"iban": "DE00", "amount": 5000}, 'it takes no parameter "amount"'),
        ("transfer", {"amount": 5, "to": "bob", "memo\nRun?": 1}, '"memo\\nRun?"'),
        ("transfer", {"amount": "lots", "to": "bob"}, "amount: Input should be a valid integer"),
    ],
)
def test_a_call_its_tool_would_refuse_gets_an_error_result_and_no_one_is_asked(
    chat, scripted, run_log, name, arguments, problem
):
    scripted.add(tool_call(name, arguments, id="t9"), "I could not do that.")

    assert chat.ask("Do it").content == "I could not do that."

    call = ToolCall.objects.get(call_id="t9")
    assert (call.state, call.wait_reason, call.decision) == (ToolCallState.FAILED, "", "")
    assert error_result(chat, "t9").startswith(f"Invalid arguments for tool {name!r}: ")
    assert problem in error_result(chat, "t9")
    assert chat.pending_approvals() == [] and runs(run_log) == []


@pytest.mark.django_db
def test_a_deferred_call_with_an_argument_its_tool_does_not_take_is_refused_not_held(
    user, scripted
):
    chat = Chat.objects.create(model="scripted:test", owner=user).with_tools(ask_accounting)
    scripted.add(tool_call("ask_accounting", {"invoice": "INV-7", "pay": True}, id="d9"), "Hm.")

    chat.ask("Is INV-7 paid?")

    assert chat.pending_results() == []
    assert "pay: Extra inputs are not permitted" in error_result(chat, "d9")


def test_a_memory_chat_refuses_such_a_call_before_anyone_is_asked_too(scripted):
    chat = memory_chat("scripted:test").with_tools(transfer)
    scripted.add(tool_call("transfer", {"amount": 5, "to": "bob", "cc": "eve"}, id="t9"), "No.")

    assert chat.ask("Pay Bob 5").content == "No."
    assert chat.pending_approvals() == []
    assert "cc: Extra inputs are not permitted" in chat.messages[-2].content


@pytest.mark.django_db
def test_a_call_held_with_arguments_its_tool_refuses_cannot_be_approved(waiting, client, user):
    # Held before arguments were checked first: approving it is refused (400 in the view),
    # and it still waits for a denial.
    ToolCall.objects.filter(call_id="t1").update(arguments={"amount": 5, "to": "bob", "cc": 1})
    call = ToolCall.objects.get(call_id="t1")

    with pytest.raises(InvalidArgumentsError, match="cc: Extra inputs are not permitted"):
        waiting.approve("t1")
    client.force_login(user)
    response = client.post(reverse("agentloop:approve", args=[waiting.pk, call.pk]))

    assert response.status_code == 400 and b"cc: Extra inputs" in response.content
    assert ToolCall.objects.get(call_id="t1").state == ToolCallState.WAITING
    waiting.deny("t1")

"""One writer, always (docs/design.md §12): every writing verb runs under the chat's claim,
tool calls and decisions are conditional writes, cancels are bound to runs, retries end, and a
user sees one line of what went wrong. The races run in real OS processes against the test
database."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta

import pytest
from django.db import OperationalError, connections
from django.utils import timezone

from agentloop.django_store import leases as _leases
from agentloop.django_store.leases import Lease, beat
from agentloop.exceptions import (
    ChatBusyError,
    DecisionConflictError,
    LeaseLostError,
    RateLimitError,
)
from agentloop.models import Chat, ChatState, ToolCall
from agentloop.runners import run_step
from agentloop.runners.sweeper import resume_stalled
from agentloop.testing import tool_call
from tests.processes import start_script, summary
from tests.tools import ask_manager, step_one, step_three, step_two, transfer

TURN = "tools:step_one,step_two|step_three"


def finish(process, timeout=90):
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err
    return summary(out)


# -- the claim, in-process and across processes ---------------------------------------------
@pytest.mark.django_db
def test_a_verb_refuses_while_another_process_holds_the_chat_and_writes_nothing(user, scripted):
    chat = Chat.objects.create(model="scripted:test", owner=user)
    chat.ask_later("Hi")
    other = Lease.take(Chat, chat.pk)  # a worker's job, or another request
    scripted.add("never sent")

    for verb in ("step", "generate", "run_tools", "complete"):
        with pytest.raises(ChatBusyError):
            getattr(Chat.objects.get(pk=chat.pk), verb)()
    with pytest.raises(ChatBusyError):
        Chat.objects.get(pk=chat.pk).ask_later("another")

    assert scripted.requests == []
    assert list(chat.messages.values_list("content", flat=True)) == ["Hi"]
    assert other.release(state="idle")
    assert Chat.objects.get(pk=chat.pk).step().content == "never sent"


@pytest.mark.django_db(transaction=True)
@pytest.mark.subprocess
def test_two_processes_stepping_one_chat_never_fork_it_nor_run_a_tool_twice(user, tmp_path):
    turns = 10  # 5 steps a turn: model, 2 tools, model, tool, model -> 50 steps
    chat = Chat.objects.create(model="rules:race", owner=user)
    chat.with_tools(step_one, step_two, step_three).ask_later(f"{TURN} turn1")
    log, go = tmp_path / "runs.log", tmp_path / "go"
    racers = [
        start_script(
            "step_racer.py", chat.pk, turns, asker, go, env={"AGENTLOOP_TEST_RUN_LOG": log}
        )
        for asker in (1, 0)
    ]
    go.touch()
    results = [finish(racer) for racer in racers]

    assert sum(result["steps"] for result in results) == 5 * turns
    runs = Counter(log.read_text().split())
    assert runs == {"step_one": turns, "step_two": turns, "step_three": turns}
    roles = [m.role for m in chat.messages.order_by("id")]
    one_turn = ["user", "assistant", "tool", "tool", "assistant", "tool", "assistant"]
    assert roles == one_turn * turns
    for call in ToolCall.objects.filter(chat=chat):
        assert call.state == "succeeded"
        assert chat.messages.filter(tool_call=call).count() == 1
    assert chat.usage_records.count() == 3 * turns


# -- decisions ------------------------------------------------------------------------------
def _waiting_call(user, scripted, tool, arguments):
    chat = Chat.objects.create(model="scripted:test", owner=user).with_tools(tool)
    scripted.add(tool_call(tool.name, arguments))
    chat.ask("go")
    (call,) = ToolCall.objects.filter(chat=chat, state="waiting")
    return chat, call


def _race(chat, call, verbs, tmp_path):
    go = tmp_path / "go"
    deciders = [start_script("decide.py", chat.pk, call.pk, verb, go) for verb in verbs]
    go.touch()
    return [finish(decider)["outcome"] for decider in deciders]


@pytest.mark.django_db(transaction=True)
@pytest.mark.subprocess
def test_approve_and_deny_racing_on_one_call_leave_exactly_one_decision(user, scripted, tmp_path):
    chat, call = _waiting_call(user, scripted, transfer, {"amount": 5000, "to": "x"})

    outcomes = _race(chat, call, ["approve", "deny"], tmp_path)

    assert sorted(outcomes) == ["conflict", "ok"]
    call.refresh_from_db()
    results = list(chat.messages.filter(tool_call=call))
    if outcomes[0] == "ok":  # approved: it runs at the next step, no result yet
        assert (call.decision, call.state, results) == ("approved", "pending", [])
    else:
        assert (call.decision, call.state) == ("denied", "failed")
        assert [m.content for m in results] == [
            "The user denied this tool call; it was not run. Reason: racing"
        ]


@pytest.mark.django_db(transaction=True)
@pytest.mark.subprocess
def test_two_answers_racing_on_one_question_leave_exactly_one_result(user, scripted, tmp_path):
    chat, call = _waiting_call(user, scripted, ask_manager, {"question": "May I?"})

    outcomes = _race(chat, call, ["first", "second"], tmp_path)

    assert sorted(outcomes) == ["conflict", "ok"]
    (result,) = chat.messages.filter(tool_call=call)
    winner = "first" if outcomes[0] == "ok" else "second"
    assert result.content == f"answer from {winner}"


@pytest.mark.django_db
def test_a_decision_on_a_call_that_stopped_waiting_is_a_conflict(user, scripted):
    chat, call = _waiting_call(user, scripted, transfer, {"amount": 5000, "to": "x"})
    stale = Chat.objects.get(pk=chat.pk)
    (waiting,) = [c for m in stale.conversation.messages for c in m.tool_calls]  # read now
    chat.deny(call.pk)  # someone else decides first

    with pytest.raises(DecisionConflictError):
        stale.conversation.store.tool_calls.record_decision(
            waiting, "approved", by=None, reason="", result=None
        )
    call.refresh_from_db()
    assert (call.decision, call.state) == ("denied", "failed")


# -- cancels are bound to runs --------------------------------------------------------------
@pytest.mark.django_db
def test_a_stale_cancel_never_stops_the_next_message(user, scripted):
    chat = Chat.objects.create(model="scripted:test", owner=user)
    chat.ask_later("first")
    scripted.add("one")
    chat.complete()

    assert chat.cancel() is False  # nothing runs
    scripted.add("two")

    assert chat.ask("second").content == "two"
    assert Chat.objects.get(pk=chat.pk).cancel_requested_at is None


# -- the heartbeat --------------------------------------------------------------------------
def beat_elsewhere(lease):
    """One heartbeat on a thread of its own, as the heartbeat thread runs it (with its own
    database connection, which it closes after an error)."""

    def run():
        try:
            beat(lease)
        finally:
            connections.close_all()  # the thread's own connection, as the heartbeat closes it

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=30)


@pytest.mark.django_db(transaction=True)
def test_the_heartbeat_rides_out_transient_database_errors(user, monkeypatch):
    chat = Chat.objects.create(owner=user)
    lease = Lease.take(Chat, chat.pk, seconds=60)
    real = _leases._renew_many
    failures = iter([True, True, True])

    def flaky(leases):
        if next(failures, False):
            raise OperationalError("server closed the connection unexpectedly")
        return real(leases)

    monkeypatch.setattr(_leases, "_renew_many", flaky)
    for _ in range(4):
        beat_elsewhere(lease)

    assert not lease.lost.is_set()  # three errors, then a renewal: the lease holds
    assert Chat.objects.get(pk=chat.pk).lease_token == lease.token


@pytest.mark.django_db(transaction=True)
def test_a_heartbeat_that_cannot_renew_before_expiry_marks_the_step_lost(user, monkeypatch):
    chat = Chat.objects.create(owner=user)
    lease = Lease.take(Chat, chat.pk, seconds=60)

    def down(leases):
        raise OperationalError("could not connect to server")

    monkeypatch.setattr(_leases, "_renew_many", down)
    beat_elsewhere(lease)
    assert not lease.lost.is_set()  # still well before the expiry: keep trying
    lease.renewed_at -= 55  # the lease is about to run out, never renewed
    beat_elsewhere(lease)

    assert lease.lost.is_set()
    monkeypatch.undo()
    with pytest.raises(LeaseLostError):
        lease.ensure()  # the step writes nothing more


# -- retries end ----------------------------------------------------------------------------
@pytest.mark.django_db
def test_a_long_retry_after_fails_the_chat_after_step_retries_even_with_the_sweeper(
    user, monkeypatch, settings
):
    settings.AGENTLOOP = {**settings.AGENTLOOP, "STEP_RETRIES": 2, "STALE_QUEUED_SECONDS": 0}
    from agentloop import providers
    from agentloop.testing import FunctionProvider

    def always_limited(request):
        raise RateLimitError("slow down", status=429, retry_after=3600)

    providers.register("limited", FunctionProvider(always_limited))
    monkeypatch.setattr("agentloop.engine._model_calls.time.sleep", lambda seconds: None)
    try:
        chat = Chat.objects.create(model="limited:test", owner=user)
        chat.ask_later("Hi")
        Chat.objects.filter(pk=chat.pk).update(state=ChatState.QUEUED)  # as complete_later()
        outcomes = []
        for _ in range(3):
            outcome = run_step(chat.pk)
            outcomes.append(outcome.action)
            if outcome.action == "retry":
                assert outcome.retry_in == 300  # Retry-After capped at RETRY_AFTER_MAX
                # The sweeper re-enqueues it early: the attempts count carries on anyway.
                Chat.objects.filter(pk=chat.pk).update(
                    retry_at=timezone.now() - timedelta(seconds=1),
                    updated_at=timezone.now() - timedelta(seconds=1),
                )
                assert chat.pk in resume_stalled()
    finally:
        providers.unregister("limited")

    assert outcomes == ["retry", "retry", "failed"]
    chat.refresh_from_db()
    assert chat.state == ChatState.FAILED
    assert chat.error == "Gave up after 3 attempts: RateLimitError: slow down"


# -- one line for users ---------------------------------------------------------------------
@pytest.mark.django_db
def test_an_in_process_failure_marks_the_chat_failed_with_one_line(user):
    chat = Chat.objects.create(model="nosuchprovider:model", owner=user)

    with pytest.raises(Exception, match="nosuchprovider"):
        chat.ask("Hi")

    chat.refresh_from_db()
    assert chat.state == ChatState.FAILED
    assert "\n" not in chat.error and chat.error.startswith("UnknownProviderError: ")
    assert "Traceback" in chat.error_detail and "Traceback" not in chat.error
    assert chat.lease_token == ""


@pytest.mark.django_db
def test_a_refused_message_does_not_mark_the_chat_failed(user, scripted):
    chat = Chat.objects.create(model="scripted:test", owner=user).with_tools(transfer)
    scripted.add(tool_call("transfer", {"amount": 5000, "to": "x"}))
    chat.ask("go")

    with pytest.raises(Exception, match="still wait for results"):
        chat.ask_later("another")

    chat.refresh_from_db()
    assert (chat.state, chat.error) == (ChatState.IDLE, "")


@pytest.mark.django_db(transaction=True)
def test_a_step_taken_in_process_on_a_queued_chat_hands_the_rest_back(user):
    """A chat queued for the background (its job found it busy and left) stepped once in
    this process: the rest goes back to the background, nothing is stranded."""
    from agentloop.runners import wait_for_embedded_jobs

    chat = Chat.objects.create(model="rules:test", owner=user).with_tools(step_one)
    chat.ask_later("tools:step_one")
    Chat.objects.filter(pk=chat.pk).update(state=ChatState.QUEUED)

    chat.step()  # the model asks for step_one; a job is sent for the rest
    assert wait_for_embedded_jobs(60)

    chat.refresh_from_db()
    assert (chat.state, chat.lease_token) == (ChatState.IDLE, "")
    assert [m.role for m in chat.messages.order_by("id")] == [
        "user", "assistant", "tool", "assistant"
    ]  # fmt: skip

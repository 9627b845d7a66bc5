"""Crash and resume across real processes (docs/design.md §2): a process dies with ``os._exit``
in the middle of a tool round or is killed mid-stream; a fresh process's ``complete()``/``step()``
does exactly the right next move, with no duplicate or missing message."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from agentloop.messages import MessageStatus, ToolCallState
from agentloop.models import Chat, Usage
from tests.helpers import transcript
from tests.processes import run_script, start_script, summary
from tests.tools import charge_card, step_one, step_three, step_two

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]

THREE_STEPS = {
    "tool_calls": [
        {"id": "call_1", "name": "step_one"},
        {"id": "call_2", "name": "step_two"},
        {"id": "call_3", "name": "step_three"},
    ]
}
CHARGE_BETWEEN_STEPS = {
    "tool_calls": [
        {"id": "call_1", "name": "step_one"},
        {"id": "call_2", "name": "charge_card", "arguments": {"amount": 42}},
        {"id": "call_3", "name": "step_three"},
    ]
}
ALL_DONE = {"text": "all done"}


def drive(chat, verb, *replies, env=None, **spec):
    return run_script(
        "drive_chat.py",
        chat.pk,
        json.dumps({"verb": verb, "replies": list(replies), **spec}),
        env=env,
    )


def claim_expires(chat):
    """The dead process's claim on the chat runs out (LEASE_SECONDS later, in real life):
    until then another process gets ChatBusyError (see the test below)."""
    Chat.objects.filter(pk=chat.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))


def runs(log):
    return log.read_text().split() if log.exists() else []


def call_states(chat):
    return {c.call_id: c.state for c in chat.tool_calls.order_by("id")}


@pytest.fixture
def log(tmp_path):
    return tmp_path / "runs.log"


def crash_in_step_two(user, log) -> Chat:
    """A chat whose process died inside step_two, the second of three tool calls (its claim
    still held)."""
    chat = Chat.objects.create(model="scripted:test", owner=user)
    chat.with_tools(step_one, step_two, step_three).ask_later("Do the three steps")
    crashed = drive(
        chat,
        "complete",
        THREE_STEPS,
        env={"AGENTLOOP_TEST_RUN_LOG": log, "AGENTLOOP_TEST_CRASH_IN": "step_two"},
    )
    assert crashed.returncode == 17, crashed.stderr
    return chat


@pytest.fixture
def crashed_in_step_two(user, log):
    """``crash_in_step_two``, then the dead process's claim runs out."""
    chat = crash_in_step_two(user, log)
    claim_expires(chat)
    return chat


@pytest.fixture
def crashed_in_charge_card(user, log):
    """A chat whose process died inside charge_card (idempotent=False), the second call."""
    chat = Chat.objects.create(model="scripted:test", owner=user)
    chat.with_tools(step_one, charge_card, step_three).ask_later("Pay, between two steps")
    crashed = drive(
        chat,
        "complete",
        CHARGE_BETWEEN_STEPS,
        env={"AGENTLOOP_TEST_RUN_LOG": log, "AGENTLOOP_TEST_CRASH_IN": "charge_card"},
    )
    assert crashed.returncode == 17, crashed.stderr
    claim_expires(chat)
    return chat


# -- a crash in the middle of a tool round -------------------------------------------------
def test_a_crash_keeps_the_first_result_and_leaves_the_second_call_marked_running(
    crashed_in_step_two, log
):
    chat = crashed_in_step_two

    assert runs(log) == ["step_one", "step_two"]
    assert call_states(chat) == {
        "call_1": ToolCallState.SUCCEEDED,
        "call_2": ToolCallState.RUNNING,
        "call_3": ToolCallState.PENDING,
    }
    assert transcript(chat, "role", "content", "call_id", "status") == [
        ("user", "Do the three steps", None, "complete"),
        ("assistant", "", None, "complete"),
        ("tool", "one done", "call_1", "complete"),
    ]
    assert not chat.is_complete()


def test_a_fresh_process_on_the_same_host_takes_the_dead_process_claim_at_once(user, log):
    """The claim records its holder; a process on the same host that finds the holder gone
    carries on at once instead of waiting LEASE_SECONDS (it waited, with ChatBusyError, before).
    It does what it would after the expiry: the idempotent step_two runs again."""
    chat = crash_in_step_two(user, log)
    assert Chat.objects.get(pk=chat.pk).lease_expires_at > timezone.now()  # still unexpired

    resumed = drive(chat, "complete", ALL_DONE, env={"AGENTLOOP_TEST_RUN_LOG": log})

    assert resumed.returncode == 0, resumed.stderr
    assert "took over the lease" in resumed.stderr
    assert runs(log) == ["step_one", "step_two", "step_two", "step_three"]
    assert summary(resumed.stdout)["result"] == {"role": "assistant", "content": "all done"}


def test_a_non_idempotent_tool_of_a_dead_process_is_not_run_again_by_the_taker(user, log):
    """Taken over at once, the at-most-once rule holds as after an expiry: the call the dead
    process was running is answered as interrupted, never run a second time."""
    chat = Chat.objects.create(model="scripted:test", owner=user)
    chat.with_tools(step_one, charge_card, step_three).ask_later("Pay, between two steps")
    crashed = drive(
        chat,
        "complete",
        CHARGE_BETWEEN_STEPS,
        env={"AGENTLOOP_TEST_RUN_LOG": log, "AGENTLOOP_TEST_CRASH_IN": "charge_card"},
    )
    assert crashed.returncode == 17, crashed.stderr

    resumed = drive(chat, "complete", ALL_DONE, env={"AGENTLOOP_TEST_RUN_LOG": log})

    assert resumed.returncode == 0, resumed.stderr
    assert runs(log).count("charge_card") == 1
    assert call_states(chat)["call_2"] != ToolCallState.RUNNING


def test_a_fresh_process_runs_only_the_second_and_third_tool(crashed_in_step_two, log):
    resumed = drive(crashed_in_step_two, "complete", ALL_DONE, env={"AGENTLOOP_TEST_RUN_LOG": log})

    assert resumed.returncode == 0, resumed.stderr
    assert runs(log) == ["step_one", "step_two", "step_two", "step_three"]
    assert summary(resumed.stdout)["result"] == {"role": "assistant", "content": "all done"}


def test_after_resuming_each_call_has_exactly_one_result_in_order(crashed_in_step_two, log):
    chat = crashed_in_step_two

    resumed = drive(chat, "complete", ALL_DONE, env={"AGENTLOOP_TEST_RUN_LOG": log})

    assert resumed.returncode == 0, resumed.stderr
    assert transcript(chat, "role", "content", "call_id", "status") == [
        ("user", "Do the three steps", None, "complete"),
        ("assistant", "", None, "complete"),
        ("tool", "one done", "call_1", "complete"),
        ("tool", "two done", "call_2", "complete"),
        ("tool", "three done", "call_3", "complete"),
        ("assistant", "all done", None, "complete"),
    ]
    assert call_states(chat) == dict.fromkeys(("call_1", "call_2", "call_3"), "succeeded")
    assert chat.is_complete()
    # The resumed process made one model call, with the whole round answered.
    (request,) = summary(resumed.stdout)["requests"]
    assert [(m["role"], m["tool_call_id"]) for m in request] == [
        ("user", None),
        ("assistant", None),
        ("tool", "call_1"),
        ("tool", "call_2"),
        ("tool", "call_3"),
    ]
    assert [u.status for u in Usage.objects.filter(chat=chat)] == ["succeeded", "succeeded"]


def test_a_non_idempotent_tool_interrupted_by_a_crash_is_not_run_again(crashed_in_charge_card, log):
    resumed = drive(
        crashed_in_charge_card, "complete", ALL_DONE, env={"AGENTLOOP_TEST_RUN_LOG": log}
    )

    assert resumed.returncode == 0, resumed.stderr
    assert runs(log) == ["step_one", "charge_card", "step_three"]


def test_the_model_is_told_the_non_idempotent_tool_was_interrupted(crashed_in_charge_card, log):
    chat = crashed_in_charge_card

    resumed = drive(chat, "complete", ALL_DONE, env={"AGENTLOOP_TEST_RUN_LOG": log})

    assert resumed.returncode == 0, resumed.stderr
    charge = chat.tool_calls.get(call_id="call_2")
    assert charge.state == ToolCallState.FAILED
    assert charge.result.is_error
    assert "interrupted" in charge.result.content
    assert "not idempotent" in charge.result.content
    (request,) = summary(resumed.stdout)["requests"]
    told = [m for m in request if m["tool_call_id"] == "call_2"]
    assert told == [
        {
            "role": "tool",
            "content": charge.result.content,
            "is_error": True,
            "tool_call_id": "call_2",
            "tool_calls": [],
        }
    ]
    assert [m.tool_call.call_id for m in chat.messages.filter(role="tool")] == [
        "call_1",
        "call_2",
        "call_3",
    ]
    assert chat.messages.filter(role="assistant").last().content == "all done"


# -- a process killed while an answer streams ----------------------------------------------
WORDS = [f"word{i} " for i in range(400)]
FULL_TEXT = "".join(WORDS)


@pytest.fixture
def killed_mid_stream(user):
    """A chat whose process was killed (SIGKILL) while its answer streamed."""
    chat = Chat.objects.create(model="scripted:test", owner=user)
    chat.ask_later("Tell me a long story")
    spec = {
        "verb": "step",
        "stream": True,
        "replies": [{"stream": WORDS, "delay": 0.02}],
        "settings": {"PARTIAL_SAVE_INTERVAL": 0},
    }
    process = start_script("drive_chat.py", chat.pk, json.dumps(spec))
    try:
        # With saves on every chunk, "chunk 5" is printed after chunks 0-4 were written.
        for line in process.stdout:
            if line.strip() == "chunk 5":
                break
        else:
            raise AssertionError(f"the stream never started: {process.stderr.read()}")
        process.kill()
    finally:
        process.wait(timeout=30)
        process.stdout.close()
        process.stderr.close()
    assert process.returncode == -9
    claim_expires(chat)
    return chat


def test_a_process_killed_mid_stream_leaves_a_partial_answer_row(killed_mid_stream):
    chat = killed_mid_stream

    (partial,) = chat.messages.filter(role="assistant")
    assert partial.status == MessageStatus.PARTIAL
    assert partial.content.startswith("word0 word1 word2 word3 word4 ")
    assert FULL_TEXT.startswith(partial.content)
    assert partial.content != FULL_TEXT
    assert not chat.is_complete()


def test_a_fresh_process_answers_anew_and_the_partial_stays_partial(killed_mid_stream):
    chat = killed_mid_stream
    partial = chat.messages.get(role="assistant")

    resumed = drive(chat, "step", {"text": "A short story."})

    assert resumed.returncode == 0, resumed.stderr
    assert summary(resumed.stdout)["result"] == {"role": "assistant", "content": "A short story."}
    # The model was not shown the partial answer.
    (request,) = summary(resumed.stdout)["requests"]
    assert [m["role"] for m in request] == ["user"]
    assert [(m.pk, m.status) for m in chat.messages.filter(role="assistant")] == [
        (partial.pk, MessageStatus.PARTIAL),
        (chat.messages.last().pk, MessageStatus.COMPLETE),
    ]
    assert chat.messages.last().content == "A short story."
    partial.refresh_from_db()
    assert partial.status == MessageStatus.PARTIAL
    assert chat.is_complete()
    assert Chat.objects.get(pk=chat.pk).step() is None

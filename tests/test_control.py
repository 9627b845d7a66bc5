"""Control: halt(reason) stops after the tool round, and limits hold before every tool call."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.test import override_settings
from django.urls import reverse

import agentloop
from agentloop import signals
from agentloop.engine._transcript_reading import TOOL_LIMIT_RESULT
from agentloop.models import Chat, ChatState, ToolCall
from agentloop.runners import run_step, wait_for_embedded_jobs
from agentloop.testing import tool_call
from tests.control_tools import Guard, HaltFromAnotherProcess
from tests.tools import add

GUARDED_ROUND = [tool_call("guard", {"amount": 500}, id="g1"), tool_call("add", {"a": 1, "b": 2})]


# -- in memory ------------------------------------------------------------------------------------
def test_a_tool_halts_a_memory_chat_after_its_round_and_before_the_next_model_call(scripted):
    chat = agentloop.chat("scripted:test", tools=[Guard, add])
    halts: list[str] = []
    chat.on("halted", halts.append)
    scripted.add(GUARDED_ROUND, "never sent")

    last = chat.ask("pay 500")

    assert [m.content for m in chat.messages if m.role == "tool"] == ["over budget: refused", "3"]
    assert last.content == "3"
    assert len(scripted.requests) == 1
    assert chat.store.stop_reason == "halted: amount 500 is over budget"
    assert halts == ["amount 500 is over budget"]


def test_after_a_halt_the_next_message_goes_on_normally(scripted):
    chat = agentloop.chat("scripted:test", tools=[Guard, add])
    scripted.add(GUARDED_ROUND, "never sent")
    chat.ask("pay 500")
    scripted.add("Anything else?")  # the unsent answer stays queued first
    assert chat.ask("never mind").content == "never sent"
    assert chat.store.stop_reason == ""
    assert chat.store.stopping.halt_requested() == ""


def test_halt_with_nothing_running_sets_nothing_and_says_so(scripted):
    chat = agentloop.chat("scripted:test")
    scripted.add("Hi.", "Hello again.")
    chat.ask("hi")
    assert chat.halt("too late") is False
    assert chat.ask("again").content == "Hello again."


def test_a_halt_from_an_after_tool_result_callback_stops_before_the_next_model_call(scripted):
    chat = agentloop.chat("scripted:test", tools=[add])
    chat.after_tool_result(lambda message: chat.halt(f"saw {message.content}"))
    scripted.add(tool_call("add", {"a": 2, "b": 2}), "never sent")
    chat.ask("2 + 2?")
    assert len(scripted.requests) == 1
    assert chat.store.stop_reason == "halted: saw 4"


# -- persisted, in process ------------------------------------------------------------------------
@pytest.fixture
def persisted(user):
    return Chat.objects.create(model="scripted:test", owner=user).with_tools(Guard, add)


@pytest.mark.django_db
def test_a_tool_halts_a_persisted_chat_stopped_with_the_reason_nothing_cancelled(
    persisted, scripted
):
    received = []

    def on_halted(sender, chat, reason, **kwargs):
        received.append((sender, chat.pk, reason))

    signals.chat_halted.connect(on_halted)
    try:
        scripted.add(GUARDED_ROUND, "never sent")
        persisted.ask("pay 500")
    finally:
        signals.chat_halted.disconnect(on_halted)

    persisted.refresh_from_db()
    assert (persisted.state, persisted.stop_reason) == (
        ChatState.STOPPED,
        "halted: amount 500 is over budget",
    )
    assert persisted.halt_reason == ""
    assert persisted.lease_token == ""
    assert received == [(Chat, persisted.pk, "amount 500 is over budget")]
    states = ToolCall.objects.filter(chat=persisted).values_list("state", flat=True)
    assert sorted(states) == ["succeeded", "succeeded"]
    assert persisted.messages.filter(status="cancelled").count() == 0
    assert len(scripted.requests) == 1


@pytest.mark.django_db
def test_a_halted_persisted_chat_answers_the_next_message(persisted, scripted):
    scripted.add(GUARDED_ROUND, "never sent")
    persisted.ask("pay 500")
    assert persisted.ask("never mind").content == "never sent"
    persisted.refresh_from_db()
    assert (persisted.state, persisted.stop_reason) == (ChatState.IDLE, "")


# -- in the background ----------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_a_halt_in_a_background_step_is_released_as_stopped(persisted, scripted):
    scripted.add(GUARDED_ROUND, "never sent")
    persisted.ask_later("pay 500")
    Chat.objects.filter(pk=persisted.pk).update(state=ChatState.QUEUED)

    assert run_step(persisted.pk).action == "again"  # the model asks for the round
    outcome = run_step(persisted.pk)  # the round runs, then the halt applies

    assert outcome.action == "stopped"
    persisted.refresh_from_db()
    assert persisted.state == ChatState.STOPPED
    assert persisted.stop_reason == "halted: amount 500 is over budget"
    assert persisted.messages.filter(role="tool").count() == 2
    assert len(scripted.requests) == 1


@pytest.mark.django_db
def test_a_halt_from_the_rounds_last_tool_stops_the_background_step(persisted, scripted):
    """The round's last result would release the chat with its write; a halt asked for by
    that very tool keeps the release for the verb, which records the halt."""
    last_halts = [tool_call("add", {"a": 1, "b": 2}), tool_call("guard", {"amount": 500})]
    scripted.add(last_halts, "never sent")
    persisted.ask_later("pay 500")
    Chat.objects.filter(pk=persisted.pk).update(state=ChatState.QUEUED)

    assert run_step(persisted.pk).action == "again"
    assert run_step(persisted.pk).action == "stopped"

    persisted.refresh_from_db()
    assert (persisted.state, persisted.stop_reason) == (
        ChatState.STOPPED,
        "halted: amount 500 is over budget",
    )
    assert len(scripted.requests) == 1


@pytest.mark.subprocess
@pytest.mark.django_db(transaction=True)
def test_a_halt_from_another_process_stops_a_background_chat_before_its_next_model_call(
    user, scripted
):
    chat = Chat.objects.create(model="scripted:test", owner=user)
    chat.with_tools(HaltFromAnotherProcess)
    scripted.add(tool_call("halt_from_another_process", id="h1"), "never sent")
    with override_settings(AGENTLOOP={**settings.AGENTLOOP, "BACKGROUND": "embedded"}):
        chat.ask_later("go").complete_later()
        assert wait_for_embedded_jobs(60)

    chat.refresh_from_db()
    assert chat.messages.get(role="tool").content == "halted True"
    assert (chat.state, chat.stop_reason) == (ChatState.STOPPED, "halted: operator stop")
    assert len(scripted.requests) == 1
    assert chat.ask("and now?").content == "never sent"


# -- limits before every tool call ----------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_six_calls_under_max_tool_calls_2_in_the_background_run_2_and_stop(user, scripted):
    chat = Chat.objects.create(model="scripted:test", owner=user).with_tools(add)
    chat.with_limits(max_tool_calls=2)
    scripted.add([tool_call("add", {"a": n, "b": n}) for n in range(6)], "never sent")
    with override_settings(AGENTLOOP={**settings.AGENTLOOP, "BACKGROUND": "embedded"}):
        chat.ask_later("six sums").complete_later()
        assert wait_for_embedded_jobs(60)

    chat.refresh_from_db()
    assert (chat.state, chat.stop_reason) == (ChatState.STOPPED, "max_tool_calls reached (2 of 2)")
    results = list(
        chat.messages.filter(role="tool").order_by("id").values_list("content", "is_error")
    )
    assert results == [("0", False), ("2", False)] + [(TOOL_LIMIT_RESULT, True)] * 4
    states = list(ToolCall.objects.filter(chat=chat).order_by("id").values_list("state", flat=True))
    assert states == ["succeeded"] * 2 + ["failed"] * 4
    assert len(scripted.requests) == 1


@pytest.mark.django_db
def test_the_admin_timeline_shows_why_a_chat_was_halted(admin_client, persisted, scripted):
    scripted.add(GUARDED_ROUND, "never sent")
    persisted.ask("pay 500")

    url = reverse("admin:agentloop_chat_change", args=[persisted.pk])
    content = admin_client.get(url).content.decode()

    assert "Stopped: halted: amount 500 is over budget" in content


@pytest.mark.subprocess
@pytest.mark.django_db(transaction=True)
def test_a_halt_from_another_process_stops_an_in_process_complete_before_its_next_model_call(
    user, scripted
):
    """In loop mode the run reads no chat row of its own between rounds: the halt comes back
    with the lease's renewal in the tool result's write (it was ignored: all rounds ran)."""
    chat = Chat.objects.create(model="scripted:test", owner=user)
    chat.with_tools(HaltFromAnotherProcess, add)
    later_rounds = [tool_call("add", {"a": 1, "b": n}) for n in range(7)]
    scripted.add(tool_call("halt_from_another_process", id="h1"), *later_rounds, "never sent")

    chat.ask("go")

    chat.refresh_from_db()
    assert chat.messages.get(role="tool").content == "halted True"
    assert (chat.state, chat.stop_reason) == (ChatState.STOPPED, "halted: operator stop")
    assert len(scripted.requests) == 1


# -- tools run at once ---------------------------------------------------------------------------
@pytest.mark.django_db
@pytest.mark.parametrize("concurrency", ["threads", 2])
def test_a_tool_halts_a_persisted_chat_whose_tools_run_at_once(persisted, scripted, concurrency):
    persisted.with_tool_options(concurrency=concurrency)
    scripted.add(GUARDED_ROUND, "never sent")

    persisted.ask("pay 500")

    persisted.refresh_from_db()
    assert (persisted.state, persisted.stop_reason) == (
        ChatState.STOPPED,
        "halted: amount 500 is over budget",
    )
    assert len(scripted.requests) == 1
    states = ToolCall.objects.filter(chat=persisted).values_list("state", flat=True)
    assert sorted(states) == ["succeeded", "succeeded"]


@pytest.mark.django_db(transaction=True)
def test_a_tool_halts_a_persisted_chat_asked_with_aask_whose_tools_run_at_once(persisted, scripted):
    persisted.with_tool_options(concurrency="threads")
    scripted.add(GUARDED_ROUND, "never sent")

    async_to_sync(persisted.aask)("pay 500")

    persisted.refresh_from_db()
    assert (persisted.state, persisted.stop_reason) == (
        ChatState.STOPPED,
        "halted: amount 500 is over budget",
    )
    assert len(scripted.requests) == 1


@pytest.mark.parametrize("concurrency", ["threads", 2])
def test_a_tool_halts_a_memory_chat_whose_tools_run_at_once(scripted, concurrency):
    chat = agentloop.chat("scripted:test", tools=[Guard, add])
    chat.with_tool_options(concurrency=concurrency)
    scripted.add(GUARDED_ROUND, "never sent")

    chat.ask("pay 500")

    assert len(scripted.requests) == 1
    assert chat.store.stop_reason == "halted: amount 500 is over budget"


@pytest.mark.django_db
def test_a_tool_halts_a_persisted_chat_under_the_projects_tool_concurrency(persisted, scripted):
    scripted.add(GUARDED_ROUND, "never sent")
    with override_settings(AGENTLOOP={**settings.AGENTLOOP, "TOOL_CONCURRENCY": "threads"}):
        persisted.ask("pay 500")

    persisted.refresh_from_db()
    assert (persisted.state, persisted.stop_reason) == (
        ChatState.STOPPED,
        "halted: amount 500 is over budget",
    )
    assert len(scripted.requests) == 1


@pytest.mark.django_db(transaction=True)
def test_a_halt_in_a_background_step_whose_tools_run_at_once_is_released_as_stopped(
    persisted, scripted
):
    persisted.with_tool_options(concurrency="threads")
    scripted.add(GUARDED_ROUND, "never sent")
    persisted.ask_later("pay 500")
    Chat.objects.filter(pk=persisted.pk).update(state=ChatState.QUEUED)

    assert run_step(persisted.pk).action == "again"  # the model asks for the round
    assert run_step(persisted.pk).action == "stopped"  # the round runs at once, then the halt

    persisted.refresh_from_db()
    assert (persisted.state, persisted.stop_reason) == (
        ChatState.STOPPED,
        "halted: amount 500 is over budget",
    )
    assert len(scripted.requests) == 1

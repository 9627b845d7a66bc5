"""halt() from another thread or process while a round runs its tools at once (issue 24, part
5): in every driver (sync ``ask``/``step``, async ``aask``, the thread pool of
``with_tool_options(concurrency=...)`` and of ``TOOL_CONCURRENCY``), in memory and persisted,
the round finishes, no model call follows, and the chat is stopped with the halt's reason.

It used to be ignored there: the check between tools read the chat row and dropped the halt
(tests/test_control.py has the halts asked for by a tool itself; the Celery worker's are in
tests/test_control_celery.py).
"""

from __future__ import annotations

import threading

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.db import connections
from django.test import override_settings

import agentloop
from agentloop import Tool
from agentloop.models import Chat, ChatState, ToolCall
from agentloop.runners import run_step
from agentloop.testing import tool_call
from tests.control_tools import HaltFromAnotherProcess
from tests.tools import add


class HaltFromAnotherThread(Tool):
    """Has another thread halt this chat, as an operator's request would (a persisted chat
    loaded afresh there, on its own connection), and waits for it to be done."""

    def execute(self) -> str:
        chat = self.context.chat
        said: list[bool] = []

        def operator() -> None:
            try:
                if hasattr(chat, "_meta"):
                    said.append(Chat.objects.get(pk=chat.pk).halt("operator stop"))
                else:
                    said.append(chat.halt("operator stop"))
            finally:
                connections.close_all()

        thread = threading.Thread(target=operator)
        thread.start()
        thread.join()
        return f"halted {said[0]}"


ROUND = [
    tool_call("halt_from_another_thread", id="h1"),
    tool_call("add", {"a": 1, "b": 2}, id="a1"),
]
CONCURRENCY = ["threads", 2]


def _persisted(user, concurrency=None) -> Chat:
    chat = Chat.objects.create(model="scripted:test", owner=user)
    chat.with_tools(HaltFromAnotherThread, add)
    if concurrency is not None:
        chat.with_tool_options(concurrency=concurrency)
    return chat


def _assert_halted(chat: Chat, scripted) -> None:
    chat.refresh_from_db()
    assert (chat.state, chat.stop_reason, chat.halt_reason) == (
        ChatState.STOPPED,
        "halted: operator stop",
        "",
    )
    assert chat.lease_token == ""
    results = dict(chat.messages.filter(role="tool").values_list("tool_call__call_id", "content"))
    assert results == {"h1": "halted True", "a1": "3"}  # the round finished
    assert sorted(ToolCall.objects.filter(chat=chat).values_list("state", flat=True)) == [
        "succeeded",
        "succeeded",
    ]
    assert chat.messages.filter(status="cancelled").count() == 0  # a halt cancels nothing
    assert len(scripted.requests) == 1  # no model call after the round


# -- persisted, in process --------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("concurrency", CONCURRENCY)
def test_a_halt_from_another_thread_stops_ask_while_its_tools_run_at_once(
    user, scripted, concurrency
):
    chat = _persisted(user, concurrency)
    scripted.add(ROUND, "never sent")

    chat.ask("go")

    _assert_halted(chat, scripted)


@pytest.mark.django_db(transaction=True)
def test_a_halt_from_another_thread_stops_ask_under_the_projects_tool_concurrency(user, scripted):
    chat = _persisted(user)
    scripted.add(ROUND, "never sent")

    with override_settings(AGENTLOOP={**settings.AGENTLOOP, "TOOL_CONCURRENCY": "threads"}):
        chat.ask("go")

    _assert_halted(chat, scripted)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("concurrency", [*CONCURRENCY, None])
def test_a_halt_from_another_thread_stops_step_by_step_driving_in_the_tools_step(
    user, scripted, concurrency
):
    chat = _persisted(user, concurrency)
    scripted.add(ROUND, "never sent")
    chat.ask_later("go")

    assert chat.step().tool_calls.count() == 2  # the model asks for the round
    assert chat.step().content in ("halted True", "3")  # the round, then the halt

    _assert_halted(chat, scripted)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("concurrency", CONCURRENCY)
def test_a_halt_from_another_thread_stops_aask_while_its_tools_run_at_once(
    user, scripted, concurrency
):
    chat = _persisted(user, concurrency)
    scripted.add(ROUND, "never sent")

    async_to_sync(chat.aask)("go")

    _assert_halted(chat, scripted)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("concurrency", CONCURRENCY)
def test_a_halt_from_another_thread_stops_a_background_job_whose_tools_run_at_once(
    user, scripted, concurrency
):
    chat = _persisted(user, concurrency)
    scripted.add(ROUND, "never sent")
    chat.ask_later("go")
    Chat.objects.filter(pk=chat.pk).update(state=ChatState.QUEUED)

    assert run_step(chat.pk).action == "again"  # the model asks for the round
    assert run_step(chat.pk).action == "stopped"  # the round runs at once, then the halt

    _assert_halted(chat, scripted)


@pytest.mark.subprocess
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("concurrency", CONCURRENCY)
def test_a_halt_from_another_process_stops_ask_while_its_tools_run_at_once(
    user, scripted, concurrency
):
    chat = Chat.objects.create(model="scripted:test", owner=user)
    chat.with_tools(HaltFromAnotherProcess, add).with_tool_options(concurrency=concurrency)
    scripted.add(
        [tool_call("halt_from_another_process", id="h1"), tool_call("add", {"a": 1, "b": 2})],
        "never sent",
    )

    chat.ask("go")

    chat.refresh_from_db()
    assert chat.messages.get(tool_call__call_id="h1").content == "halted True"
    assert (chat.state, chat.stop_reason) == (ChatState.STOPPED, "halted: operator stop")
    assert len(scripted.requests) == 1


# -- in memory ----------------------------------------------------------------------------
@pytest.mark.parametrize("concurrency", CONCURRENCY)
@pytest.mark.parametrize("driver", ["ask", "aask"])
def test_a_halt_from_another_thread_stops_a_memory_chat_whose_tools_run_at_once(
    scripted, concurrency, driver
):
    chat = agentloop.chat("scripted:test", tools=[HaltFromAnotherThread, add])
    chat.with_tool_options(concurrency=concurrency)
    halts: list[str] = []
    chat.on("halted", halts.append)
    scripted.add(ROUND, "never sent")

    if driver == "ask":
        chat.ask("go")
    else:
        async_to_sync(chat.aask)("go")

    assert sorted(m.content for m in chat.messages if m.role == "tool") == ["3", "halted True"]
    assert chat.store.stop_reason == "halted: operator stop"
    assert halts == ["operator stop"]
    assert len(scripted.requests) == 1

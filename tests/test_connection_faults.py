"""A dropped or refused database connection is transient on every path (docs/design.md §19).

The faults are real and hit only this run's own PostgreSQL test database: a connection is
dropped with ``pg_terminate_backend`` (as a server restart or a network cut would), or the
database refuses new connections for a while (``ALLOW_CONNECTIONS false``, always restored):
see tests/db_faults.py. Workers are real ``celery worker`` processes (the ``background``
fixture of tests/conftest.py starts them, tests/workers.py). After each fault the invariants
are checked: no message lost or duplicated, one result per tool call, every tool run exactly
once.
"""

from __future__ import annotations

import contextlib
import time

import pytest
from django.db import OperationalError, connection, connections

from agentloop.messages import MessageStatus
from agentloop.models import Chat, ChatState, ToolCall
from agentloop.runners import run_step
from agentloop.testing import tool_call
from tests.helpers import transcript
from tests.tools import OUTAGES, drop_connection, lose_reply, outlast_the_lease, step_one
from tests.workers import new_chat, settled

pytestmark = pytest.mark.django_db(transaction=True)

postgresql = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="connection faults: PostgreSQL"
)


@pytest.fixture(autouse=True)
def _reconnect_after(transactional_db):
    """A fault may have dropped this thread's connection too: the database's cleanup after
    the test opens a new one."""
    yield
    connections.close_all()


def runs(run_log) -> list[str]:
    return run_log.read_text().split() if run_log.exists() else []


def assert_one_result_per_call(chat: Chat) -> None:
    """Every tool call of the chat has exactly one result message, and is finished."""
    for call in ToolCall.objects.filter(chat=chat):
        assert chat.messages.filter(tool_call=call).count() == 1, call
        assert call.state == "succeeded", call


def finished_answers(chat: Chat) -> list[str]:
    return list(
        chat.messages.filter(role="assistant", status=MessageStatus.COMPLETE)
        .order_by("id")
        .values_list("content", flat=True)
    )


# -- 1. a connection dropped while a tool runs ------------------------------------------------
@postgresql
def test_a_tool_whose_connection_drops_runs_once_and_its_result_is_written(scripted, user, run_log):
    scripted.add(tool_call("drop_connection", id="call_1"), "all done")
    chat = Chat.objects.create(model="scripted:test", owner=user).with_tools(drop_connection)

    answer = chat.ask("go")

    assert answer.content == "all done"
    assert runs(run_log) == ["drop_connection"]
    chat = Chat.objects.get(pk=chat.pk)
    assert transcript(chat, "role", "content", "call_id") == [
        ("user", "go", None),
        ("assistant", "", None),
        ("tool", "connection dropped", "call_1"),
        ("assistant", "all done", None),
    ]
    assert_one_result_per_call(chat)
    assert chat.state == ChatState.IDLE
    assert chat.lease_token == ""
    assert chat.error == ""


@postgresql
def test_a_result_computed_while_connections_are_refused_past_the_lease_is_written_once(
    scripted, user, run_log, settings
):
    """Issue 41, defect 13: the tool's result can't be written before the lease runs out
    (the database refuses connections for twice the lease). It is written once connections
    come back, since no other process could take the chat meanwhile; the tool runs once."""
    settings.AGENTLOOP = {**settings.AGENTLOOP, "LEASE_SECONDS": 2}
    scripted.add(tool_call("outlast_the_lease", id="call_1"), "all done")
    chat = Chat.objects.create(model="scripted:test", owner=user).with_tools(outlast_the_lease)

    try:
        answer = chat.ask("go")
    finally:
        for outage in OUTAGES:
            outage.join(30)  # connections are allowed again, whatever the step did

    assert answer.content == "all done"
    assert runs(run_log) == ["outlast_the_lease"]
    chat = Chat.objects.get(pk=chat.pk)
    assert transcript(chat, "role", "content") == [
        ("user", "go"),
        ("assistant", ""),
        ("tool", "computed during the outage"),
        ("assistant", "all done"),
    ]
    assert_one_result_per_call(chat)
    assert (chat.state, chat.lease_token) == (ChatState.IDLE, "")


@postgresql
def test_a_result_write_whose_answer_is_lost_after_its_commit_is_not_written_again(
    scripted, user, run_log
):
    from tests.db_faults import through_proxy

    scripted.add(tool_call("lose_reply", id="call_1"), "all done")
    with through_proxy() as proxy:
        chat = Chat.objects.create(model="scripted:test", owner=user).with_tools(lose_reply)

        answer = chat.ask("go")

    assert proxy.cuts == 1  # the result's write committed, and its answer never came
    assert answer.content == "all done"
    assert runs(run_log) == ["lose_reply"]
    chat = Chat.objects.get(pk=chat.pk)
    assert transcript(chat, "role", "content", "call_id") == [
        ("user", "go", None),
        ("assistant", "", None),
        ("tool", "reply lost", "call_1"),
        ("assistant", "all done", None),
    ]
    assert_one_result_per_call(chat)
    assert (chat.state, chat.lease_token, chat.error) == (ChatState.IDLE, "", "")


@postgresql
def test_an_answer_whose_write_loses_its_answer_after_the_commit_is_saved_once(user):
    from agentloop import providers
    from agentloop.testing import FunctionProvider
    from tests.db_faults import lose_next_reply, through_proxy

    def answer(request):
        lose_next_reply()  # the next statement is the answer's write, which also releases
        return "hello"

    providers.register("losing", FunctionProvider(answer))
    try:
        with through_proxy() as proxy:
            chat = Chat.objects.create(model="losing:test", owner=user)
            assert chat.ask("hi").content == "hello"
    finally:
        providers.unregister("losing")

    assert proxy.cuts == 1
    chat = Chat.objects.get(pk=chat.pk)
    assert transcript(chat) == [("user", "hi"), ("assistant", "hello")]
    assert list(chat.usage_records.values_list("status", flat=True)) == ["succeeded"]
    assert (chat.state, chat.lease_token, chat.error) == (ChatState.IDLE, "", "")


@postgresql
def test_after_a_dropped_connection_the_process_can_ask_again(scripted, user, run_log):
    scripted.add(tool_call("drop_connection"), "all done", "again")
    chat = Chat.objects.create(model="scripted:test", owner=user).with_tools(drop_connection)
    # (The test above checks this turn; this one, what is left in the process after it.)
    with contextlib.suppress(OperationalError):
        chat.ask("go")
    connections.close_all()

    # The same object and a fresh one: no lease of the faulted step is left in this process.
    assert chat.ask("once more").content == "again"
    scripted.add("and again")
    assert Chat.objects.get(pk=chat.pk).ask("last").content == "and again"
    assert runs(run_log) == ["drop_connection"]
    assert [m.role for m in Chat.objects.get(pk=chat.pk).messages.all()] == [
        "user", "assistant", "tool", "assistant", "user", "assistant", "user", "assistant",
    ]  # fmt: skip


@postgresql
def test_a_worker_whose_connection_drops_mid_tool_finishes_the_chat_running_it_once(
    background, user
):
    background.start_worker("w1")
    chat = new_chat(user, drop_connection, step_one)
    chat.ask_later("tools:drop_connection|step_one").complete_later()

    background.wait(lambda: settled(chat), "the chat to settle")

    assert background.runs() == ["drop_connection", "step_one"]
    assert transcript(chat, "role", "content", "call_id") == [
        ("user", "tools:drop_connection|step_one", None),
        ("assistant", "", None),
        ("tool", "connection dropped", "call_1_0_0"),
        ("assistant", "", None),
        ("tool", "one done", "call_1_1_0"),
        ("assistant", "done: one done", None),
    ]
    assert_one_result_per_call(chat)
    assert chat.error == ""
    assert "failed" not in background.workers[0].outcomes()


# -- 3. connections dropped or refused while a model answer streams --------------------------
def _streaming(background, user, text: str) -> Chat:
    chat = new_chat(user)
    chat.ask_later(text).complete_later()
    background.wait(
        lambda: chat.messages.filter(role="assistant", status="partial").exists(),
        "the answer to start streaming",
    )
    return chat


def _words(count: int) -> str:
    return "".join(f"w{index} " for index in range(count))


@postgresql
def test_a_database_restart_while_a_worker_streams_is_ridden_out(background, user):
    from tests.db_faults import terminate_all

    background.start_worker("w1", PARTIAL_SAVE_INTERVAL=0.1)
    chat = _streaming(background, user, "stream:60:0.05")

    assert terminate_all() >= 1  # every connection to the database drops, as in a restart

    background.wait(lambda: settled(chat), "the chat to settle")
    # The drop mostly falls between two statements, and the step goes on on a new connection.
    # When it falls inside the answer's last write, the step fails and its job is retried
    # (the answer is made again): either way one finished answer, nothing still streaming.
    assert finished_answers(chat) == [_words(60)]
    rows = transcript(chat, "role", "status")
    assert rows[0] == ("user", "complete")
    assert rows[-1] == ("assistant", "complete")
    assert {status for role, status in rows[1:-1]} <= {"failed"}
    assert chat.usage_records.filter(status="succeeded").count() == 1
    assert (chat.error, chat.attempts) == ("", 0)


@postgresql
def test_connections_refused_for_a_moment_while_a_worker_streams_are_waited_out(background, user):
    from tests.db_faults import refusing_connections

    worker = background.start_worker("w1", PARTIAL_SAVE_INTERVAL=0.1, LEASE_SECONDS=30)
    chat = _streaming(background, user, "stream:40:0.05")

    with refusing_connections():
        time.sleep(1.0)  # the stream goes on meanwhile; its saves and checks can't connect

    background.wait(lambda: settled(chat), "the chat to settle")
    assert finished_answers(chat) == [_words(40)]
    assert transcript(chat, "role", "status") == [("user", "complete"), ("assistant", "complete")]
    assert list(chat.usage_records.values_list("status", flat=True)) == ["succeeded"]
    assert (chat.error, chat.attempts) == ("", 0)
    # The step itself finished: no retry, no job sent again. (The tests' broker redelivers
    # a job running past its 5 s visibility timeout: such a copy finds the chat done.)
    assert set(background.wait(worker.outcomes, "the job to be logged")) == {"done"}


@postgresql
def test_connections_refused_past_the_lease_leave_a_streamed_step_to_the_next_job(background, user):
    from tests.db_faults import refusing_connections

    worker = background.start_worker("w1", PARTIAL_SAVE_INTERVAL=0.1, LEASE_SECONDS=3)
    chat = _streaming(background, user, "stream:80:0.05")

    with refusing_connections():
        # The step can't write before its lease runs out: it gives up, and its job is sent
        # again rather than acknowledged as done.
        background.wait(lambda: "unreachable" in worker.outcomes(), "the step to give up")

    background.wait(lambda: settled(chat), "the chat to settle")
    # The cut stream stays a partial row; the answer made again is the one finished answer.
    assert finished_answers(chat) == [_words(80)]
    statuses = [status for role, status in transcript(chat, "role", "status")]
    assert statuses[0] == "complete"
    assert statuses[-1] == "complete"
    assert set(statuses[1:-1]) <= {"partial"}
    assert chat.error == ""
    assert chat.state == ChatState.IDLE
    assert "failed" not in worker.outcomes()


# -- 4. connections refused when a job starts -------------------------------------------------
@postgresql
def test_a_job_started_while_connections_are_refused_is_retried_until_they_come_back(
    background, user
):
    from agentloop.tasks import step_chat
    from tests.db_faults import refusing_connections

    worker = background.start_worker("w1")
    chat = new_chat(user)
    chat.ask_later("hello")
    Chat.objects.filter(pk=chat.pk).update(state=ChatState.QUEUED)

    with refusing_connections():
        step_chat.apply_async((chat.pk, "agentloop.Chat", 0))
        background.wait(
            lambda: worker.outcomes().count("unreachable") >= 2, "the job to be retried twice"
        )

    # No sweeper runs here: the job's own retries answer the chat, long before the sweeper's
    # STALE_QUEUED_SECONDS.
    background.wait(lambda: settled(chat), "the chat to settle")
    assert transcript(chat) == [("user", "hello"), ("assistant", "echo: hello")]
    assert chat.error == ""
    assert chat.attempts == 0
    outcomes = background.wait(lambda: worker.outcomes()[-1:] == ["done"] and worker.outcomes(),
                               "the last job to be logged")  # fmt: skip
    assert set(outcomes[:-1]) == {"unreachable"}  # one job, sent again until it got through


@postgresql
def test_an_embedded_job_that_finds_connections_refused_is_retried_too(user, settings, caplog):
    from agentloop.runners import enqueue, wait_for_embedded_jobs
    from tests.db_faults import refusing_connections

    settings.AGENTLOOP = {**settings.AGENTLOOP, "RUNNER": "embedded"}
    chat = Chat.objects.create(model="rules:test", owner=user)
    chat.ask_later("hello")
    Chat.objects.filter(pk=chat.pk).update(state=ChatState.QUEUED)

    def refused_starts() -> int:
        return sum("could not be reached to start a step" in r.message for r in caplog.records)

    with refusing_connections():
        enqueue(chat.pk)
        deadline = time.monotonic() + 60
        while refused_starts() < 2:
            assert time.monotonic() < deadline, "the job was not retried"
            time.sleep(0.05)

    assert wait_for_embedded_jobs(timeout=60)
    assert settled(chat)
    assert transcript(chat) == [("user", "hello"), ("assistant", "echo: hello")]
    assert chat.error == ""


# -- any database: a connection error ending a step is transient ------------------------------
def test_a_database_error_ending_a_background_step_is_retried_not_failed(scripted, user):
    scripted.add(OperationalError("server closed the connection unexpectedly"), "recovered")
    chat = Chat.objects.create(model="scripted:test", owner=user)
    chat.ask_later("hi")
    Chat.objects.filter(pk=chat.pk).update(state="queued")  # as complete_later() leaves it

    first = run_step(chat.pk)

    chat.refresh_from_db()
    assert first.action == "retry"
    assert chat.state == ChatState.QUEUED
    assert chat.attempts == 1
    assert chat.error.startswith("OperationalError: server closed the connection unexpectedly")
    assert chat.lease_token == ""

    second = run_step(chat.pk)

    chat.refresh_from_db()
    assert second.action == "done"
    assert finished_answers(chat) == ["recovered"]
    assert chat.attempts == 0
    assert chat.error == ""

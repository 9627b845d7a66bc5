"""Transactional tools (``@tool(transactional=True)``, ``Tool.transactional``), in process:
the tool's writes, its result row and its call's state commit together or not at all
(docs/transactional-tools.md).

Each tool of tests/transactional_tools.py writes a ``Note`` named by its call: the invariant
checked everywhere is that a call's Note exists if and only if its result row does. Runs on
SQLite and PostgreSQL; the test of a lease taken over mid-tool runs on PostgreSQL only (on
SQLite the transaction holds the database's one write lock from its start: no one can take
the lease while the tool runs, which a test here shows too).
"""

from __future__ import annotations

import threading

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.test.utils import CaptureQueriesContext

import agentloop
from agentloop import ConfigurationError, Tool, tool
from agentloop.exceptions import LeaseLostError
from agentloop.messages import ToolCallState
from agentloop.models import Chat
from agentloop.testing import tool_call
from example_project.models import Note
from tests import transactional_tools
from tests.helpers import transcript
from tests.kill_points import ENV, POINTS, arm, reached
from tests.processes import REPO_ROOT, command, process_env
from tests.transactional_tools import (
    THREADS,
    Transfer,
    approved_ledger,
    ledger,
    ledger_for_a_missing_chat,
    ledger_rows,
    ledger_then_ask,
    ledger_then_crash,
    ledger_then_drop_connection,
    ledger_then_lose_the_chat,
    ledger_then_refuse,
    lookup,
    notes_of,
    plain_ledger_then_crash,
    steal_lease,
)

pytestmark = pytest.mark.django_db(transaction=True)

ALL_TOOLS = (
    ledger, ledger_then_refuse, ledger_then_crash, ledger_then_ask, plain_ledger_then_crash,
    ledger_then_lose_the_chat, Transfer, lookup,
)  # fmt: skip


@pytest.fixture
def chat(user):
    return Chat.objects.create(model="scripted:test", owner=user).with_tools(*ALL_TOOLS)


@pytest.fixture(autouse=True)
def _threads():
    THREADS.clear()
    yield
    THREADS.clear()


def test_the_tools_row_its_result_and_its_call_state_commit_together(chat, scripted):
    scripted.add(tool_call("ledger", {}, id="c1"), "Booked.")

    assert chat.ask("Book it").content == "Booked."

    assert ledger_rows(chat.pk) == [(chat.pk, "c1", True, True)]
    call = chat.tool_calls.get()
    assert (call.state, call.result.content) == (ToolCallState.SUCCEEDED, "booked c1")
    assert call.started_at is not None and call.finished_at is not None
    assert chat.lease_token == ""


def test_the_class_form_is_transactional_too(chat, scripted):
    scripted.add(tool_call("transfer", {}, id="t1"), "Moved.")

    chat.ask("Move it")

    assert Transfer.transactional is True
    assert ledger_rows(chat.pk) == [(chat.pk, "t1", True, True)]


@pytest.mark.parametrize(
    ("name", "result"),
    [
        ("ledger_then_refuse", "the ledger is closed"),
        ("ledger_then_crash", "Tool 'ledger_then_crash' failed: RuntimeError: the ledger broke"),
    ],
)
def test_a_tool_that_fails_leaves_none_of_its_writes_and_its_error_result_commits(
    chat, scripted, name, result
):
    scripted.add(tool_call(name, {}, id="c1"), "It failed.")

    chat.ask("Book it")

    assert ledger_rows(chat.pk) == [(chat.pk, "c1", False, True)]
    call = chat.tool_calls.get()
    assert (call.state, call.result.content, call.result.is_error) == (
        ToolCallState.FAILED,
        result,
        True,
    )
    assert call.error  # what went wrong, for whoever debugs it


def test_writes_the_database_refuses_at_the_commit_roll_back_and_the_model_hears_why(
    chat, scripted
):
    chat.with_tools(ledger_for_a_missing_chat)
    scripted.add(tool_call("ledger_for_a_missing_chat", {}, id="c1"), "It failed.")

    assert chat.ask("Book it").content == "It failed."

    assert ledger_rows(chat.pk) == [(chat.pk, "c1", False, True)]
    call = chat.tool_calls.get()
    assert call.state == ToolCallState.FAILED
    assert call.result.content.startswith(
        "Tool 'ledger_for_a_missing_chat' failed: the database refused its writes when they "
        "were committed (IntegrityError: "
    )
    assert call.result.content.endswith("none of them were kept.")
    assert Note.objects.count() == 0


def test_an_ordinary_tool_that_fails_keeps_what_it_wrote(chat, scripted):
    scripted.add(tool_call("plain_ledger_then_crash", {}, id="c1"), "It failed.")

    chat.ask("Book it")

    assert ledger_rows(chat.pk) == [(chat.pk, "c1", True, True)]


def test_a_tool_that_asks_a_person_leaves_none_of_its_writes_and_the_call_waits(chat, scripted):
    scripted.add(tool_call("ledger_then_ask", {}, id="c1"), "Thanks.")

    chat.ask("Book it")

    assert chat.is_waiting()
    (question,) = chat.pending_questions()
    assert (question.call_id, question.question) == ("c1", "Which account?")
    assert notes_of(chat) == []
    chat.answer("c1", "Savings")
    assert chat.complete().content == "Thanks."
    assert ledger_rows(chat.pk) == [(chat.pk, "c1", False, True)]  # the answer is the result


def test_a_round_of_several_calls_commits_each_with_its_own_result(chat, scripted):
    scripted.add(
        [
            tool_call("ledger", {}, id="c1"),
            tool_call("ledger_then_refuse", {}, id="c2"),
            tool_call("transfer", {}, id="c3"),
        ],
        "Done.",
    )

    chat.ask("Book three")

    assert ledger_rows(chat.pk) == [
        (chat.pk, "c1", True, True),
        (chat.pk, "c2", False, True),
        (chat.pk, "c3", True, True),
    ]
    assert notes_of(chat) == ["c1", "c3"]


def test_callbacks_and_signals_hear_of_a_result_once_it_is_committed(chat, scripted):
    from agentloop import signals

    seen: list[tuple[str, bool, bool]] = []

    def committed_elsewhere(message) -> tuple[bool, bool]:
        """What another connection (another process, a live page) sees now."""
        found: list[bool] = []

        def read() -> None:
            try:
                found.append(Note.objects.filter(chat=chat).exists())
                found.append(type(message).objects.filter(pk=message.pk).exists())
            finally:
                connection.close()

        thread = threading.Thread(target=read)
        thread.start()
        thread.join()
        return found[0], found[1]

    def on_finished(*, chat, message, **kwargs) -> None:
        seen.append(("signal", *committed_elsewhere(message)))

    chat.after_tool_result(lambda message: seen.append(("callback", *committed_elsewhere(message))))
    signals.tool_call_finished.connect(on_finished)
    scripted.add(tool_call("ledger", {}, id="c1"), "Booked.")
    try:
        chat.ask("Book it")
    finally:
        signals.tool_call_finished.disconnect(on_finished)

    assert sorted(seen) == [("callback", True, True), ("signal", True, True)]


# -- the lease: one writer, checked inside the transaction ----------------------------------
@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_a_step_whose_lease_is_taken_over_mid_tool_rolls_the_tool_back(chat, scripted):
    scripted.add(tool_call("ledger_then_lose_the_chat", {}, id="c1"), "Booked.")

    with pytest.raises(LeaseLostError):
        chat.ask("Book it")

    assert transactional_tools.THREADS  # the tool ran, and wrote its Note...
    assert ledger_rows(chat.pk) == [(chat.pk, "c1", False, False)]  # ... rolled back
    call = chat.tool_calls.get()
    assert call.state == ToolCallState.RUNNING  # cut short: nothing of the run is left


def test_a_step_whose_lease_is_taken_over_before_the_tool_commits_nothing(chat, scripted):
    # Taken over just after the call was marked running, before its transaction: on SQLite
    # the transaction's first statement (the lease's renewal) finds it gone and the tool
    # never runs; elsewhere the tool runs and the check with its result rolls it back.
    chat.before_tool_call(lambda call: steal_lease(chat.pk))
    scripted.add(tool_call("ledger", {}, id="c1"), "Booked.")

    with pytest.raises(LeaseLostError):
        chat.ask("Book it")

    assert len(THREADS) == (0 if connection.vendor == "sqlite" else 1)  # the tool's runs
    assert ledger_rows(chat.pk) == [(chat.pk, "c1", False, False)]


def test_after_a_takeover_the_new_holder_runs_the_call_again_exactly_once(chat, scripted, user):
    chat.before_tool_call(lambda call: steal_lease(chat.pk))
    scripted.add(tool_call("ledger", {}, id="c1"), "Booked.")
    with pytest.raises(LeaseLostError):
        chat.ask("Book it")

    # The thief was a process that died: the chat is freed (manage.py agentloop unlock).
    from agentloop.runners.sweeper import free_chat

    Chat.objects.filter(pk=chat.pk).update(state="idle")
    free_chat(chat.pk)
    rescued = Chat.objects.get(pk=chat.pk)
    assert rescued.complete().content == "Booked."

    assert ledger_rows(chat.pk) == [(chat.pk, "c1", True, True)]
    assert notes_of(chat) == ["c1"]


# -- connection faults: nothing committed, or the commit found ------------------------------
@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_a_connection_dropped_mid_tool_rolls_the_run_back_and_it_runs_again_on_a_new_one(
    chat, scripted
):
    chat.with_tools(ledger_then_drop_connection)
    scripted.add(tool_call("ledger_then_drop_connection", {}, id="c1"), "Booked.")

    assert chat.ask("Book it").content == "Booked."

    assert len(THREADS) == 2  # the first run's write went with its connection
    assert ledger_rows(chat.pk) == [(chat.pk, "c1", True, True)]
    assert notes_of(chat) == ["c1"]
    chat.refresh_from_db()
    assert (chat.state, chat.error, chat.lease_token) == ("idle", "", "")


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_a_commit_whose_answer_is_lost_is_found_committed_and_the_tool_not_run_again(
    chat, scripted, monkeypatch
):
    from agentloop.django_store.tool_calls import ToolCalls
    from tests.db_faults import lose_next_reply, through_proxy

    write = ToolCalls.save_tool_result

    def then_lose_the_commits_answer(self, *args, **kwargs):
        record = write(self, *args, **kwargs)
        lose_next_reply()  # the next statement is the transaction's COMMIT
        return record

    monkeypatch.setattr(ToolCalls, "save_tool_result", then_lose_the_commits_answer)
    scripted.add(tool_call("ledger", {}, id="c1"))
    with through_proxy() as proxy:
        chat.ask_later("Book it").generate()
        (record,) = chat.run_tools()

    assert proxy.cuts == 1
    assert record.content == "booked c1"
    assert len(THREADS) == 1  # once: its commit went through
    assert ledger_rows(chat.pk) == [(chat.pk, "c1", True, True)]


def test_a_call_cut_short_by_a_crash_is_run_again_and_writes_once(chat, scripted):
    # What a crash mid-tool leaves: the call marked running, no result, nothing of the run.
    scripted.add(tool_call("ledger", {}, id="c1"), "Booked.")
    chat.ask_later("Book it").generate()
    chat.tool_calls.update(state=ToolCallState.RUNNING)

    assert chat.complete().content == "Booked."

    assert ledger_rows(chat.pk) == [(chat.pk, "c1", True, True)]
    assert chat.tool_calls.get().result.is_error is False


# -- rounds run concurrently, async verbs, the in-memory chat -------------------------------
def test_in_a_concurrent_round_transactional_tools_run_one_by_one_on_the_verbs_thread(
    chat, scripted
):
    scripted.add(
        [
            tool_call("lookup", {}, id="l1"),
            tool_call("ledger", {}, id="c1"),
            tool_call("lookup", {}, id="l2"),
            tool_call("transfer", {}, id="c2"),
        ],
        "All done.",
    )
    chat.with_tool_options(concurrency="threads")

    assert chat.ask("Go").content == "All done."

    verb_thread = threading.current_thread().name
    assert THREADS[:2] == [verb_thread, verb_thread]  # the transactional ones, first, here
    assert all(name.startswith("agentloop-tool") for name in THREADS[2:])
    assert len(THREADS) == 4
    assert ledger_rows(chat.pk) == [
        (chat.pk, "l1", False, True),
        (chat.pk, "c1", True, True),
        (chat.pk, "l2", False, True),
        (chat.pk, "c2", True, True),
    ]


def test_async_verbs_run_a_transactional_tool_in_the_same_transaction(chat, scripted):
    scripted.add(
        [tool_call("ledger", {}, id="c1"), tool_call("ledger_then_crash", {}, id="c2")], "Half."
    )

    # From this thread: the verb's database phases run here, and so does the tool.
    answer = async_to_sync(chat.aask)("Book two")

    assert answer.content == "Half."
    assert THREADS == [threading.current_thread().name] * 2
    assert ledger_rows(chat.pk) == [(chat.pk, "c1", True, True), (chat.pk, "c2", False, True)]


def test_an_in_memory_chat_runs_a_transactional_tool_as_any_other(scripted):
    booked: list[str] = []

    @tool(transactional=True)
    def book(seat: str) -> str:
        """Books a seat."""
        booked.append(seat)
        return f"booked {seat}"

    scripted.add(tool_call("book", {"seat": "12A"}), "Booked 12A.")
    memory = agentloop.chat("scripted:test", tools=[book])

    assert memory.ask("Book 12A").content == "Booked 12A."
    assert booked == ["12A"]


# -- what it costs -------------------------------------------------------------------------
#: the statements of a step running one call (claim + read, the call's claim, then the rest).
#: On PostgreSQL the transcript read is a WITH: it sends only rows the process doesn't have
#: (django_store/transcript_reads.py).
ORDINARY = {
    # the result's write releases the chat in the same statement
    "postgresql": ["UPDATE", "WITH", "UPDATE", "WITH"],
    "sqlite": ["UPDATE", "SELECT", "UPDATE", "BEGIN", "UPDATE", "INSERT", "UPDATE", "COMMIT"],
}
TRANSACTIONAL = {
    # the tool's INSERT in a savepoint, the result's write (its lease check first) in the
    # same transaction, then the verb's release after the commit
    "postgresql": [
        "UPDATE", "WITH", "UPDATE",
        "BEGIN", "SAVEPOINT", "INSERT", "RELEASE", "WITH", "COMMIT",
        "UPDATE",
    ],
    # the lease renewed first, which takes the database's write lock for the whole run
    "sqlite": [
        "UPDATE", "SELECT", "UPDATE",
        "BEGIN", "UPDATE", "SAVEPOINT", "INSERT", "RELEASE", "UPDATE", "INSERT", "UPDATE",
        "COMMIT",
        "UPDATE",
    ],
}  # fmt: skip


@pytest.mark.parametrize(("name", "statements"), [("lookup", ORDINARY), ("ledger", TRANSACTIONAL)])
def test_the_statements_of_a_step_running_one_call(chat, scripted, name, statements):
    scripted.add(tool_call(name, {}, id="c1"))
    chat.ask_later("go").generate()

    with CaptureQueriesContext(connection) as captured:
        chat.run_tools()

    assert [query["sql"].split()[0] for query in captured.captured_queries] == statements[
        connection.vendor
    ]
    assert notes_of(chat) == (["c1"] if name == "ledger" else [])


# -- options that can't go together --------------------------------------------------------
def test_an_async_transactional_tool_is_refused_where_it_is_defined():
    with pytest.raises(ConfigurationError, match="@tool book: a transactional tool must be"):

        @tool(transactional=True)
        async def book() -> str:
            """Books."""
            return "booked"

    with pytest.raises(ConfigurationError, match="Tool .*Book: a transactional tool must be"):

        class Book(Tool):
            transactional = True

            async def execute(self) -> str:
                return "booked"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"deferred": True}, "a deferred tool is never run by agentloop"),
        ({"idempotent": False}, "idempotent=False forbids that"),
        ({"transactional": "yes"}, "transactional must be True or False"),
    ],
)
def test_options_a_transactional_tool_cant_have_are_refused(options, message):
    with pytest.raises(ConfigurationError, match=message):
        tool(**{"transactional": True, **options})(lambda: "x")

    attributes = {"transactional": True, **options, "execute": lambda self: "x"}
    with pytest.raises(ConfigurationError, match=message):
        type("Book", (Tool,), attributes)


def test_an_agents_tool_cant_be_transactional():
    from agentloop.agents import AgentTool

    with pytest.raises(ConfigurationError, match="an agent's tool runs a chat of its own"):
        type("ResearchTool", (AgentTool,), {"transactional": True})


def test_a_transactional_tool_that_requires_approval_runs_in_its_transaction_once_approved(
    chat, scripted, user
):
    chat.with_tools(approved_ledger)
    scripted.add(tool_call("approved_ledger", {}, id="c1"), "Booked.")
    chat.ask("Book it")
    assert chat.is_waiting() and notes_of(chat) == []

    chat.approve("c1", by=user)

    assert chat.complete().content == "Booked."
    assert ledger_rows(chat.pk) == [(chat.pk, "c1", True, True)]


# -- a process killed at each point of the run, then the chat driven on in process -----------
@pytest.mark.subprocess
@pytest.mark.parametrize("point", POINTS)
def test_a_caller_killed_at_any_point_leaves_all_or_nothing_and_the_rerun_books_once(
    chat, user, tmp_path, point
):
    import subprocess

    chat.model = "rules:test"
    chat.save(update_fields=["model"])
    chat.ask_later("tools:ledger")
    arm(tmp_path, chat.pk, point)
    env = process_env(**{ENV: tmp_path})
    process = subprocess.Popen(  # noqa: S603 - our own interpreter and script
        command("drive_chat.py", chat.pk, '{"verb": "complete"}'),
        env=env,
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        from tests.helpers import wait_until

        wait_until(lambda: reached(tmp_path, chat.pk, point) or process.poll(), f"the {point}")
        assert process.poll() is None, "the driver ended before the kill point"
    finally:
        process.kill()
        process.wait(timeout=30)

    committed = point == "after_commit"
    assert ledger_rows(chat.pk) == [(chat.pk, "call_1_0_0", committed, committed)]

    # In process: the dead caller's lease is taken over at once (its holder is gone).
    rescued = Chat.objects.get(pk=chat.pk)
    assert rescued.complete().content == "done: booked call_1_0_0"
    assert ledger_rows(chat.pk) == [(chat.pk, "call_1_0_0", True, True)]
    assert notes_of(chat) == ["call_1_0_0"]
    assert transcript(rescued, "role", "call_id") == [
        ("user", None),
        ("assistant", None),
        ("tool", "call_1_0_0"),
        ("assistant", None),
    ]

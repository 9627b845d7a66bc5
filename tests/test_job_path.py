"""The job path's writes (docs/design.md §13): each write renews or releases the lease first
and writes nothing when the lease was taken over meanwhile; on PostgreSQL that is one
statement (agentloop/django_store/writes.py), elsewhere a transaction. Run on both."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agentloop import ConcurrentWriteError, providers, tool
from agentloop.messages import Message, ToolCallState
from agentloop.models import Chat, ToolCall, Usage
from agentloop.runners import run_step
from agentloop.testing import FunctionProvider, tool_call

pytestmark = pytest.mark.django_db


def take_over(chat_pk: int) -> None:
    """Another process takes the chat's lease (as after an expiry)."""
    Chat.objects.filter(pk=chat_pk).update(
        lease_token="someone-else", lease_expires_at=timezone.now() + timedelta(minutes=5)
    )


@tool
def usurp(chat_pk: int) -> str:
    """Takes the chat's lease away from the step that runs this tool.

    Args:
        chat_pk: The chat.
    """
    take_over(chat_pk)
    return "done"


@pytest.fixture
def model():
    """A model that takes the lease over while it answers, when told to."""
    state = {"usurp": False, "answer": "answered"}

    def answer(request):
        if state["usurp"]:
            take_over(state["chat"])
        return state["answer"]

    providers.register("jobpath", FunctionProvider(answer))
    yield state
    providers.unregister("jobpath")


def test_an_answer_written_after_a_takeover_writes_nothing(user, model):
    chat = Chat.objects.create(model="jobpath:test", owner=user)
    chat.ask_later("Hi")
    model.update(usurp=True, chat=chat.pk, answer=tool_call("add", {"a": 1, "b": 2}))
    chat.complete_later()

    assert run_step(chat.pk).action == "lost"

    assert list(chat.messages.values_list("role", flat=True)) == ["user"]
    assert not ToolCall.objects.filter(chat=chat).exists()
    assert not Usage.objects.filter(chat=chat).exists()
    # The new holder's lease is untouched.
    assert Chat.objects.get(pk=chat.pk).lease_token == "someone-else"


def test_a_tool_result_written_after_a_takeover_writes_nothing(user, model):
    chat = Chat.objects.create(model="jobpath:test", owner=user)
    chat.with_tools(usurp)
    chat.ask_later("Take it")
    model["answer"] = tool_call("usurp", {"chat_pk": chat.pk})
    chat.generate()  # the model asks for the tool; nothing runs yet
    Chat.objects.filter(pk=chat.pk).update(state="queued")  # as complete_later() leaves it

    assert run_step(chat.pk).action == "lost"

    assert list(chat.messages.values_list("role", flat=True)) == ["user", "assistant"]
    call = ToolCall.objects.get(chat=chat)
    assert call.state == ToolCallState.RUNNING  # claimed and run, its result not written
    assert Chat.objects.get(pk=chat.pk).lease_token == "someone-else"


def test_an_answer_and_its_calls_are_written_together_with_the_release(user, model):
    chat = Chat.objects.create(model="jobpath:test", owner=user)
    chat.ask_later("Add twice")
    model["answer"] = [tool_call("add", {"a": 1, "b": 2}), tool_call("add", {"a": 3, "b": 4})]
    chat.complete_later()

    assert run_step(chat.pk).action == "again"

    chat = Chat.objects.get(pk=chat.pk)
    assert (chat.state, chat.lease_token, chat.lease_expires_at) == ("queued", "", None)
    answer = chat.messages.get(role="assistant")
    calls = list(answer.tool_calls.order_by("id").values_list("name", "arguments", "state"))
    assert calls == [("add", {"a": 1, "b": 2}, "pending"), ("add", {"a": 3, "b": 4}, "pending")]
    usage = Usage.objects.get(chat=chat)
    assert (usage.message_id, usage.owner_id, usage.status) == (answer.pk, user.pk, "succeeded")
    transcript = chat.conversation.messages
    assert [call.key for call in transcript[-1].tool_calls] == list(
        answer.tool_calls.order_by("id").values_list("pk", flat=True)
    )


def test_a_duplicate_tool_result_is_refused_and_the_callers_transaction_goes_on(user, model):
    chat = Chat.objects.create(model="jobpath:test", owner=user)
    chat.ask_later("Add")
    model["answer"] = tool_call("add", {"a": 1, "b": 2})
    chat.generate()
    chat.run_tools()
    store = chat.conversation.store
    call = chat.conversation.messages[-2].tool_calls[0]
    store.runs.claim()
    with transaction.atomic():
        with pytest.raises(ConcurrentWriteError):
            store.tool_calls.save_tool_result(
                call, Message(role="tool", content="again"), ToolCallState.SUCCEEDED, None
            )
        # The caller's transaction is still usable.
        assert chat.messages.filter(role="tool").count() == 1
    store.runs.release(None)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="prepared statements: PostgreSQL")
def test_with_a_prepare_threshold_the_per_step_statements_are_prepared(user, model):
    """The database's OPTIONS ``prepare_threshold`` lets psycopg prepare agentloop's per-step
    statements (they bind on the server); Django's own stay unprepared. Steps run the same."""
    connection.ensure_connection()
    raw = connection.connection
    before = raw.prepare_threshold
    raw.prepare_threshold = 0  # as OPTIONS {"prepare_threshold": 0} would set it
    try:
        for turn in range(3):
            chat = Chat.objects.create(model="jobpath:test", owner=user)
            chat.ask_later(f"Question {turn}")
            model["answer"] = f"Answer {turn}"
            chat.complete_later()
            assert run_step(chat.pk).action == "done"
            assert chat.messages.last().content == f"Answer {turn}"
        with connection.cursor() as cursor:
            cursor.execute("SELECT statement FROM pg_prepared_statements")
            prepared = [row[0] for row in cursor.fetchall()]
    finally:
        raw.prepare_threshold = before
    assert any(sql.startswith('UPDATE "agentloop_chat" SET "lease_token"') for sql in prepared)
    # The transcript's read (the rows this process doesn't have yet: transcript_reads).
    assert any(sql.startswith("WITH t AS (SELECT m.") for sql in prepared)
    assert any(sql.startswith("WITH g AS (UPDATE") for sql in prepared)
    assert not any("pg_prepared_statements" in sql for sql in prepared)


def _prepared_by_a_step(user: object, model: dict, question: str) -> set[str]:
    """The statements a background step left prepared on the connection (new ones only)."""
    connection.ensure_connection()

    def prepared() -> set[str]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT statement FROM pg_prepared_statements")
            return {row[0] for row in cursor.fetchall()}

    before = prepared()
    chat = Chat.objects.create(model="jobpath:test", owner=user)
    chat.ask_later(question)
    model["answer"] = f"Answer to {question}"
    # Queued as complete_later() leaves it, without enqueueing a job: under
    # django_db(transaction=True) that job would start at once on the embedded runner.
    Chat.objects.filter(pk=chat.pk).update(state="queued")
    assert run_step(chat.pk).action == "done"
    assert chat.messages.last().content == f"Answer to {question}"
    return prepared() - before


@pytest.mark.skipif(connection.vendor != "postgresql", reason="prepared statements: PostgreSQL")
@pytest.mark.django_db(transaction=True)
def test_per_step_statements_are_prepared_on_their_second_run_by_default(user, model):
    """By default (``AGENTLOOP["PREPARED_STATEMENTS"]``) the per-step statements are prepared
    the second time they run on a connection (not the first: a connection opened per job
    would pay for it every job), whatever its ``prepare_threshold`` (Django's default None);
    Django's own statements stay unprepared. Set to False, nothing is prepared."""
    connection.close()  # a connection of its own: none of the statements ran on it yet
    connection.ensure_connection()
    raw = connection.connection
    raw.prepare_threshold = None  # Django's default, whatever the test database's OPTIONS
    with override_settings(AGENTLOOP={"PREPARED_STATEMENTS": False}):
        assert _prepared_by_a_step(user, model, "Unprepared?") == set()
        assert _prepared_by_a_step(user, model, "Still unprepared?") == set()
    first = _prepared_by_a_step(user, model, "First run?")
    # (ask_later read the transcript before the job did: that read is its second.)
    assert not any(sql.startswith('UPDATE "agentloop_chat" SET "lease_token"') for sql in first)
    assert not any(sql.startswith("WITH g AS (UPDATE") for sql in first)
    with CaptureQueriesContext(connection) as logged:
        prepared = _prepared_by_a_step(user, model, "Second run?")
    # Prepared statements are logged with their text, as Django logs its own.
    assert all(isinstance(query["sql"], str) for query in logged.captured_queries)
    assert any("WITH g AS (UPDATE" in query["sql"] for query in logged.captured_queries)
    assert any(sql.startswith('UPDATE "agentloop_chat" SET "lease_token"') for sql in prepared)
    assert any(sql.startswith("WITH g AS (UPDATE") for sql in prepared)
    everything = first | prepared
    assert any(sql.startswith("WITH t AS (SELECT m.") for sql in everything)
    assert not any("pg_prepared_statements" in sql for sql in everything)
    assert not any(sql.startswith("INSERT INTO") for sql in everything)  # Django's create()
    assert _prepared_by_a_step(user, model, "Third run?") == set()  # nothing new to prepare
    connection.close()


def _lose_prepared_statements() -> int:
    """Deallocate the session's prepared statements behind psycopg's back, as a pooler that
    hands the next transaction another server connection does: psycopg still believes them
    there. How many there were."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM pg_prepared_statements")
        names = [row[0] for row in cursor.fetchall()]
        for name in names:
            # One by name: psycopg forgets its own list only at DEALLOCATE ALL.
            cursor.execute(f'DEALLOCATE "{name}"')
    return len(names)


def _from_another_connection(sql: str) -> None:
    """Run ``sql`` on a connection of its own (a migration elsewhere: this connection's psycopg
    doesn't see it)."""
    import psycopg

    settings = connection.settings_dict
    with psycopg.connect(
        host=settings["HOST"] or "127.0.0.1",
        port=settings["PORT"] or 5432,
        user=settings["USER"] or "postgres",
        dbname=settings["NAME"],
        autocommit=True,
    ) as other:
        other.execute(sql)


@pytest.fixture
def preparing_again():
    """Whatever a test's pooler errors switched off is on again afterwards."""
    from agentloop.django_store import sql

    yield sql._UNPREPARED
    sql._UNPREPARED.clear()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="prepared statements: PostgreSQL")
@pytest.mark.django_db(transaction=True)
def test_a_pooler_losing_prepared_statements_costs_a_warning_not_a_job(
    user, model, preparing_again, caplog
):
    """Behind a pooler that doesn't keep prepared statements (pgbouncer before 1.21 in
    transaction mode) the first job that meets "prepared statement ... does not exist" runs
    its statement again unprepared and succeeds; the process warns once and prepares nothing
    more on that database."""
    connection.close()  # a connection of its own: none of the statements ran on it yet
    connection.ensure_connection()
    raw = connection.connection
    before = raw.prepare_threshold
    raw.prepare_threshold = None
    try:
        _prepared_by_a_step(user, model, "Run once?")
        assert _prepared_by_a_step(user, model, "Prepared?")  # the claim, the read, the write
        assert _lose_prepared_statements() >= 3
        with caplog.at_level("WARNING", logger="agentloop"):
            for turn in range(2):
                assert _prepared_by_a_step(user, model, f"After the pooler {turn}?") == set()
    finally:
        raw.prepare_threshold = before
    warnings = [r.getMessage() for r in caplog.records if "prepared statement" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "does not exist" in warnings[0]
    assert 'AGENTLOOP["PREPARED_STATEMENTS"] = False' in warnings[0]
    assert preparing_again == {"default"}
    assert Chat.objects.filter(state="idle", lease_token="").count() == 4


@pytest.mark.skipif(connection.vendor != "postgresql", reason="prepared statements: PostgreSQL")
@pytest.mark.django_db(transaction=True)
def test_a_lost_prepared_statement_inside_a_transaction_fails_that_block_only(
    user, model, preparing_again
):
    """Inside a caller's transaction the failed statement can't simply run again (the
    transaction is broken): the block fails with Django's database error and nothing of it
    is kept; the next one, unprepared, succeeds."""
    from django.db import DatabaseError

    chat = Chat.objects.create(model="jobpath:test", owner=user)
    chat.ask("Warm up")
    chat.ask("Warm up again")  # the second run prepares the per-step statements
    assert _lose_prepared_statements() >= 3
    model["answer"] = "Second answer"
    with pytest.raises(DatabaseError, match="does not exist"), transaction.atomic():
        chat.ask("Inside a transaction")
    assert [m.content for m in chat.messages.all()][-1] == "answered"
    assert preparing_again == {"default"}
    fresh = Chat.objects.get(pk=chat.pk)
    assert fresh.ask("Again").content == "Second answer"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="prepared statements: PostgreSQL")
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("verb", ["run_step", "ask"])
def test_a_migration_under_prepared_statements_costs_no_job(
    user, model, preparing_again, caplog, verb
):
    """A migration that changes a column the claim returns, run from elsewhere while this
    process holds the claim prepared, makes PostgreSQL refuse the cached plan ("cached plan
    must not change result type"): the connection's prepared statements are dropped, the
    statement runs again, and nothing fails; preparing goes on (no pooler warning)."""
    connection.close()  # a connection of its own: none of the statements ran on it yet
    _prepared_by_a_step(user, model, "Run once?")
    _prepared_by_a_step(user, model, "Prepared?")
    table = Chat._meta.db_table
    _from_another_connection(f'ALTER TABLE "{table}" ALTER COLUMN "title" TYPE varchar(201)')
    try:
        with caplog.at_level("WARNING", logger="agentloop"):
            if verb == "run_step":
                _prepared_by_a_step(user, model, "After the migration?")
            else:
                chat = Chat.objects.create(model="jobpath:test", owner=user)
                model["answer"] = "Answered after the migration"
                assert chat.ask("After the migration?").content == model["answer"]
            # and the statements prepared again afterwards work as prepared ones
            _prepared_by_a_step(user, model, "And after that?")
    finally:
        _from_another_connection(f'ALTER TABLE "{table}" ALTER COLUMN "title" TYPE varchar(200)')
    assert preparing_again == set()
    assert not [r for r in caplog.records if "prepared statement" in r.getMessage()]
    with connection.cursor() as cursor:  # prepared again, under new names
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [row[0] for row in cursor.fetchall()]
    assert any(sql.startswith('UPDATE "agentloop_chat" SET "lease_token"') for sql in prepared)

"""SQL statements per step don't grow with the history (docs/design.md §2, §13): the same count
at 10 and at 200 messages, and the exact count asserted so a new query shows up as a failing test.

Every writing verb runs under the chat's claim (docs/design.md §12). Inside the test's transaction
atomic blocks are SAVEPOINT/RELEASE (BEGIN/COMMIT outside it, which Django doesn't log).

On PostgreSQL a step's write is one statement (a data-modifying CTE: the lease's renewal or
release first, every row written behind it; see agentloop/django_store/writes.py):
  generate, text answer:  claim (UPDATE ... RETURNING the chat row), transcript read (the
                          claim's row carries the cancel flag: the start checkpoint is
                          free), SAVEPOINT, the write (release with the chat's next
                          state + INSERT message + INSERT usage), RELEASE            = 5
  generate, 2 tool calls: the same; the write also INSERTs both tool calls         = 5
  run_tools, 2 calls:     claim, transcript read                                     = 2
                          each call: UPDATE running (conditional on its state and on
                          the lease), SAVEPOINT, the write (lease renewal, which
                          reads the cancel flag, or for the last call the release +
                          INSERT result + UPDATE call), RELEASE              2 x 4 = 8
Outside a transaction SAVEPOINT/RELEASE are not sent: a job's model step is 3 statements.

SQLite has no data-modifying CTE: each write is a transaction of its statements.
  generate, text answer:  claim, transcript, SAVEPOINT, release, INSERT message,
                          INSERT usage, RELEASE                                      = 7
  generate, 2 tool calls: the same + one INSERT of both tool calls (bulk)            = 8
  run_tools, 2 calls:     claim, transcript + 2 x (UPDATE running, SAVEPOINT, lease
                          renewal or release, INSERT result, UPDATE state, RELEASE) = 14
A job (``run_step``) costs the same as the verb: its claim also loads the chat.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from agentloop import live_events as events
from agentloop.messages import ToolCallState
from agentloop.models import Chat, Message, ToolCall
from agentloop.runners import run_step
from agentloop.testing import tool_call
from tests.step_queries import (
    GENERATE_TEXT_QUERIES,
    GENERATE_TOOL_CALLS_QUERIES,
    ONE_STATEMENT_WRITES,
    RUN_TOOLS_QUERIES,
)
from tests.tools import add

pytestmark = pytest.mark.django_db


# A long poll interval keeps the throttled "before the model request" check from
# depending on how fast the machine is: only the forced checks read.
SLOW_POLL = override_settings(AGENTLOOP={"CANCEL_POLL_INTERVAL": 60, "PARTIAL_SAVE_INTERVAL": 60})


def build_history(chat, length):
    """Settled history of ``length`` messages: rounds of user, assistant asking for two
    tools, two results, final answer (written directly, in bulk, for speed)."""
    assert length % 5 == 0
    messages = []
    for turn in range(length // 5):
        messages += [
            Message(chat=chat, role="user", content=f"question {turn}"),
            Message(chat=chat, role="assistant", content=""),
            Message(chat=chat, role="tool", content=f"{turn}+1"),
            Message(chat=chat, role="tool", content=f"{turn}+2"),
            Message(chat=chat, role="assistant", content=f"answer {turn}"),
        ]
    Message.objects.bulk_create(messages)
    calls = []
    for turn in range(length // 5):
        asking = messages[turn * 5 + 1]
        calls += [
            ToolCall(
                chat=chat,
                message=asking,
                call_id=f"history_{turn}_{n}",
                name="add",
                arguments={"a": turn, "b": n},
                state=ToolCallState.SUCCEEDED,
            )
            for n in (1, 2)
        ]
    ToolCall.objects.bulk_create(calls)
    results = []
    for turn in range(length // 5):
        for n in (0, 1):
            result = messages[turn * 5 + 2 + n]
            result.tool_call = calls[turn * 2 + n]
            results.append(result)
    Message.objects.bulk_update(results, ["tool_call"])


def make_chat(user, length):
    chat = Chat.objects.create(model="scripted:test", owner=user)
    chat.with_tools(add)
    build_history(chat, length)
    assert chat.messages.count() == length
    assert chat.is_complete()
    return Chat.objects.get(pk=chat.pk)


def count_queries(action):
    with CaptureQueriesContext(connection) as captured:
        action()
    return len(captured), [query["sql"] for query in captured.captured_queries]


def two_calls():
    return [tool_call("add", {"a": 1, "b": 2}), tool_call("add", {"a": 3, "b": 4})]


def text_answer(chat, scripted):
    chat.ask_later("next question")
    scripted.add("next answer")
    return lambda: chat.messages.last().content == "next answer"


def two_tool_calls(chat, scripted):
    chat.ask_later("add twice")
    scripted.add(two_calls())
    return lambda: chat.messages.last().tool_calls.count() == 2


def two_tool_results(chat, scripted):
    two_tool_calls(chat, scripted)
    chat.generate()
    return lambda: [m.content for m in chat.messages.filter(role="tool")][-2:] == ["3", "7"]


def job(chat):
    """What the Celery task runs for one step (in the embedded runner's shape), on the chat
    queued as ``complete_later()`` leaves it (a job takes only a chat in flight)."""
    type(chat).objects.filter(pk=chat.pk).update(state="queued")
    return lambda: run_step(chat.pk)


@SLOW_POLL
@pytest.mark.parametrize(
    ("setup", "verb", "expected"),
    [
        (text_answer, lambda chat: chat.generate, GENERATE_TEXT_QUERIES),
        (two_tool_calls, lambda chat: chat.generate, GENERATE_TOOL_CALLS_QUERIES),
        (two_tool_results, lambda chat: chat.run_tools, RUN_TOOLS_QUERIES),
        # A job (run_step) costs what the verb costs: its claim also loads the chat.
        (text_answer, job, GENERATE_TEXT_QUERIES),
        (two_tool_results, job, RUN_TOOLS_QUERIES),
    ],
    ids=["generate-text", "generate-tool-calls", "run-tools", "job-model-step", "job-tools"],
)
def test_a_step_costs_the_same_queries_at_10_and_200_messages(
    user, scripted, setup, verb, expected
):
    counts = {}
    for length in (10, 200):
        chat = make_chat(user, length)
        done = setup(chat, scripted)
        counts[length], sql = count_queries(verb(chat))
        assert done()

    assert counts[10] == counts[200], sql
    assert counts[200] == expected, sql


@SLOW_POLL
def test_complete_reads_the_history_once_per_turn(user, scripted):
    """Loop mode: one claim and one transcript read for the whole turn; each later step
    checks only the cancel flag (read by its first write's lease renewal, for free)."""
    counts = {}
    for length in (10, 200):
        chat = make_chat(user, length)
        chat.ask_later("add twice, then answer")
        scripted.add(two_calls(), "10")
        counts[length], sql = count_queries(chat.complete)
        assert chat.messages.last().content == "10"

    assert counts[10] == counts[200], sql
    # The read is a plain SELECT, or on PostgreSQL the one that skips the rows this
    # process has (agentloop.django_store.transcript_reads).
    reads = ("SELECT", "WITH t AS (SELECT")
    transcript_reads = [q for q in sql if q.startswith(reads) and "agentloop_message" in q]
    assert len(transcript_reads) == 1, sql
    # The flag comes back from each write: no step reads it on its own.
    flag_reads = [q for q in sql if q.startswith("SELECT") and q not in transcript_reads]
    assert flag_reads == [], sql


def test_get_by_pk_is_the_orms_get_compiled_once(user):
    """``Chat.objects.get(pk=...)`` (a worker's load per job) runs a statement compiled once:
    one query, the same chat, and the ORM's errors."""
    chat = Chat.objects.create(model="scripted:test", owner=user, title="kept", limits={"a": 1})
    orm = Chat.objects.filter(pk=chat.pk).get()
    for _ in range(2):  # the second call uses the compiled statement
        queries, sql = count_queries(lambda: Chat.objects.get(pk=chat.pk))
        assert queries == 1, sql
    loaded = Chat.objects.get(id=chat.pk)
    fields = [field.attname for field in Chat._meta.concrete_fields]
    assert [getattr(loaded, name) for name in fields] == [getattr(orm, name) for name in fields]
    # Timestamps in the same time zone object as the ORM's (psycopg's own parser on PostgreSQL).
    assert loaded.created_at.tzinfo is orm.created_at.tzinfo
    assert loaded._state.db == "default" and not loaded._state.adding
    with pytest.raises(Chat.DoesNotExist, match="Chat matching query does not exist"):
        Chat.objects.get(pk=chat.pk + 1000)
    with pytest.raises(ValueError, match="expected a number but got 'x'"):
        Chat.objects.get(pk="x")
    assert Chat.objects.get(pk=str(chat.pk)) == chat
    # Anything else is the ORM's get.
    assert Chat.objects.get(pk=chat.pk, title="kept") == chat
    with pytest.raises(Chat.DoesNotExist):
        Chat.objects.get(pk=chat.pk, title="other")


#: a turn's start as users drive it (a view): ``ask_later(question).complete_later()``. On
#: PostgreSQL the claim, the transcript read, SAVEPOINT, the question's write (the lease's
#: renewal + INSERT, one statement), RELEASE, the release, and complete_later's UPDATE;
#: on SQLite the write is a transaction of the renewal and the INSERT.
ASK_QUERIES = 7 if ONE_STATEMENT_WRITES else 8


@SLOW_POLL
def test_adding_the_users_message_and_queueing_costs_the_same_at_10_and_200_messages(
    user, scripted
):
    counts = {}
    for length in (10, 200):
        chat = make_chat(user, length)
        counts[length], sql = count_queries(
            lambda chat=chat: chat.ask_later("next question").complete_later()
        )
        assert chat.state == "queued" and chat.messages.last().content == "next question"
    assert counts == {10: ASK_QUERIES, 200: ASK_QUERIES}, sql


@pytest.mark.parametrize("verb", [lambda chat: chat.generate, job], ids=["generate", "job"])
def test_live_events_cost_no_statement(user, scripted, settings, redis_events, verb):
    """With the Redis events backend, announcing a saved answer that asks for tools reads
    no row: its event carries the calls just saved, as the database has them."""
    settings.AGENTLOOP = {**settings.AGENTLOOP, "CANCEL_POLL_INTERVAL": 60}
    settings.AGENTLOOP["PARTIAL_SAVE_INTERVAL"] = 60
    chat = make_chat(user, 10)
    two_tool_calls(chat, scripted)
    queries, sql = count_queries(verb(chat))
    assert queries == GENERATE_TOOL_CALLS_QUERIES, sql
    assert events.flush()
    sent = events.get_backend().read(events.chat_key(chat), "0", 0)
    answer = Message.objects.get(pk=chat.messages.last().pk)
    payload = events.message_payload(answer)  # read from the database
    assert len(payload["tool_calls"]) == 2
    assert [event["data"] for event in sent if event["type"] == "message"][-1] == payload


def test_a_tracer_that_replaces_djangos_cursor_execute_sees_every_statement_of_a_step(
    user, scripted, monkeypatch
):
    # Sentry's Django integration replaces CursorWrapper.execute to see each statement: the
    # store's own quicker path must step aside for it (counted without Django's query log).
    from django.db.backends.utils import CursorWrapper

    seen = []
    django_execute = CursorWrapper.execute

    def traced(self, sql, params=None):
        seen.append(sql)
        return django_execute(self, sql, params)

    chat = make_chat(user, 10)
    validate = text_answer(chat, scripted)
    monkeypatch.setattr(CursorWrapper, "execute", traced)
    chat.generate()
    assert validate()
    step = seen[: len(seen) - 1]  # the check's own query last
    assert len(step) == GENERATE_TEXT_QUERIES, step

"""The async verbs (docs/async.md): the same moves as the sync verbs, driven from a coroutine.

Persisted chats and in-memory chats, a tool round with sync and ``async def`` tools, streams
with sync and async callbacks, the claim (ChatBusyError), approvals, limits, retries, a
fallback, a cancel from another OS process during an async stream, and query counts equal to
the sync verbs'.

How the tests reach the database: a coroutine run with asgiref's ``async_to_sync`` from the
test's thread runs its thread-sensitive phases on that same thread, with the test's
connection and transaction, so plain ``django_db`` tests work. ``asyncio.run`` would run them
on asgiref's shared thread with a connection of its own, which sees only committed rows
(``django_db(transaction=True)``, as the cross-process tests use anyway).
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import connection, connections
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

import agentloop
from agentloop import CancelledError, ChatBusyError, LimitReachedError, Tool, tool
from agentloop.django_store.leases import Lease
from agentloop.exceptions import ServerError
from agentloop.messages import MessageStatus, TextDelta, ToolCallState
from agentloop.models import Chat, Usage
from agentloop.testing import ScriptedProvider, stream, tool_call
from tests.processes import start_script
from tests.tools import add, transfer

FAST = {"MODEL_RETRIES": 2, "RETRY_BACKOFF": 0.001, "RETRY_BACKOFF_MAX": 0.001}
WORDS = [f"word{i} " for i in range(600)]  # 30 s at 0.05 s a chunk: a cancel always lands first


def run(function: Any, *args: Any, **kwargs: Any) -> Any:
    """Await ``function(*args, **kwargs)`` from this (the test's) thread."""
    return async_to_sync(function)(*args, **kwargs)


def run_in_new_loop(function: Any, *args: Any) -> Any:
    """Await ``function(*args)`` in a loop of its own (``asyncio.run``), as a script would; its
    database phases use asgiref's shared thread, whose connection is closed at the end."""

    async def main() -> Any:
        try:
            return await function(*args)
        finally:
            await sync_to_async(connections.close_all)()

    return asyncio.run(main())


@tool
async def shout(text: str) -> str:
    """An async tool: awaited on the verb's event loop."""
    await asyncio.sleep(0)
    return text.upper()


#: the threads sync tools ran on, by tool name (they must never run on the event loop).
THREADS: dict[str, str] = {}


@tool
def where(label: str) -> str:
    """A sync tool noting the thread it ran on."""
    THREADS[label] = threading.current_thread().name
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return f"{label}: no loop"
    return f"{label}: on a loop"


class Lookup(Tool):
    """An async class tool that fails: its error reaches the model as a result."""

    async def execute(self) -> str:
        await asyncio.sleep(0)
        raise RuntimeError("lookup service down")


def tool_round() -> list[Any]:
    return [
        tool_call("shout", {"text": "hi"}, id="a1"),
        tool_call("where", {"label": "sync"}, id="a2"),
        tool_call("add", {"a": 2, "b": 3}, id="a3"),
        tool_call("lookup", {}, id="a4"),
    ]


def check_round(results: dict[str, tuple[str, bool]]) -> None:
    assert results["a1"] == ("HI", False)
    assert results["a2"] == ("sync: no loop", False)
    assert results["a3"] == ("5", False)
    content, is_error = results["a4"]
    assert is_error and "lookup service down" in content


# -- a tool round, persisted and in memory -----------------------------------------------------
@pytest.mark.django_db
def test_aask_runs_a_round_of_sync_and_async_tools_on_a_persisted_chat(chat, scripted):
    chat.with_tools(shout, where, add, Lookup)
    scripted.add(tool_round(), "All four done.")

    answer = run(chat.aask, "Go")

    assert answer.content == "All four done."
    rows = chat.messages.filter(role="tool").select_related("tool_call")
    check_round({m.tool_call.call_id: (m.content, m.is_error) for m in rows})
    states = dict(chat.tool_calls.values_list("call_id", "state"))
    assert states == {"a1": "succeeded", "a2": "succeeded", "a3": "succeeded", "a4": "failed"}
    chat.refresh_from_db()
    assert (chat.state, chat.lease_token) == ("idle", "")
    assert scripted.requests[1].messages[-1].role == "tool"


def test_aask_on_an_in_memory_chat_runs_sync_tools_off_the_loop(scripted):
    conversation = agentloop.chat("scripted:test", tools=[shout, where, add, Lookup])
    scripted.add(tool_round(), "All four done.")

    async def main() -> Any:
        loop_thread = threading.current_thread().name
        answer = await conversation.aask("Go")
        return loop_thread, answer

    loop_thread, answer = asyncio.run(main())

    assert answer.content == "All four done."
    results = {
        m.tool_call_id: (m.content, m.is_error) for m in conversation.messages if m.role == "tool"
    }
    check_round(results)
    assert THREADS["sync"] != loop_thread  # a sync tool never blocks the loop
    assert conversation.is_complete()


@pytest.mark.django_db
def test_astep_and_arun_tools_move_one_step_at_a_time(chat, scripted):
    chat.with_tools(add).ask_later("Add")
    scripted.add(tool_call("add", {"a": 1, "b": 1}, id="s1"), "Two.")

    first = run(chat.astep)
    assert [c.call_id for c in first.tool_calls.all()] == ["s1"]
    results = run(chat.arun_tools)
    assert [r.content for r in results] == ["2"]
    assert run(chat.ais_complete) is False
    last = run(chat.agenerate)
    assert last.content == "Two."
    assert run(chat.astep) is None  # settled
    assert run(chat.ais_complete) is True


@pytest.mark.django_db
def test_acomplete_with_tools_running_at_once(chat, scripted):
    chat.with_tools(shout, where, add).with_tool_options(concurrency=3).ask_later("Go")
    scripted.add(tool_round()[:3], "Done.")

    assert run(chat.acomplete).content == "Done."
    contents = dict(chat.messages.filter(role="tool").values_list("tool_call__call_id", "content"))
    assert contents == {"a1": "HI", "a2": "sync: no loop", "a3": "5"}


# -- an async tool under a sync verb -----------------------------------------------------------
@pytest.mark.django_db
def test_a_sync_verb_runs_an_async_tool_to_completion(chat, scripted):
    chat.with_tools(shout, Lookup)
    scripted.add(
        [tool_call("shout", {"text": "quiet"}, id="k1"), tool_call("lookup", {}, id="k2")],
        "Heard.",
    )

    assert chat.ask("Go").content == "Heard."
    results = dict(chat.messages.filter(role="tool").values_list("tool_call__call_id", "content"))
    assert results["k1"] == "QUIET"
    assert "lookup service down" in results["k2"]


# -- streaming ---------------------------------------------------------------------------------
@pytest.mark.django_db
@pytest.mark.parametrize("kind", ["async", "sync"])
def test_a_stream_reaches_a_sync_or_async_callback(chat, scripted, kind):
    chat.ask_later("Tell me")
    scripted.add(stream("Once ", "upon ", "a time."))
    received: list[str] = []

    def on_chunk(chunk: Any) -> None:
        received.append(chunk.text)

    async def aon_chunk(chunk: Any) -> None:
        await asyncio.sleep(0)
        received.append(chunk.text)

    answer = run(chat.agenerate, aon_chunk if kind == "async" else on_chunk)

    assert received == ["Once ", "upon ", "a time."]
    assert (answer.content, answer.status) == ("Once upon a time.", MessageStatus.COMPLETE)


def test_an_in_memory_stream_saves_partials_like_a_sync_one(scripted):
    conversation = agentloop.chat("scripted:test")
    scripted.add(stream("a", "b", "c", delay=0.01))
    seen: list[str] = []

    async def on_chunk(chunk: Any) -> None:
        seen.append(chunk.text)

    with override_settings(AGENTLOOP={"PARTIAL_SAVE_INTERVAL": 0}):
        answer = asyncio.run(conversation.aask("Go", on_chunk))

    assert seen == ["a", "b", "c"] and answer.content == "abc"
    assert [m.status for m in conversation.messages] == [MessageStatus.COMPLETE] * 2


# -- the claim ---------------------------------------------------------------------------------
@pytest.mark.django_db
def test_every_async_verb_refuses_a_chat_another_process_holds(chat, scripted):
    chat.ask_later("Hi")
    other = Lease.take(Chat, chat.pk)
    scripted.add("never sent")

    for verb in ("astep", "agenerate", "arun_tools", "acomplete"):
        with pytest.raises(ChatBusyError):
            run(getattr(Chat.objects.get(pk=chat.pk), verb))
    with pytest.raises(ChatBusyError):
        run(Chat.objects.get(pk=chat.pk).aask, "another")
    with pytest.raises(ChatBusyError):
        run(Chat.objects.get(pk=chat.pk).aask_later, "another", if_busy="reject")

    assert scripted.requests == []
    assert list(chat.messages.values_list("content", flat=True)) == ["Hi"]
    assert other.release(state="idle")
    assert run(Chat.objects.get(pk=chat.pk).astep).content == "never sent"


@pytest.mark.django_db(transaction=True)
def test_an_async_verb_refuses_while_a_sync_verb_streams(chat, scripted):
    chat.ask_later("Long story")
    started, finish = threading.Event(), threading.Event()
    scripted.add(stream("one ", "two", delay=0.01), "second answer")

    def on_chunk(chunk: Any) -> None:
        started.set()
        finish.wait(30)

    def generate() -> None:
        try:
            Chat.objects.get(pk=chat.pk).generate(on_chunk)
        finally:
            connections.close_all()

    worker = threading.Thread(target=generate)
    worker.start()
    try:
        assert started.wait(30)
        with pytest.raises(ChatBusyError):
            run_in_new_loop(Chat.objects.get(pk=chat.pk).astep)
    finally:
        finish.set()
        worker.join(30)
    assert list(chat.messages.values_list("content", flat=True)) == ["Long story", "one two"]
    assert scripted.remaining == 1  # the refused verb sent nothing


# -- people in the loop, limits, retries, fallbacks --------------------------------------------
@pytest.mark.django_db
def test_an_approval_holds_the_async_run_until_a_person_decides(chat, scripted):
    chat.with_tools(transfer)
    scripted.add(tool_call("transfer", {"amount": 5, "to": "bo"}, id="t1"), "Sent.")

    held = run(chat.aask, "Pay bo")

    assert held.tool_calls.get().state == ToolCallState.WAITING
    assert run(chat.conversation.ais_waiting) is True
    chat.approve("t1")
    assert run(chat.acomplete).content == "Sent."
    assert chat.messages.get(role="tool").content == "sent 5 to bo"


@pytest.mark.django_db
def test_limits_stop_an_async_run(chat, scripted):
    chat.with_tools(add).with_limits(max_model_calls=1)
    scripted.add(tool_call("add", {"a": 1, "b": 2}, id="l1"), "never sent")

    with pytest.raises(LimitReachedError, match="max_model_calls"):
        run(chat.aask, "Add")

    chat.refresh_from_db()
    assert chat.state == "stopped" and "max_model_calls" in chat.stop_reason
    assert len(scripted.requests) == 1


@pytest.mark.django_db
def test_a_transient_error_is_retried_in_the_async_path(chat, scripted):
    scripted.add(ServerError("overloaded", status=503), "Fine now.")

    with override_settings(AGENTLOOP=FAST):
        answer = run(chat.aask, "Hello")

    assert answer.content == "Fine now."
    assert list(
        Usage.objects.filter(chat=chat).values_list("status", flat=True).order_by("pk")
    ) == [
        "failed",
        "succeeded",
    ]


@pytest.mark.django_db
def test_a_fallback_model_answers_when_the_first_keeps_failing(chat, scripted):
    backup = ScriptedProvider("From the backup.")
    agentloop.providers.register("backup", backup)
    try:
        chat.with_fallbacks("backup:b1")
        scripted.add(*[ServerError("down", status=503)] * 3)
        switched: list[tuple[str, str]] = []
        chat.conversation.on("model_fallback", lambda old, new, error: switched.append((old, new)))
        with override_settings(AGENTLOOP=FAST):
            answer = run(chat.aask, "Hello")
    finally:
        agentloop.providers.unregister("backup")

    assert answer.content == "From the backup."
    assert switched == [("scripted:test", "backup:b1")]


# -- query counts ------------------------------------------------------------------------------
@pytest.mark.django_db
@pytest.mark.parametrize("move", ["generate", "tools"])
def test_astep_costs_the_same_queries_as_step(user, scripted, move):
    def prepared() -> Chat:
        chat = Chat.objects.create(model="scripted:test", owner=user).with_tools(add)
        chat.ask_later("Add")
        if move == "tools":
            scripted.add(tool_call("add", {"a": 1, "b": 2}, id="q1"))
            chat.step()
        else:
            scripted.add("An answer.")
        return Chat.objects.get(pk=chat.pk)

    sync_chat, async_chat = prepared(), prepared()
    with CaptureQueriesContext(connection) as sync_queries:
        sync_chat.step()
    with CaptureQueriesContext(connection) as async_queries:
        run(async_chat.astep)

    assert len(sync_queries) > 0  # the async phases ran on this connection: they are counted
    assert [q["sql"].split()[0] for q in async_queries] == [
        q["sql"].split()[0] for q in sync_queries
    ]


# -- a cancel from another OS process ----------------------------------------------------------
def _slow_sse_provider() -> Any:
    """An OpenAI-compatible provider whose server streams WORDS slowly, over async HTTP."""
    import httpx

    from agentloop.providers.openai import OpenAIProvider

    async def events() -> Any:
        for word in WORDS:
            await asyncio.sleep(0.05)
            body = {"choices": [{"index": 0, "delta": {"content": word}}]}
            yield f"data: {json.dumps(body)}\n\n".encode()
        yield b"data: [DONE]\n\n"

    async def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=events())

    return OpenAIProvider(api_key="test-key", name="slowsse", transport=httpx.MockTransport(handle))


@pytest.mark.django_db(transaction=True)
@pytest.mark.subprocess
@pytest.mark.parametrize("provider", ["scripted", "http"])
def test_a_cancel_from_another_process_stops_an_async_stream(user, scripted, provider):
    if provider == "http":
        agentloop.providers.register("slowsse", _slow_sse_provider())
        chat = Chat.objects.create(model="slowsse:m1", owner=user)
    else:
        scripted.add(stream(*WORDS, delay=0.05))
        chat = Chat.objects.create(model="scripted:test", owner=user)
    chat.ask_later("Tell me a long story")
    received: list[str] = []
    processes: list[Any] = []

    async def on_chunk(chunk: Any) -> None:
        assert isinstance(chunk, TextDelta)
        received.append(chunk.text)
        if not processes:  # streaming has begun: another process cancels the chat
            processes.append(start_script("drive_chat.py", chat.pk, json.dumps({"verb": "cancel"})))

    outcome = None
    try:
        run_in_new_loop(chat.agenerate, on_chunk)
    except CancelledError as exc:
        outcome = exc
    finally:
        outputs = [process.communicate(timeout=60) for process in processes]
        agentloop.providers.unregister("slowsse") if provider == "http" else None
    assert [process.returncode for process in processes] == [0], outputs
    assert isinstance(outcome, CancelledError)
    assert 0 < len(received) < len(WORDS) // 2
    (partial,) = chat.messages.filter(role="assistant")
    assert (partial.status, partial.content) == (MessageStatus.CANCELLED, "".join(received))
    assert list(Usage.objects.filter(chat=chat).values_list("status", flat=True)) == ["cancelled"]
    assert Chat.objects.values_list("cancel_requested_at", flat=True).get(pk=chat.pk) is None


@pytest.mark.django_db
def test_acancel_answers_as_cancel_does(chat):
    assert run(chat.acancel) is False  # no run: nothing set
    Chat.objects.filter(pk=chat.pk).update(state="queued")
    assert run(Chat.objects.get(pk=chat.pk).acancel) is True
    assert Chat.objects.get(pk=chat.pk).cancel_requested_at is not None


@pytest.mark.django_db
def test_a_threaded_providers_chunks_come_back_to_the_verbs_connection(chat, scripted):
    """A provider without async I/O streams on a thread; its chunks' partial saves and
    checkpoints still run where the verb's other phases run (here: the test's connection)."""
    chat.ask_later("Go")
    scripted.add(stream("a", "b", "c", delay=0.01))

    with override_settings(AGENTLOOP={"PARTIAL_SAVE_INTERVAL": 0, "CANCEL_POLL_INTERVAL": 0}):
        with CaptureQueriesContext(connection) as queries:
            answer = run(chat.agenerate, lambda chunk: None)

    assert answer.content == "abc"
    sql = [q["sql"] for q in queries]
    partial_inserts = [q for q in sql if q.startswith('INSERT INTO "agentloop_message"')
                       and "'partial'" in q]  # fmt: skip
    message_updates = [q for q in sql if q.startswith('UPDATE "agentloop_message"')]
    assert len(partial_inserts) == 1  # the first chunk's partial row
    assert len(message_updates) >= 2  # the next chunks' saves, then the answer itself


@pytest.mark.django_db
def test_cancelling_the_awaiting_task_releases_the_chat_and_stops_the_stream(chat, scripted):
    """Not a cancel of the chat: the verb stops at its await, the claim is released, and the
    provider's thread stops streaming at its next chunk."""
    chat.ask_later("Hi")
    scripted.add(stream(*WORDS, delay=0.02), "Answered again.")
    seen: list[Any] = []

    async def main() -> bool:
        async def on_chunk(chunk: Any) -> None:
            seen.append(chunk)

        task = asyncio.ensure_future(chat.agenerate(on_chunk))
        while len(seen) < 3:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return True

    assert run(main)
    stopped_at = len(seen)
    reloaded = Chat.objects.get(pk=chat.pk)
    assert (reloaded.state, reloaded.lease_token, reloaded.error) == ("idle", "", "")
    assert list(reloaded.messages.values_list("role", flat=True)) == ["user"]
    assert reloaded.step().content == "Answered again."
    assert stopped_at < 10 and len(seen) == stopped_at

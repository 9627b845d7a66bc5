"""Input guardrails run in parallel with the model call (``run_in_parallel=True``): against a
real HTTP stream (tests/stream_server.py), sync and async verbs. A block abandons the call on
the wire (its connection is closed) and keeps no answer; a pass lets the held chunks out; a
replacement abandons the call and asks again with the new text.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import connections

import agentloop
from agentloop import providers
from agentloop.exceptions import GuardrailBlockedError, GuardrailError
from agentloop.models import Chat, ChatState, Usage
from agentloop.testing import FunctionProvider, ScriptedProvider, stream
from tests import guardrail_checks as checks
from tests.helpers import transcript, wait_until
from tests.stream_server import QUICK_WORDS, StreamServer, stream_server

pytestmark = pytest.mark.django_db


@pytest.fixture
def server() -> Iterator[StreamServer]:
    with stream_server() as running:
        yield running


@pytest.fixture(autouse=True)
def release() -> Iterator[threading.Event]:
    """The parallel guardrails decide once this is set (the test sets it)."""
    checks.forget()
    checks.RELEASE = threading.Event()
    yield checks.RELEASE
    checks.RELEASE.set()
    checks.RELEASE = None


def in_thread(work: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``work`` on a thread; the dict gets what it returned or raised."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = work()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome["error"] = exc
        finally:
            connections.close_all()  # this thread's own

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def ask(chat: Chat, text: str, chunks: list[Any], mode: str) -> Any:
    if mode == "sync":
        return chat.ask(text, stream=chunks.append)
    return async_to_sync(chat.aask)(text, stream=chunks.append)


@pytest.mark.django_db(transaction=True)  # the verb runs on a thread of its own
@pytest.mark.parametrize(
    ("mode", "guardrail"),
    [("sync", checks.slow_moderation), ("async", checks.async_moderation)],
    ids=["sync", "async"],
)
def test_a_block_abandons_the_call_in_flight_and_keeps_no_answer(
    server, release, user, mode, guardrail
):
    chat = Chat.objects.create(model="streamer:test", owner=user).with_guardrails(guardrail)
    chunks: list[Any] = []
    thread, outcome = in_thread(lambda: ask(chat, "something forbidden", chunks, mode))

    wait_until(lambda: len(server.requests) == 1, "the model call")
    release.set()  # the guardrail blocks while the answer streams
    thread.join(60)

    assert isinstance(outcome.get("error"), GuardrailBlockedError), outcome
    wait_until(lambda: server.closed_by_client == 1, "the stream to be closed by the client")
    assert chunks == []  # held while judged: nothing of the answer was shown
    assert transcript(chat, "role", "content", "status") == [
        ("user", "something forbidden", "blocked")
    ]
    row = Chat.objects.get(pk=chat.pk)
    assert (row.state, row.stop_reason) == (
        ChatState.STOPPED,
        f"guardrail {guardrail.name}: moderation flagged the message",
    )
    usage = Usage.objects.get(chat=chat)
    assert (usage.status, usage.message_id) == ("cancelled", None)
    assert usage.error == "abandoned: the input guardrails did not pass the message"
    outcome_row = row.messages.get().guardrails[0]
    assert (outcome_row["decision"], outcome_row["parallel"]) == ("blocked", True)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_pass_lets_the_held_chunks_out_in_order_and_keeps_the_answer(server, release, user, mode):
    chat = Chat.objects.create(model="streamer:test", owner=user)
    chat.with_guardrails(checks.slow_moderation)
    chunks: list[Any] = []
    thread, outcome = in_thread(lambda: ask(chat, "a quick question", chunks, mode))

    wait_until(lambda: server.answered == 1, "the whole answer to arrive")
    assert chunks == []  # the guardrail has not decided yet: held
    release.set()
    thread.join(60)

    assert outcome["value"].content == "".join(QUICK_WORDS)
    assert "".join(chunk.text for chunk in chunks) == "".join(QUICK_WORDS)
    user_row = chat.messages.get(role="user")
    assert [(o["decision"], o["parallel"]) for o in user_row.guardrails] == [("passed", True)]
    assert Usage.objects.get(chat=chat).status == "succeeded"


@pytest.mark.django_db(transaction=True)
def test_a_replacement_abandons_the_call_and_asks_again_with_the_new_text(server, release, user):
    chat = Chat.objects.create(model="streamer:test", owner=user)
    chat.with_guardrails(checks.slow_moderation)
    thread, outcome = in_thread(lambda: chat.ask("card 4242 4242 4242 4242, quick"))

    wait_until(lambda: server.answered == 1, "the first answer")
    release.set()  # decides after the first answer came: it is dropped, the call made again
    thread.join(60)

    assert outcome["value"].content == "".join(QUICK_WORDS)
    assert server.latest_user_texts() == [
        "card 4242 4242 4242 4242, quick",
        "card [card], quick",
    ]
    assert transcript(chat, "role", "content", "status") == [
        ("user", "card [card], quick", "complete"),
        ("assistant", "".join(QUICK_WORDS), "complete"),
    ]
    usages = list(
        Usage.objects.filter(chat=chat).order_by("id").values_list("status", "input_tokens")
    )
    assert usages == [("cancelled", 7), ("succeeded", 7)]  # the dropped answer's usage is kept


def test_an_answer_that_came_before_a_block_is_dropped_with_its_usage_kept(user, release):
    def answer(request: Any) -> str:
        release.set()  # the guardrail decides as the answer comes back
        return "an answer"

    providers.register("quick", FunctionProvider(answer))
    try:
        chat = Chat.objects.create(model="quick:test", owner=user)
        chat.with_guardrails(checks.slow_moderation)
        with pytest.raises(GuardrailBlockedError):
            chat.ask("forbidden words")
    finally:
        providers.unregister("quick")

    assert list(chat.messages.values_list("role", "status")) == [("user", "blocked")]
    usage = Usage.objects.get(chat=chat)
    assert (usage.status, usage.input_tokens) == ("cancelled", 10)


def test_sequential_guardrails_run_first_and_a_block_there_sends_nothing(user, scripted):
    chat = Chat.objects.create(model="scripted:test", owner=user)
    chat.with_guardrails(checks.slow_moderation, checks.no_secrets)

    with pytest.raises(GuardrailBlockedError, match="no_secrets"):
        chat.ask("a secret")

    assert scripted.requests == []
    assert checks.seen() == ["no_secrets:a secret"]  # the parallel one never started


def test_a_parallel_guardrail_that_fails_abandons_the_call_and_fails_the_chat(user):
    from agentloop.guardrails import input_guardrail

    @input_guardrail(run_in_parallel=True)
    def broken(context):
        raise LookupError("no such policy")

    provider = ScriptedProvider(stream("a ", "b ", delay=0.01))
    providers.register("quick", provider)
    try:
        memory_chat = agentloop.chat("quick:test").with_guardrails(broken)
        with pytest.raises(GuardrailError, match="raised LookupError: no such policy"):
            memory_chat.ask("Hi", stream=lambda chunk: None)
    finally:
        providers.unregister("quick")
    assert [m.role for m in memory_chat.messages if m.is_finished] == ["user"]
    assert memory_chat.messages[0].guardrails[0].decision == "error"

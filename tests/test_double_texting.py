"""Double-texting (docs/control.md): a message sent while a run holds the chat is rejected,
queued (answered after the run, in order) or interrupts the run, per ``if_busy``."""

from __future__ import annotations

import threading

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings

from agentloop import chat as memory_chat
from agentloop import providers
from agentloop.django_store.leases import Lease
from agentloop.exceptions import (
    AuthenticationError,
    ChatBusyError,
    ConfigurationError,
    ServerError,
)
from agentloop.messages import MessageStatus
from agentloop.models import Chat, ChatState
from agentloop.runners import run_step, wait_for_embedded_jobs
from agentloop.testing import FunctionProvider
from tests.helpers import transcript

pytestmark = pytest.mark.django_db(transaction=True)

EMBEDDED = {**settings.AGENTLOOP, "RUNNER": "embedded", "CANCEL_POLL_INTERVAL": 0.05}


def while_it_streams(chat, action):
    """Run ``action`` from another thread once the chat's answer has started streaming."""
    started = threading.Event()

    def watch():
        try:
            for _ in range(600):
                if chat.messages.filter(role="assistant", status=MessageStatus.PARTIAL).exists():
                    break
                started.wait(0.01)
            action(Chat.objects.get(pk=chat.pk))
        finally:
            connection.close()

    thread = threading.Thread(target=watch)
    thread.start()
    return thread


@override_settings(AGENTLOOP=EMBEDDED)
def test_reject_is_the_default_and_writes_nothing(user):
    chat = Chat.objects.create(model="rules:test", owner=user)
    chat.ask_later("first")
    held = Lease.take(Chat, chat.pk)

    with pytest.raises(ChatBusyError):
        Chat.objects.get(pk=chat.pk).ask_later("second")

    assert [content for _, content, _ in transcript(chat, "role", "content", "status")] == ["first"]
    assert held.release(state="idle")


@override_settings(AGENTLOOP={**EMBEDDED, "PARTIAL_SAVE_INTERVAL": 0})
def test_queue_answers_both_messages_in_order_after_the_streaming_run(user):
    chat = Chat.objects.create(model="rules:test", owner=user)
    chat.ask_later("stream:20:0.03").complete_later()
    sender = while_it_streams(chat, lambda other: other.ask_later("hello", if_busy="queue"))
    sender.join(timeout=60)

    assert wait_for_embedded_jobs(60)
    chat.refresh_from_db()
    assert (chat.state, chat.inbox) == (ChatState.IDLE, [])
    rows = transcript(chat, "role", "content", "status")
    assert [(role, status) for role, _, status in rows] == [
        ("user", "complete"), ("assistant", "complete"), ("user", "complete"),
        ("assistant", "complete"),
    ]  # fmt: skip
    assert rows[1][1].startswith("w0 w1") and rows[2][1] == "hello"
    assert rows[3][1] == "echo: hello"


@override_settings(AGENTLOOP={**EMBEDDED, "PARTIAL_SAVE_INTERVAL": 0})
def test_interrupt_cancels_the_running_answer_then_answers_the_new_message(user):
    chat = Chat.objects.create(model="rules:test", owner=user)
    chat.ask_later("stream:200:0.03").complete_later()
    sender = while_it_streams(chat, lambda other: other.ask_later("stop", if_busy="interrupt"))
    sender.join(timeout=60)

    assert wait_for_embedded_jobs(60)
    chat.refresh_from_db()
    assert chat.state == ChatState.IDLE
    rows = transcript(chat, "role", "content", "status")
    assert [(role, status) for role, _, status in rows] == [
        ("user", "complete"), ("assistant", "cancelled"), ("user", "complete"),
        ("assistant", "complete"),
    ]  # fmt: skip
    assert rows[3][1] == "echo: stop"


def test_a_memory_chat_queues_too():
    chat = memory_chat("rules:test")
    chat.store.runs.claim()  # another thread's verb holds it
    holder = threading.Thread(target=lambda: chat.ask_later("later", if_busy="queue"))
    holder.start()
    holder.join()
    chat.store.runs.release("done")

    assert [m.content for m in chat.messages] == []
    chat.complete()
    assert [m.content for m in chat.messages] == ["later", "echo: later"]


def test_an_unknown_if_busy_is_a_configuration_error(user):
    with pytest.raises(ConfigurationError, match="if_busy"):
        Chat.objects.create(model="rules:test", owner=user).ask_later("hi", if_busy="wait")


def _queue_from_another_holder(chat, text):
    """Send ``text`` with if_busy="queue" from another chat object while ``chat`` runs."""
    Chat.objects.get(pk=chat.pk).ask_later(text, if_busy="queue")


def test_after_a_failed_run_queued_messages_come_before_the_next_one(user):
    # The run of "first" fails for good while "second" waits in the inbox; "third", sent to
    # the failed chat (nothing holds it), must not overtake "second".
    def answer(request):
        if request.messages[-1].content == "first":
            _queue_from_another_holder(chat, "second")
            return AuthenticationError("scripted HTTP 401", status=401)
        return f"echo: {request.messages[-1].content}"

    providers.register("failing", FunctionProvider(answer))
    try:
        chat = Chat.objects.create(model="failing:test", owner=user)
        with pytest.raises(AuthenticationError):
            chat.ask("first")
        chat.refresh_from_db()
        assert (chat.state, [item["content"] for item in chat.inbox]) == ("failed", ["second"])

        Chat.objects.get(pk=chat.pk).ask_later("third", if_busy="queue")
        Chat.objects.get(pk=chat.pk).complete()
    finally:
        providers.unregister("failing")

    assert [content for role, content in transcript(chat) if role == "user"] == [
        "first", "second", "third",
    ]  # fmt: skip
    assert transcript(chat)[-1] == ("assistant", "echo: third")
    chat.refresh_from_db()
    assert chat.inbox == []


@override_settings(AGENTLOOP={**EMBEDDED, "MODEL_RETRIES": 0})
def test_a_message_sent_while_a_step_waits_to_be_retried_comes_after_the_queued_ones(user):
    # A background step fails transiently while "second" is queued: the chat waits for its
    # retry with no lease. "third", sent then, is added after "second", not before it.
    def answer(request):
        if request.messages[-1].content == "first" and not answer.failed:
            answer.failed = True
            _queue_from_another_holder(chat, "second")
            return ServerError("scripted HTTP 503", status=503)
        return f"echo: {request.messages[-1].content}"

    answer.failed = False
    providers.register("failing", FunctionProvider(answer))
    try:
        chat = Chat.objects.create(model="failing:test", owner=user)
        chat.ask_later("first")
        Chat.objects.filter(pk=chat.pk).update(state="queued")  # as complete_later() leaves it
        assert run_step(chat.pk).action == "retry"  # one worker job (its retry not sent)
        chat.refresh_from_db()
        assert (chat.state, chat.lease_token, chat.retry_at is not None) == ("queued", "", True)

        Chat.objects.get(pk=chat.pk).ask_later("third", if_busy="queue")
        assert wait_for_embedded_jobs(60)
    finally:
        providers.unregister("failing")

    assert [content for role, content in transcript(chat) if role == "user"] == [
        "first", "second", "third",
    ]  # fmt: skip
    chat.refresh_from_db()
    assert (chat.state, chat.inbox) == (ChatState.IDLE, [])
    assert transcript(chat)[-1] == ("assistant", "echo: third")


def test_a_memory_chat_keeps_the_order_after_a_failed_run():
    chat = memory_chat("failing:test")

    def answer(request):
        if request.messages[-1].content == "first":
            sender = threading.Thread(target=lambda: chat.ask_later("second", if_busy="queue"))
            sender.start()
            sender.join()
            return AuthenticationError("scripted HTTP 401", status=401)
        return f"echo: {request.messages[-1].content}"

    providers.register("failing", FunctionProvider(answer))
    try:
        with pytest.raises(AuthenticationError):
            chat.ask("first")
        assert [m.content for m in chat.store.queued] == ["second"]
        chat.ask("third")
    finally:
        providers.unregister("failing")

    assert [m.content for m in chat.messages if m.role == "user"] == ["first", "second", "third"]
    assert chat.messages[-1].content == "echo: third"

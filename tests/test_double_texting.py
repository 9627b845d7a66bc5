"""Double-texting (docs/control.md): a message sent while a run holds the chat is rejected,
queued (answered after the run, in order) or interrupts the run, per ``if_busy``."""

from __future__ import annotations

import threading

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings

from agentloop import chat as memory_chat
from agentloop._leases import Lease
from agentloop.background import wait_for_embedded_jobs
from agentloop.exceptions import ChatBusyError, ConfigurationError
from agentloop.messages import MessageStatus
from agentloop.models import Chat, ChatState
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
    chat.store.claim()  # another thread's verb holds it
    holder = threading.Thread(target=lambda: chat.ask_later("later", if_busy="queue"))
    holder.start()
    holder.join()
    chat.store.release("done")

    assert [m.content for m in chat.messages] == []
    chat.complete()
    assert [m.content for m in chat.messages] == ["later", "echo: later"]


def test_an_unknown_if_busy_is_a_configuration_error(user):
    with pytest.raises(ConfigurationError, match="if_busy"):
        Chat.objects.create(model="rules:test", owner=user).ask_later("hi", if_busy="wait")

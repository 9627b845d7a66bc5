"""A job that comes twice is harmless (what makes re-sending lost jobs safe).

After a broker restart a worker re-sends the jobs of chats queued before it
(``agentloop.tasks.ResendAfterReconnect``); with a broker that kept its queue, each of
those chats then has two jobs. The second finds the chat held ("busy") or moved on
("skipped"): it never makes a move again, calls no model and writes nothing.
"""

from __future__ import annotations

import pytest

from agentloop.django_store.leases import Lease
from agentloop.exceptions import AuthenticationError
from agentloop.models import Chat, ChatState
from agentloop.runners import run_step

pytestmark = pytest.mark.django_db(transaction=True)


def queued(chat: Chat) -> Chat:
    Chat.objects.filter(pk=chat.pk).update(state=ChatState.QUEUED)  # as complete_later()
    return chat


def row(chat: Chat) -> tuple:
    fresh = Chat.objects.get(pk=chat.pk)
    return (fresh.state, fresh.lease_token, fresh.updated_at, fresh.error, fresh.attempts)


def test_a_job_for_a_chat_another_process_holds_is_busy_and_writes_nothing(chat, scripted):
    chat.ask_later("Hi")
    queued(chat)
    lease = Lease.take(Chat, chat.pk)
    assert lease is not None
    before = row(chat)

    assert run_step(chat.pk).action == "busy"

    assert row(chat) == before
    assert chat.messages.count() == 1


def test_a_second_job_for_a_chat_that_finished_does_nothing(chat, scripted):
    scripted.add("Hello")
    chat.ask_later("Hi")
    queued(chat)
    assert run_step(chat.pk).action == "done"
    before = row(chat)

    assert run_step(chat.pk).action == "skipped"

    assert row(chat) == before
    assert [m.role for m in chat.messages.order_by("id")] == ["user", "assistant"]


def test_a_second_job_for_a_failed_chat_leaves_it_failed_and_calls_no_model(chat, scripted):
    scripted.add(AuthenticationError("bad key", status=401), "revived by a stray job")
    chat.ask_later("Hi")
    queued(chat)
    assert run_step(chat.pk).action == "failed"
    before = row(chat)

    assert run_step(chat.pk).action == "skipped"

    assert row(chat) == before
    assert scripted.remaining == 1  # the model was not asked again
    assert [m.role for m in chat.messages.order_by("id")] == ["user"]


def test_after_a_reconnection_each_lost_job_is_re_sent_once(user, scripted, settings):
    """Two workers reconnecting at once each call resend_queued(): one of them sends each
    chat's job; a chat queued after the loss (its job was sent to the live broker) is left."""
    from datetime import timedelta

    from django.utils import timezone

    from agentloop.runners import wait_for_embedded_jobs
    from agentloop.runners.sweeper import resend_queued

    settings.AGENTLOOP = {**settings.AGENTLOOP, "RUNNER": "embedded"}
    lost = []
    for text in ("one", "two"):
        chat = Chat.objects.create(model="scripted:test", owner=user)
        chat.ask_later(text)
        Chat.objects.filter(pk=chat.pk).update(
            state=ChatState.QUEUED, updated_at=timezone.now() - timedelta(seconds=60)
        )
        lost.append(chat.pk)
    later = Chat.objects.create(model="scripted:test", owner=user)
    Chat.objects.filter(pk=later.pk).update(state=ChatState.QUEUED, updated_at=timezone.now())
    scripted.add("answer", "answer")

    # The connection was lost 30 s ago: the first two were queued before, the last after.
    first, second = resend_queued(lost_for=30), resend_queued(lost_for=30)
    assert wait_for_embedded_jobs(30)

    assert (sorted(first), second) == (sorted(lost), [])
    for pk in lost:
        chat = Chat.objects.get(pk=pk)
        assert [m.role for m in chat.messages.order_by("id")] == ["user", "assistant"]
        assert chat.state == ChatState.IDLE
    assert Chat.objects.get(pk=later.pk).state == ChatState.QUEUED
    assert scripted.remaining == 0

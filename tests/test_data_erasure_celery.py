"""Erasing an owner whose chats a real ``celery worker`` is running (docs/data-retention.md).

A streaming answer stops at the cancel erasure sends first, and the chat goes once the worker
gave it back; a tool that doesn't stop at a cancel is fenced: its chat is deleted under the
run, and the run's next write finds no row and saves nothing. Either way no row of the chat
is left, no event stream can be read, and the views answer 404. Also: the retention task run
by a worker, as beat would send it.

The ``background`` fixture (tests/conftest.py, tests/workers.py) starts the workers on a queue
of this test's own; chats use the ``rules`` provider (tests/worker_provider.py).
"""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from django.utils import timezone

from agentloop import data
from agentloop.live_events import chat_key, get_backend
from agentloop.models import Chat, Message, ToolCall, Usage
from tests.tools import wait_for_flag
from tests.workers import new_chat

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]


def leaves_nothing(pk: int, redis_client) -> None:
    """No row of chat ``pk`` anywhere, and its event stream is not a stream."""
    assert not Chat.objects.filter(pk=pk).exists()
    assert not Message.objects.filter(chat_id=pk).exists()
    assert not ToolCall.objects.filter(chat_id=pk).exists()
    assert not Usage.objects.filter(chat_id=pk).exists()
    stream = get_backend().stream(f"agentloop.chat:{pk}")
    assert redis_client.type(stream) in (b"none", b"string")
    assert get_backend().read(f"agentloop.chat:{pk}", after=None, timeout=0.01) == []


def random_chat(user, *tools):
    """A chat with a random primary key: its Redis stream name is this run's alone."""
    chat = Chat.objects.create(pk=random.randint(10**9, 2 * 10**9), model="rules:test", owner=user)
    return chat.with_tools(*tools) if tools else chat


def test_erasing_an_owner_mid_stream_cancels_the_run_then_leaves_nothing(
    background, user, django_user_model, redis_client, client
):
    worker = background.start_worker("w1", PARTIAL_SAVE_INTERVAL=0.05)
    other = django_user_model.objects.create_user(username="grace")
    kept = new_chat(other)
    kept.ask_later("hello").complete_later()
    background.wait(lambda: kept.messages.filter(role="assistant").exists(), "grace's answer")
    chat = random_chat(user)
    chat.ask_later("stream:400:0.02").complete_later()
    background.wait(
        lambda: chat.messages.filter(role="assistant", status="partial").exists(),
        "the answer to start streaming",
    )
    assert redis_client.type(get_backend().stream(chat_key(chat))) == b"stream"

    report = data.erase_owner(user)

    assert (report.cancelled, report.fenced, report.deleted.chats) == (1, 0, 1)
    leaves_nothing(chat.pk, redis_client)
    # The cancelled attempt's usage row is kept for accounting, with nobody's name on it.
    (cancelled,) = Usage.objects.filter(status="cancelled")
    assert (cancelled.owner_id, cancelled.chat_id, cancelled.message_id) == (None, None, None)
    client.force_login(user)
    assert client.get(f"/agentloop/chats/{chat.pk}/events/").status_code == 404
    assert client.get(f"/agentloop/usechat/{chat.pk}/stream").status_code == 404
    # The worker is done with it (its job ended) and wrote nothing after.
    background.wait(lambda: worker.outcomes() == ["done", "cancelled"], "the worker's jobs to end")
    leaves_nothing(chat.pk, redis_client)
    assert Chat.objects.filter(pk=kept.pk).exists()
    assert kept.messages.count() == 2


def test_a_tool_that_ignores_the_cancel_is_fenced_and_its_result_is_never_saved(
    background, user, redis_client
):
    worker = background.start_worker("w1", flag=True)  # wait_for_flag holds until the flag file
    chat = random_chat(user, wait_for_flag)
    chat.ask_later("tools:wait_for_flag").complete_later()
    background.wait(lambda: "wait_for_flag" in background.runs(), "the tool to start")
    steps_before = len(worker.outcomes())

    report = data.erase_owner(user, wait=0.2)

    assert (report.cancelled, report.fenced, report.deleted.chats) == (1, 1, 1)
    leaves_nothing(chat.pk, redis_client)
    (background.tmp / "never-created").touch()  # the tool returns now
    background.wait(lambda: len(worker.outcomes()) > steps_before, "the fenced step to end")
    # The model call's job, then the tool's, which lost the chat: its result was never saved.
    assert worker.outcomes() == ["again", "lost"]
    leaves_nothing(chat.pk, redis_client)
    assert background.runs() == ["wait_for_flag"]


def test_the_retention_task_run_by_a_worker_deletes_idle_chats(background, user):
    background.start_worker("w1", RETENTION_DAYS=30)
    idle, recent = new_chat(user), new_chat(user)
    for chat in (idle, recent):
        Message.objects.create(chat=chat, role="user", content="hi")
    long_ago = timezone.now() - timedelta(days=31)
    Message.objects.filter(chat=idle).update(created_at=long_ago)
    Chat.objects.filter(pk=idle.pk).update(created_at=long_ago, updated_at=long_ago)
    from agentloop.tasks import delete_idle_chats

    delete_idle_chats.delay()  # as beat sends it; the worker's RETENTION_DAYS applies

    background.wait(lambda: not Chat.objects.filter(pk=idle.pk).exists(), "the idle chat to go")
    assert Chat.objects.filter(pk=recent.pk).exists()

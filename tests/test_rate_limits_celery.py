"""Rate limits on a real ``celery worker`` process, with its buckets in Redis (the Celery tests'
``REDIS_URL``: tests/conftest.py's ``background`` fixture): a step that must wait longer than
``RATE_LIMIT_WAIT`` ends without holding the worker, the chat shows what it waits for (its
row, the admin), its job comes back when the bucket has room and the chat settles; a cancel
still stops a chat that waits so."""

from __future__ import annotations

import pytest

from agentloop.models import Chat, ChatState
from agentloop.process.redis_client import prefix

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]

#: the pace of the "priced" model here: a request a second, a minute's worth at most.
LIMITS = {"RATE_LIMITS": {"priced": {"requests_per_minute": 60}}, "RATE_LIMIT_WAIT": 0.2}
WAITING = "rate limit: priced requests per minute"


def drain(redis_client, seconds: float) -> None:
    """Leave the fleet's "priced" requests bucket ``seconds`` short of a request (stamped by
    Redis's clock, as the limiter's script reads it)."""
    now_seconds, micros = redis_client.time()
    key = f"{prefix()}:ratelimit:priced/requests"
    redis_client.hset(key, mapping={"level": 1 - seconds, "stamp": now_seconds + micros / 1e6})
    redis_client.expire(key, 120)


def test_a_step_waiting_for_the_rate_limit_leaves_the_worker_and_comes_back(
    background, redis_client, user, admin_client
):
    worker = background.start_worker("w1", **LIMITS)
    drain(redis_client, 6)
    chat = Chat.objects.create(model="priced:test", owner=user).ask_later("Hi").complete_later()

    background.wait(lambda: Chat.objects.get(pk=chat.pk).waiting_for == WAITING, "the wait")
    # The job ended (the worker holds no slot for the chat while it waits).
    background.wait(lambda: "retry" in worker.outcomes(), "the job to end")
    assert background.model_calls() == []
    listed = admin_client.get("/admin/agentloop/chat/?waiting_for=rate_limit").content.decode()
    assert WAITING in listed

    background.wait(lambda: Chat.objects.get(pk=chat.pk).state == ChatState.IDLE, "the answer")
    chat.refresh_from_db()
    assert (chat.waiting_for, chat.attempts, chat.error) == ("", 0, "")
    assert chat.messages.last().content == "echo: Hi"
    assert len(background.model_calls()) == 1


def test_a_cancel_stops_a_chat_waiting_for_the_rate_limit(background, redis_client, user):
    worker = background.start_worker("w1", **LIMITS)
    drain(redis_client, 6)
    chat = Chat.objects.create(model="priced:test", owner=user).ask_later("Hi").complete_later()
    background.wait(lambda: Chat.objects.get(pk=chat.pk).waiting_for == WAITING, "the wait")

    assert Chat.objects.get(pk=chat.pk).cancel()

    background.wait(lambda: "cancelled" in worker.outcomes(), "the job to see the cancel")
    chat.refresh_from_db()
    assert (chat.state, chat.waiting_for, chat.cancel_requested_at) == (ChatState.IDLE, "", None)
    assert background.model_calls() == []

"""Set-based control on real ``celery worker`` processes: a bulk halt stops every chat in flight
before its next model call and ``resume()`` sends them on; a bulk cancel reaches a streaming
step at once through the cancel notices (one Redis message per batch); ``complete_later()``
sends one job per chat in batches and the workers run them all; ``with_model`` skips a chat a
worker is running.

Workers, queues and the ``rules`` provider are the Celery tests' (tests/workers.py, the
``background`` fixture of tests/conftest.py).
"""

from __future__ import annotations

import pytest

from agentloop.messages import MessageStatus
from agentloop.models import Chat, ChatState
from tests.tools import slow
from tests.workers import new_chat, settled

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]

#: four rounds of a slow tool (0.2 s each) before the final answer: a run a halt can catch.
ROUNDS = "tools:slow|slow|slow|slow"


def states(chats: list[Chat]) -> list[str]:
    by_pk = dict(Chat.objects.filter(pk__in=[c.pk for c in chats]).values_list("pk", "state"))
    return [by_pk[chat.pk] for chat in chats]


def released(chats: list[Chat]) -> bool:
    """No run holds any of them any more (a halt records "stopped" before its release)."""
    return not Chat.objects.filter(pk__in=[c.pk for c in chats]).exclude(lease_token="").exists()


def test_a_bulk_halt_stops_the_chats_in_flight_and_resume_sends_them_on(background, user):
    worker = background.start_worker("w1")
    chats = [new_chat(user, slow) for _ in range(4)]
    for chat in chats:
        chat.ask_later(f"{ROUNDS} {chat.pk}").complete_later()
    background.wait(lambda: "running" in states(chats), "a chat to run")

    result = Chat.objects.filter(model="rules:test", state__in=["queued", "running"]).halt(
        "provider outage"
    )

    assert (result.matched, result.changed) == (4, 4)
    background.wait(
        lambda: states(chats) == ["stopped"] * 4 and released(chats), "every chat to stop"
    )
    for chat in Chat.objects.filter(pk__in=[c.pk for c in chats]):
        assert chat.stop_reason == "halted: provider outage"
        assert chat.lease_token == ""
        assert not chat.messages.filter(status=MessageStatus.CANCELLED).exists()
        # Each run stopped before a model call: no final answer yet.
        assert not chat.messages.filter(role="assistant", content__startswith="done").exists()
    background.wait(lambda: worker.outcomes().count("stopped") == 4, "four jobs to stop")

    resumed = Chat.objects.filter(pk__in=[c.pk for c in chats]).resume()

    assert resumed.changed == 4
    background.wait(lambda: all(settled(chat) for chat in chats), "every chat to finish")
    for chat in chats:
        final = chat.messages.filter(role="assistant").order_by("-id").first()
        assert final.content.startswith("done: slept")
        assert Chat.objects.get(pk=chat.pk).stop_reason == ""


def test_a_bulk_cancel_stops_a_streaming_worker_at_once_through_the_notices(background, user):
    # A read of the flag comes every 30 s: only the notice can stop the stream early.
    background.start_worker("w1", CANCEL_POLL_INTERVAL=30, PARTIAL_SAVE_INTERVAL=0.05)
    # The queued chats come first in pk order, so the first batch flags them before the
    # second stops the stream: the one worker reaches them already cancelled. (Made after
    # them, the streaming chat would share the first batch with one of them, and the worker
    # could start the other before the second batch lands.)
    queued = [new_chat(user) for _ in range(2)]
    streaming = new_chat(user)
    streaming.ask_later("stream:400:0.05").complete_later()
    for chat in queued:
        chat.ask_later("stream:400:0.05").complete_later()
    background.wait(
        lambda: streaming.messages.filter(role="assistant", status="partial").exists(),
        "the first answer to stream",
    )

    result = Chat.objects.filter(owner=user).cancel(batch_size=2)

    assert (result.matched, result.changed) == (3, 3)
    chats = [streaming, *queued]
    background.wait(
        lambda: states(chats) == ["idle"] * 3 and released(chats),
        "every run to stop",
        timeout=20,  # well before the 20 s stream would end by itself
    )
    (answer,) = streaming.messages.filter(role="assistant")
    assert answer.status == MessageStatus.CANCELLED
    assert not answer.content.endswith("w399 ")
    for chat in queued:  # stopped at their first checkpoint: no answer begun
        assert not chat.messages.filter(role="assistant").exists()
    assert not Chat.objects.filter(pk__in=[c.pk for c in chats], cancel_requested_at__isnull=False)


def test_complete_later_in_batches_sends_a_job_per_chat_and_the_workers_run_them(background, user):
    worker = background.start_worker("w1")
    chats = [new_chat(user) for _ in range(9)]
    for number, chat in enumerate(chats):
        chat.ask_later(f"hello {number}")

    result = Chat.objects.filter(owner=user).complete_later(batch_size=4)

    assert (result.matched, result.changed) == (9, 9)
    background.wait(lambda: all(settled(chat) for chat in chats), "every chat to finish")
    for number, chat in enumerate(chats):
        assert chat.messages.filter(role="assistant").get().content == f"echo: hello {number}"
    assert worker.outcomes().count("done") == 9


def test_with_model_skips_the_chat_a_worker_is_running(background, user):
    background.start_worker("w1")
    running = new_chat(user)
    running.ask_later("sleep:2").complete_later()
    idle = new_chat(user)
    background.wait(lambda: states([running]) == ["running"], "the chat to run")

    result = Chat.objects.filter(owner=user).with_model("offline:test")

    assert (result.changed, result.skipped) == (1, 1)
    background.wait(lambda: settled(running), "the running chat to finish")
    assert Chat.objects.get(pk=running.pk).model == "rules:test"
    assert Chat.objects.get(pk=idle.pk).model == "offline:test"
    assert states([running, idle]) == [ChatState.IDLE, ChatState.IDLE]

"""The background loop on a real Redis and real ``celery worker`` processes (docs/design.md §3, §4).

Each test starts its own workers (``python -m celery -A tests.celery_app worker``: the
``background`` fixture of tests/conftest.py, tests/workers.py) on a queue of its own, against
the test database; the test process enqueues through the same broker, cancels through the
database and Redis, and kills workers with SIGKILL. Chats use the
``rules`` provider (tests/worker_provider.py), which answers the same way in every process.

Skipped when Redis doesn't answer on 127.0.0.1:6379, except under ``CI=true``, where that
fails the run: CI must run these.
"""

from __future__ import annotations

import json
import random
import time

import pytest

from agentloop.messages import MessageStatus, ToolCallState
from agentloop.models import Chat, ChatState, Usage
from tests.helpers import roles, transcript
from tests.tools import charge_card_slowly, step_one, step_three, step_two, wait_for_flag
from tests.workers import Background, new_chat, settled

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]


# -- (0) the message a job is ----------------------------------------------------------------
def test_a_job_message_shows_its_arguments_as_celery_would(background, user, redis_client):
    # The runner writes the shown arguments itself (Celery's safe repr costs more): they
    # must read as Celery's own would, in `celery inspect`, Flower and the worker's log.
    chat = new_chat(user)
    chat.ask_later("hello").complete_later()

    raw = redis_client.lrange(background.queue, 0, -1)
    assert len(raw) == 1
    headers = json.loads(raw[0])["headers"]
    assert headers["task"] == "agentloop.step_chat"
    assert headers["argsrepr"] == repr((chat.pk, "agentloop.Chat", 0))
    assert headers["kwargsrepr"] == "{}"


# -- (1) a multi-round tool conversation ---------------------------------------------------
def test_complete_later_runs_a_multi_round_tool_conversation_to_the_end(background, user):
    background.start_worker("w1")
    chat = new_chat(user, step_one, step_two, step_three)
    chat.ask_later("tools:step_one|step_two,step_three").complete_later()

    background.wait(lambda: settled(chat), "the chat to settle")

    assert transcript(chat, "role", "content", "call_id", "status") == [
        ("user", "tools:step_one|step_two,step_three", None, "complete"),
        ("assistant", "", None, "complete"),
        ("tool", "one done", "call_1_0_0", "complete"),
        ("assistant", "", None, "complete"),
        ("tool", "two done", "call_1_1_0", "complete"),
        ("tool", "three done", "call_1_1_1", "complete"),
        ("assistant", "done: two done; three done", None, "complete"),
    ]
    assert background.runs() == ["step_one", "step_two", "step_three"]
    assert [call["round"] for call in background.model_calls()] == [0, 1, 2]
    assert chat.usage_records.filter(status="succeeded").count() == 3
    assert chat.error == ""


def test_another_process_reads_the_chats_message_and_chunk_events(background, user, redis_client):
    from agentloop.live_events import chat_key, get_backend

    background.start_worker("w1")
    # Event streams are named by chat pk: a random one keeps test runs side by side apart.
    chat = Chat.objects.create(pk=random.randint(10**9, 2 * 10**9), model="rules:test", owner=user)
    stream_key = get_backend().stream(chat_key(chat))
    redis_client.delete(stream_key)
    chat.ask_later("stream:3:0.01").complete_later()

    background.wait(lambda: settled(chat), "the chat to settle")

    def answered() -> list[dict]:
        # The worker publishes from a bounded queue of its own, not in the step: the answer's
        # event may come a moment after the chat row settled.
        events = get_backend().read(chat_key(chat), after=None, timeout=0.1)
        return events if events and events[-1]["data"].get("role") == "assistant" else []

    background.wait(answered, "the answer's event")
    events = answered()
    assert [(e["type"], e["data"].get("role"), e["data"].get("text")) for e in events] == [
        ("message", "user", None),  # published here, by ask_later
        ("chunk", None, "w0 "),  # the rest by the worker
        ("chunk", None, "w1 "),
        ("chunk", None, "w2 "),
        ("message", "assistant", None),
    ]
    assert events[-1]["data"]["content"] == "w0 w1 w2 "
    assert events[-1]["data"]["status"] == "complete"
    redis_client.delete(stream_key)


# -- (2) cancel from another process while the worker streams ------------------------------
CANCEL_PATHS = {
    # Only a Redis notice can stop the stream early: the throttled read comes every 30 s.
    "redis-notice": {"CANCEL_POLL_INTERVAL": 30},
    # No Redis for notices: the worker's throttled read of the flag finds it.
    "db-polling": {"CANCEL_POLL_INTERVAL": 0.05, "REDIS_URL": None},
}


@pytest.fixture(params=sorted(CANCEL_PATHS))
def cancelled_mid_stream(request, background, user):
    """A chat whose streamed answer (200 chunks, 20 ms apart) this process cancelled."""
    background.start_worker("w1", PARTIAL_SAVE_INTERVAL=0.05, **CANCEL_PATHS[request.param])
    chat = new_chat(user)
    chat.ask_later("stream:200:0.02").complete_later()
    background.wait(
        lambda: chat.messages.filter(role="assistant", status="partial").exists(),
        "the answer to start streaming",
    )

    Chat.objects.get(pk=chat.pk).cancel()  # as the cancel view does, in another process

    background.wait(
        lambda: (
            chat.usage_records.filter(status="cancelled").exists()
            and not Chat.objects.filter(pk=chat.pk).exclude(lease_token="").exists()
        ),
        "the worker to stop",
    )
    chat.refresh_from_db()
    return chat


def test_a_cancel_from_another_process_stops_the_streaming_worker(cancelled_mid_stream):
    chat = cancelled_mid_stream

    (answer,) = chat.messages.filter(role="assistant")
    assert answer.status == MessageStatus.CANCELLED
    assert answer.content.startswith("w0 ")
    assert not answer.content.endswith("w199 ")
    assert chat.state == ChatState.IDLE
    assert chat.cancel_requested_at is None
    assert list(chat.usage_records.values_list("status", flat=True)) == ["cancelled"]


def test_after_a_cancel_from_another_process_the_chat_works_again(cancelled_mid_stream, background):
    chat = cancelled_mid_stream

    chat.ask_later("hello again").complete_later()

    background.wait(lambda: settled(chat), "the next question to be answered")
    roles_and_status = [(m.role, m.status) for m in chat.messages.order_by("id")]
    assert roles_and_status == [
        ("user", "complete"),
        ("assistant", "cancelled"),
        ("user", "complete"),
        ("assistant", "complete"),
    ]
    assert chat.messages.order_by("id").last().content == "echo: hello again"


# -- (3) kill -9 of the worker, then a new worker --------------------------------------------
def sweep_until_settled(background: Background, chat: Chat) -> None:
    """Wait for the chat to settle, running the sweeper every second as celery beat would."""
    from agentloop.runners.sweeper import resume_stalled

    last_sweep = 0.0

    def check() -> bool:
        nonlocal last_sweep
        if time.monotonic() - last_sweep >= 1:
            resume_stalled()
            last_sweep = time.monotonic()
        return settled(chat)

    background.wait(check, "the chat to settle after the crash")


def test_killing_the_worker_mid_tool_reruns_only_the_interrupted_tool(background, user):
    first = background.start_worker("doomed", flag=True, LEASE_SECONDS=2)
    chat = new_chat(user, step_one, wait_for_flag, step_three)
    chat.ask_later("tools:step_one,wait_for_flag,step_three").complete_later()
    background.wait(lambda: "wait_for_flag" in background.runs(), "wait_for_flag to start")

    first.kill()
    assert chat.tool_calls.get(name="wait_for_flag").state == ToolCallState.RUNNING
    background.start_worker("rescuer", LEASE_SECONDS=2)
    sweep_until_settled(background, chat)

    assert background.runs() == ["step_one", "wait_for_flag", "wait_for_flag", "step_three"]
    assert transcript(chat, "role", "content", "call_id", "status") == [
        ("user", "tools:step_one,wait_for_flag,step_three", None, "complete"),
        ("assistant", "", None, "complete"),
        ("tool", "one done", "call_1_0_0", "complete"),
        ("tool", "flag seen", "call_1_0_1", "complete"),
        ("tool", "three done", "call_1_0_2", "complete"),
        ("assistant", "done: one done; flag seen; three done", None, "complete"),
    ]
    assert len(background.model_calls()) == 2


def test_killing_the_worker_mid_tool_never_reruns_a_non_idempotent_tool(background, user):
    first = background.start_worker("doomed", flag=True, LEASE_SECONDS=2)
    chat = new_chat(user, step_one, charge_card_slowly, step_three)
    chat.ask_later("tools:step_one,charge_card_slowly,step_three").complete_later()
    background.wait(
        lambda: "charge_card_slowly" in background.runs(), "charge_card_slowly to start"
    )

    first.kill()
    background.start_worker("rescuer", LEASE_SECONDS=2)
    sweep_until_settled(background, chat)

    assert background.runs() == ["step_one", "charge_card_slowly", "step_three"]
    charge = chat.tool_calls.get(name="charge_card_slowly")
    assert charge.state == ToolCallState.FAILED
    assert "not idempotent" in charge.result.content
    assert charge.result.is_error
    assert [m.role for m in chat.messages.order_by("id")] == [
        "user", "assistant", "tool", "tool", "tool", "assistant",
    ]  # fmt: skip


def test_killing_the_worker_mid_stream_the_job_is_delivered_again_and_answers_once(
    background, user
):
    # No sweeper here: the unacknowledged job (acks_late) comes back after the broker's
    # visibility timeout (5 s), by when the dead worker's 1 s lease has expired.
    first = background.start_worker("doomed", LEASE_SECONDS=1, PARTIAL_SAVE_INTERVAL=0.05)
    chat = new_chat(user)
    chat.ask_later("stream:60:0.05").complete_later()
    background.wait(
        lambda: chat.messages.filter(role="assistant", status="partial").exists(),
        "the answer to start streaming",
    )

    first.kill()
    background.start_worker("rescuer", LEASE_SECONDS=1)
    background.wait(lambda: settled(chat), "the redelivered job to answer")

    full = "".join(f"w{i} " for i in range(60))
    answers = list(chat.messages.filter(role="assistant").order_by("id"))
    assert [(m.status, m.content == full) for m in answers] == [
        (MessageStatus.PARTIAL, False),  # what the killed worker had streamed, kept as such
        (MessageStatus.COMPLETE, True),
    ]
    assert chat.messages.filter(role="user").count() == 1
    assert len(background.model_calls()) == 2
    assert chat.usage_records.filter(status="succeeded").count() == 1


# -- (4) two workers, one chat -------------------------------------------------------------
def test_two_workers_given_the_same_chat_at_once_answer_it_once(background, user):
    from agentloop.tasks import step_chat

    workers = [background.start_worker("w1"), background.start_worker("w2")]
    chat = new_chat(user)
    chat.ask_later("sleep:2")
    Chat.objects.filter(pk=chat.pk).update(state=ChatState.QUEUED)

    step_chat.delay(chat.pk)
    step_chat.delay(chat.pk)

    background.wait(lambda: sum(len(w.outcomes()) for w in workers) == 2, "both jobs to finish")
    assert sorted(o for w in workers for o in w.outcomes()) == ["busy", "done"]
    assert all(len(w.outcomes()) == 1 for w in workers)  # each worker took one job
    assert [(m.role, m.content) for m in chat.messages.order_by("id")] == [
        ("user", "sleep:2"),
        ("assistant", "slept"),
    ]
    assert len(background.model_calls()) == 1
    assert Usage.objects.filter(chat=chat).count() == 1
    assert settled(chat)


def test_an_in_process_verb_while_a_worker_runs_the_chat_is_refused_and_the_tool_runs_once(
    background, user
):
    """docs/design.md §12: a verb called in this process while a worker holds the chat does nothing
    (ChatBusyError); the worker's tool (not safe to repeat) runs exactly once."""
    from agentloop.exceptions import ChatBusyError

    background.start_worker("holder", flag=True)
    chat = new_chat(user, charge_card_slowly)
    chat.ask_later("tools:charge_card_slowly").complete_later()
    background.wait(lambda: "charge_card_slowly" in background.runs(), "the tool to start")

    for verb in ("step", "run_tools", "generate", "complete"):
        with pytest.raises(ChatBusyError):
            getattr(Chat.objects.get(pk=chat.pk), verb)()
    (background.tmp / "never-created").touch()  # the tool may finish now
    background.wait(lambda: settled(chat), "the chat to settle")

    assert background.runs() == ["charge_card_slowly"]
    assert roles(chat) == ["user", "assistant", "tool", "assistant"]
    assert len(background.model_calls()) == 2

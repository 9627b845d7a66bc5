"""The background loop on a real Redis and real ``celery worker`` processes (docs/design.md §3, §4).

Each test starts its own workers (``python -m celery -A tests.celery_app worker``) on a queue
of its own, against the test database; the test process enqueues through the same broker,
cancels through the database and Redis, and kills workers with SIGKILL. Chats use the
``rules`` provider (tests/worker_provider.py), which answers the same way in every process.

Skipped when Redis doesn't answer on 127.0.0.1:6379, except under ``CI=true``, where that
fails the run: CI must run these.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from agentloop.messages import MessageStatus, ToolCallState
from agentloop.models import Chat, ChatState, Usage
from tests.helpers import roles, transcript
from tests.processes import REPO_ROOT, process_env
from tests.tools import charge_card_slowly, step_one, step_three, step_two, wait_for_flag
from tests.worker_provider import logged_requests

REDIS_URL = os.environ.get("AGENTLOOP_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
IN_CI = os.environ.get("CI") == "true"
DEADLINE = 60.0  # seconds any one wait may take before the test fails
POLL = 0.05

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]


def _unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"{reason}; under CI=true the Celery integration tests must run")
    pytest.skip(f"{reason} (start it with: bash scripts/services.sh start)")


@pytest.fixture(scope="module")
def redis_client() -> Any:
    try:
        import celery  # noqa: F401
        import redis
    except ImportError as exc:
        _unavailable(f"{exc.name} is not installed (pip install -e '.[redis]')")
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1)
    try:
        client.ping()
    except redis.RedisError as exc:
        _unavailable(f"Redis does not answer at {REDIS_URL}: {exc}")
    return client


# -- workers -------------------------------------------------------------------------------
@dataclass
class Worker:
    name: str
    process: subprocess.Popen
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def outcomes(self) -> list[str]:
        """What each finished step_chat job returned (the worker logs it)."""
        return [
            line.rsplit(":", 1)[1].strip().strip("'")
            for line in self.output().splitlines()
            if "agentloop.step_chat[" in line and " succeeded in " in line
        ]

    def kill(self) -> None:
        """SIGKILL the worker's whole process group (the main process and its pool)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)


@dataclass
class Background:
    """The test's queue, its workers, and the files the tools and provider log to."""

    queue: str
    tmp: Path
    run_log: Path
    provider_log: Path
    workers: list[Worker] = field(default_factory=list)

    def start_worker(self, name: str, *, flag: bool = False, **agentloop: Any) -> Worker:
        """A worker process on this test's queue; ``agentloop`` settings go on top of the
        tests' own; ``flag`` makes wait_for_flag/charge_card_slowly hold until killed."""
        ready = self.tmp / f"{name}.ready"
        log = self.tmp / f"{name}.log"
        worker_settings = {"BACKGROUND": "celery", "REDIS_URL": REDIS_URL, **agentloop}
        env = process_env(
            AGENTLOOP_TEST_QUEUE=self.queue,
            AGENTLOOP_TEST_BROKER_URL=REDIS_URL,
            AGENTLOOP_TEST_WORKER_READY=ready,
            AGENTLOOP_TEST_SETTINGS=json.dumps(worker_settings),
            AGENTLOOP_TEST_RUN_LOG=self.run_log,
            AGENTLOOP_TEST_PROVIDER_LOG=self.provider_log,
            AGENTLOOP_TEST_FLAG=self.tmp / "never-created" if flag else None,
        )
        command = [
            sys.executable, "-m", "celery", "-A", "tests.celery_app", "worker",
            "--pool=prefork", "--concurrency=1", "--loglevel=INFO",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
            "-n", f"{name}-{uuid.uuid4().hex[:6]}@%h", "-Q", self.queue,
        ]  # fmt: skip
        with log.open("w") as output:
            process = subprocess.Popen(  # noqa: S603 - our own interpreter
                command,
                env=env,
                cwd=REPO_ROOT,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: killpg reaches the pool too
            )
        worker = Worker(name, process, log)
        self.workers.append(worker)
        self.wait(ready.exists, f"worker {name} to be ready")
        return worker

    def logs(self) -> str:
        return "\n".join(
            f"--- worker {w.name} (exit {w.process.poll()}) ---\n{w.output()[-4000:]}"
            for w in self.workers
        )

    def wait(self, condition: Callable[[], Any], what: str, timeout: float = DEADLINE) -> Any:
        """Poll ``condition`` until it is true; fail with the workers' logs at the deadline."""
        deadline = time.monotonic() + timeout
        while True:
            value = condition()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}\n{self.logs()}")
            time.sleep(POLL)

    def runs(self) -> list[str]:
        return self.run_log.read_text().split() if self.run_log.exists() else []

    def model_calls(self) -> list[dict[str, Any]]:
        return logged_requests(self.provider_log)


@pytest.fixture
def background(redis_client, tmp_path) -> Iterator[Background]:
    """A queue of this test's own; the test process enqueues to it through Redis."""
    from celery import current_app

    # Importing the app makes it this thread's current app: put the previous one back after.
    previous_current = current_app._get_current_object()
    from tests.celery_app import app

    queue = f"agentloop-test-{uuid.uuid4().hex[:12]}"
    previous_queue = app.conf.task_default_queue
    app.conf.task_default_queue = queue
    app.set_current()
    state = Background(queue, tmp_path, tmp_path / "runs.log", tmp_path / "model_calls.log")
    agentloop = {**settings.AGENTLOOP, "BACKGROUND": "celery", "REDIS_URL": REDIS_URL}
    try:
        with override_settings(AGENTLOOP=agentloop):
            yield state
    finally:
        for worker in state.workers:
            worker.kill()
        previous_current.set_current()
        app.conf.task_default_queue = previous_queue
        redis_client.delete(queue)


def settled(chat: Chat) -> bool:
    """Idle with no lease and nothing left to do (re-read from the database)."""
    chat.refresh_from_db()
    return chat.state == ChatState.IDLE and not chat.lease_token and chat.is_complete()


def new_chat(user, *tools) -> Chat:
    chat = Chat.objects.create(model="rules:test", owner=user)
    if tools:
        chat.with_tools(*tools)
    return chat


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
    from agentloop.events import chat_key, get_backend

    background.start_worker("w1")
    # Event streams are named by chat pk: a random one keeps test runs side by side apart.
    chat = Chat.objects.create(pk=random.randint(10**9, 2 * 10**9), model="rules:test", owner=user)
    stream_key = get_backend().stream(chat_key(chat))
    redis_client.delete(stream_key)
    chat.ask_later("stream:3:0.01").complete_later()

    background.wait(lambda: settled(chat), "the chat to settle")

    events = get_backend().read(chat_key(chat), after=None, timeout=0.1)
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

"""Chats in flight: a step holds no database connection while it waits (docs/background.md).

In-process: during a model call (streamed, with partial saves and cancel reads between the
chunks) the verb's thread holds no connection when ``AGENTLOOP["RELEASE_CONNECTIONS"]`` says
so, and keeps it inside a caller's ``atomic()``. With real ``celery worker`` processes
(prefork, threads, gevent) on PostgreSQL with Django's pool: more chats wait on a slow
OpenAI-compatible server (bench/fake_openai.py, real HTTP) at once than the pool has
connections, every chat ends with its exact transcript, and the worker's backends in
``pg_stat_activity`` never exceed the pool's size. The per-connection prepared statements
follow the physical psycopg connection a pool hands out.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import connection, connections, transaction
from django.test import override_settings

from agentloop import providers
from agentloop.messages import ModelRequest, ModelResponse, TextDelta
from agentloop.models import Chat
from agentloop.providers import ChunkCallback, Provider
from bench.fake_openai import FakeOpenAI
from tests.helpers import transcript
from tests.processes import REPO_ROOT, SUMMARY_PREFIX, process_env, run_script
from tests.redis_urls import redis_url
from tests.tools import lookup

REDIS_URL = os.environ.get("AGENTLOOP_TEST_REDIS_URL", redis_url(15))
IN_CI = os.environ.get("CI") == "true"
DEADLINE = 90.0
ON_POSTGRES = connection.vendor == "postgresql"


# -- in process ----------------------------------------------------------------------------
class HoldChecker(Provider):
    """Streams three words; before and after each chunk's callback (which may save a partial
    and read the cancel flag) records whether this thread holds a database connection."""

    name = "holdcheck"

    def __init__(self) -> None:
        self.held: list[bool] = []

    def _holds(self) -> None:
        self.held.append(connections["default"].connection is not None)

    def request(self, request: ModelRequest, on_chunk: ChunkCallback | None = None) -> Any:
        self._holds()
        words = ["slow ", "streamed ", "answer"]
        for word in words:
            if on_chunk is not None:
                on_chunk(TextDelta(text=word))
                self._holds()
        return ModelResponse(content="".join(words))

    async def arequest(self, request: ModelRequest, *, on_chunk: Any = None) -> Any:
        # The verb's database phases run on the thread-sensitive thread: look there.
        holds = sync_to_async(self._holds, thread_sensitive=True)
        await holds()
        words = ["slow ", "streamed ", "answer"]
        for word in words:
            if on_chunk is not None:
                await on_chunk(TextDelta(text=word))
                await holds()
        return ModelResponse(content="".join(words))


@pytest.fixture
def hold_checker() -> Iterator[HoldChecker]:
    provider = HoldChecker()
    providers.register("holdcheck", provider)
    try:
        yield provider
    finally:
        providers.unregister("holdcheck")


# Every chunk saves the partial answer and reads the cancel flag: each takes a connection.
STREAMING = {"PARTIAL_SAVE_INTERVAL": 0, "CANCEL_POLL_INTERVAL": 0}


@pytest.mark.django_db(transaction=True)
def test_a_streamed_ask_holds_no_connection_while_the_model_answers(hold_checker, user):
    chat = Chat.objects.create(model="holdcheck:m", owner=user)
    chunks: list[str] = []
    with override_settings(AGENTLOOP={**STREAMING, "RELEASE_CONNECTIONS": True}):
        answer = chat.ask("Hi", stream=lambda chunk: chunks.append(chunk.text))

    assert hold_checker.held == [False, False, False, False]
    assert answer.content == "slow streamed answer"
    assert chunks == ["slow ", "streamed ", "answer"]
    assert transcript(chat, "role", "content", "status") == [
        ("user", "Hi", "complete"),
        ("assistant", "slow streamed answer", "complete"),
    ]


@pytest.mark.django_db(transaction=True)
def test_an_async_ask_holds_no_connection_while_the_model_answers(hold_checker, user):
    chat = Chat.objects.create(model="holdcheck:m", owner=user)
    chunks: list[str] = []

    async def collect(chunk: Any) -> None:
        chunks.append(chunk.text)

    with override_settings(AGENTLOOP={**STREAMING, "RELEASE_CONNECTIONS": True}):
        # From this thread: the verb's phases run here, on this thread's connection.
        answer = async_to_sync(chat.aask)("Hi", stream=collect)

    assert hold_checker.held == [False, False, False, False]
    assert answer.content == "slow streamed answer"
    assert chunks == ["slow ", "streamed ", "answer"]
    assert transcript(chat, "role", "content", "status") == [
        ("user", "Hi", "complete"),
        ("assistant", "slow streamed answer", "complete"),
    ]


@pytest.mark.django_db(transaction=True)
def test_without_a_pool_auto_keeps_the_connection_across_the_model_call(hold_checker, user):
    chat = Chat.objects.create(model="holdcheck:m", owner=user)
    with override_settings(AGENTLOOP={**STREAMING, "RELEASE_CONNECTIONS": "auto"}):
        chat.ask("Hi", stream=lambda chunk: None)

    # No OPTIONS["pool"] in the tests' settings: a reconnect per wait would cost more.
    assert hold_checker.held == [True, True, True, True]
    assert transcript(chat)[-1] == ("assistant", "slow streamed answer")


@pytest.mark.django_db(transaction=True)
def test_inside_a_callers_atomic_block_the_connection_is_kept(hold_checker, user):
    chat = Chat.objects.create(model="holdcheck:m", owner=user)
    with override_settings(AGENTLOOP={**STREAMING, "RELEASE_CONNECTIONS": True}):
        with transaction.atomic():
            chat.ask("Hi", stream=lambda chunk: None)

    assert hold_checker.held == [True, True, True, True]
    assert transcript(chat)[-1] == ("assistant", "slow streamed answer")


@pytest.mark.skipif(not ON_POSTGRES, reason="prepared statements: PostgreSQL")
@pytest.mark.django_db(transaction=True)
def test_prepared_statements_follow_the_physical_connection_a_pool_hands_out(user):
    """A pool gives a thread's Django connection one psycopg connection, then another, then
    the first again: a statement run twice on the first is prepared there."""
    from agentloop.django_store.database import transcript_select

    chat = Chat.objects.create(model="holdcheck:m", owner=user)
    select = transcript_select(Chat, "default")
    wrapper = connections["default"]
    wrapper.ensure_connection()
    first = wrapper.connection
    second = wrapper.get_new_connection(wrapper.get_connection_params())
    second.autocommit = True

    parts = select.sql.split("%s")  # as the server keeps it: $1, $2... for the parameters
    statement = "".join(f"{part}${n}" for n, part in enumerate(parts[:-1], 1)) + parts[-1]

    def prepared(raw: Any) -> int:
        return raw.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement = %s", [statement]
        ).fetchone()[0]

    try:
        select.rows([chat.pk])  # the first connection's first run: not prepared
        wrapper.connection = second
        select.rows([chat.pk])
        wrapper.connection = first
        select.rows([chat.pk])  # its second run on the first connection: prepared there
        assert prepared(first) == 1
        assert prepared(second) == 0
        wrapper.connection = second
        select.rows([chat.pk])
        assert prepared(second) == 1
    finally:
        wrapper.connection = first
        second.close()


@pytest.mark.skipif(not ON_POSTGRES, reason="Django's connection pool: PostgreSQL")
@pytest.mark.django_db(transaction=True)
@pytest.mark.subprocess
def test_under_django_pool_a_wait_checks_the_connection_in_and_the_next_gets_it_back():
    """In a process with Django's pool: during a streamed ask() no connection is checked out
    (every one the pool has is idle, partial saves and cancel reads included), and a
    connection given back is the next one handed out (psycopg_pool would hand out the one
    idle the longest: a zero-latency step would switch server processes at every wait)."""
    pool = {"min_size": 3, "max_size": 3, "timeout": 30}
    settings = {**STREAMING, "RELEASE_CONNECTIONS": "auto"}
    done = run_script(
        "pooled_waits.py",
        env={
            "AGENTLOOP_TEST_DB_POOL": json.dumps(pool),
            "AGENTLOOP_TEST_SETTINGS": json.dumps(settings),
            "AGENTLOOP_TEST_DB_APPLICATION": f"agentloop-pooled-waits-{uuid.uuid4().hex[:8]}",
        },
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout.split(SUMMARY_PREFIX, 1)[1])

    assert len(summary["pids"]) == 5
    assert len(set(summary["pids"])) == 1
    assert summary["during_ask"] == [{"held": False, "idle": 3, "size": 3}] * 3
    assert summary["answer"] == "a b"
    # No check-out of the ask is checked: the claim and the writes after each wait run once
    # more on a new connection when the one handed out was dropped.
    assert summary["check_outs"] >= 3
    assert summary["checks"] == 0
    # Every pooled connection dropped while idle: the next ask's claim got a dead one,
    # unchecked, and ran again on a new one (checked: the pool drops the dead ones it meets).
    assert summary["terminated"] == 3
    assert summary["answer_after_termination"] == "a b"
    assert summary["checks_after_termination"] >= 1
    assert "A claim's connection was dropped; trying it once more on a new one" in done.stderr
    assert summary["messages"] == [
        ["user", "Hi"], ["assistant", "a b"], ["user", "Again"], ["assistant", "a b"],
    ]  # fmt: skip


# -- real workers, Django's pool -------------------------------------------------------------
@pytest.fixture(scope="module")
def redis_client() -> Any:
    try:
        import celery  # noqa: F401
        import redis
    except ImportError as exc:
        if IN_CI:
            pytest.fail(f"{exc.name} is not installed")
        pytest.skip(f"{exc.name} is not installed (pip install -e '.[celery]')")
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1)
    try:
        client.ping()
    except redis.RedisError as exc:
        if IN_CI:
            pytest.fail(f"Redis does not answer at {REDIS_URL}: {exc}")
        pytest.skip(f"Redis does not answer at {REDIS_URL}: {exc}")
    return client


@pytest.fixture
def celery_queue(redis_client) -> Iterator[str]:
    """A queue of this test's own; the test process publishes to it."""
    from celery import current_app

    previous_current = current_app._get_current_object()
    from tests.celery_app import app

    queue = f"agentloop-test-{uuid.uuid4().hex[:12]}"
    previous_queue = app.conf.task_default_queue
    app.conf.task_default_queue = queue
    app.set_current()
    agentloop = {"BACKGROUND": "celery", "REDIS_URL": REDIS_URL}
    try:
        with override_settings(AGENTLOOP=agentloop):
            yield queue
    finally:
        previous_current.set_current()
        app.conf.task_default_queue = previous_queue
        redis_client.delete(queue)


def backends(application: str) -> int:
    """The worker's connections to the test database, as PostgreSQL sees them."""
    return len(backend_rows(application))


def backend_rows(application: str) -> list[tuple[Any, ...]]:
    """The worker's backends: pid, client port, state, when it started, its last query."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, client_port, state, backend_start, left(query, 80) FROM "
            "pg_stat_activity WHERE datname = current_database() AND application_name = %s",
            [application],
        )
        return list(cursor.fetchall())


# (Celery pool, its concurrency, Django's pool max_size per process, the chats enqueued)
POOLS = {
    "prefork": ("prefork", 2, 1, 4),
    "threads": ("threads", 8, 2, 8),
    "gevent": ("gevent", 8, 2, 8),
}


@pytest.mark.skipif(not ON_POSTGRES, reason="Django's connection pool: PostgreSQL")
@pytest.mark.django_db(transaction=True)
@pytest.mark.subprocess
@pytest.mark.parametrize("pool", list(POOLS))
def test_a_worker_waits_on_more_chats_than_its_pool_has_connections(
    pool, celery_queue, tmp_path, user
):
    celery_pool, concurrency, max_size, count = POOLS[pool]
    if celery_pool == "gevent":
        pytest.importorskip("gevent")
    application = f"agentloop-in-flight-{uuid.uuid4().hex[:8]}"
    with FakeOpenAI(latency=1.0) as fake:
        worker = start_worker(
            tmp_path,
            celery_queue,
            celery_pool,
            concurrency,
            pool={"min_size": 1, "max_size": max_size, "timeout": 60},
            application=application,
            agentloop={"PROVIDERS": {"openai": {"base_url": fake.url, "api_key": "test"}}},
        )
        try:
            chats = [Chat.objects.create(model="openai:fake", owner=user) for _ in range(count)]
            for index, chat in enumerate(chats):
                chat.with_tools(lookup)
                chat.ask_later(f"q{index}").complete_later()
            peak, at_peak = 0, []
            deadline = time.monotonic() + DEADLINE
            while not all(settled(chat) for chat in chats):
                rows = backend_rows(application)
                if len(rows) > peak:
                    peak, at_peak = len(rows), rows
                assert worker.poll() is None, read_log(tmp_path)
                assert time.monotonic() < deadline, f"chats unfinished\n{read_log(tmp_path)}"
                time.sleep(0.02)
        finally:
            stop(worker)

    for index, chat in enumerate(chats):
        assert transcript(chat, "role", "content", "status") == [
            ("user", f"q{index}", "complete"),
            ("assistant", "", "complete"),
            ("tool", f"value of q{index}", "complete"),
            ("assistant", f"answer: value of q{index}", "complete"),
        ]
        assert chat.usage_records.filter(status="succeeded").count() == 2
    assert fake.requests == 2 * count
    processes = concurrency if celery_pool == "prefork" else 1
    # More chats waited on the model at once than the pool has connections...
    assert fake.peak > max_size
    # ...and the worker never held more than its pools' connections.
    assert 0 < peak <= processes * max_size, f"{peak} backends: {at_peak}\n{read_log(tmp_path)}"


@pytest.mark.skipif(not ON_POSTGRES, reason="Django's connection pool: PostgreSQL")
@pytest.mark.django_db(transaction=True)
@pytest.mark.subprocess
def test_connections_the_server_closed_while_checked_in_are_replaced(celery_queue, tmp_path, user):
    """While every step waits on the model, the worker's pooled connections are killed by the
    server: the steps take fresh ones (a claim's check-out is checked by the pool; a write
    after a wait that gets a dropped one is tried again on a new one) and lose nothing."""
    application = f"agentloop-in-flight-{uuid.uuid4().hex[:8]}"
    with FakeOpenAI(latency=1.5) as fake:
        worker = start_worker(
            tmp_path,
            celery_queue,
            "threads",
            4,
            pool={"min_size": 1, "max_size": 2, "timeout": 60},
            application=application,
            agentloop={"PROVIDERS": {"openai": {"base_url": fake.url, "api_key": "test"}}},
        )
        try:
            chats = [Chat.objects.create(model="openai:fake", owner=user) for _ in range(4)]
            for index, chat in enumerate(chats):
                chat.with_tools(lookup)
                chat.ask_later(f"q{index}").complete_later()
            killed = 0
            deadline = time.monotonic() + DEADLINE
            while fake.requests < len(chats) or fake.in_flight < len(chats):
                assert time.monotonic() < deadline, f"no model calls\n{read_log(tmp_path)}"
                time.sleep(0.01)
            # Every chat waits on its first model call: the pool holds the connections.
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND application_name = %s",
                    [application],
                )
                killed = cursor.fetchone()[0]
            while not all(settled(chat) for chat in chats):
                assert worker.poll() is None, read_log(tmp_path)
                assert time.monotonic() < deadline, f"chats unfinished\n{read_log(tmp_path)}"
                time.sleep(0.02)
        finally:
            stop(worker)

    assert killed >= 1
    for index, chat in enumerate(chats):
        assert transcript(chat, "role", "content", "status") == [
            ("user", f"q{index}", "complete"),
            ("assistant", "", "complete"),
            ("tool", f"value of q{index}", "complete"),
            ("assistant", f"answer: value of q{index}", "complete"),
        ]
        assert chat.error == ""
        assert chat.attempts == 0
    assert fake.requests == 2 * len(chats)


def settled(chat: Chat) -> bool:
    chat.refresh_from_db()
    return chat.state == "idle" and not chat.lease_token and chat.is_complete()


def start_worker(
    tmp: Path,
    queue: str,
    celery_pool: str,
    concurrency: int,
    *,
    pool: dict[str, Any],
    application: str,
    agentloop: dict[str, Any],
) -> subprocess.Popen[bytes]:
    ready = tmp / "ready"
    settings = {"BACKGROUND": "celery", "REDIS_URL": REDIS_URL, **agentloop}
    env = process_env(
        AGENTLOOP_TEST_QUEUE=queue,
        AGENTLOOP_TEST_BROKER_URL=REDIS_URL,
        AGENTLOOP_TEST_WORKER_READY=ready,
        AGENTLOOP_TEST_SETTINGS=json.dumps(settings),
        AGENTLOOP_TEST_DB_POOL=json.dumps(pool),
        AGENTLOOP_TEST_DB_APPLICATION=application,
    )
    command = [
        sys.executable, "-m", "celery", "-A", "tests.celery_app", "worker",
        f"--pool={celery_pool}", f"--concurrency={concurrency}", "--loglevel=INFO",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
        "-n", f"inflight-{uuid.uuid4().hex[:6]}@%h", "-Q", queue,
    ]  # fmt: skip
    with (tmp / "worker.log").open("w") as output:
        process = subprocess.Popen(  # noqa: S603 - our own interpreter
            command,
            env=env,
            cwd=REPO_ROOT,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + DEADLINE
    while not ready.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process)
            raise AssertionError(f"the worker did not start\n{read_log(tmp)}")
        time.sleep(0.05)
    return process


def read_log(tmp: Path) -> str:
    log = tmp / "worker.log"
    return log.read_text(errors="replace")[-6000:] if log.exists() else ""


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)

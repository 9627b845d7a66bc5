"""Real ``celery worker`` processes for the tests (``python -m celery -A tests.celery_app``).

:func:`start_worker` starts one (prefork, one process, its own process group) on a queue,
broker and database; :class:`Worker` reads its log and kills it. Two owners use them: the
Celery tests' :class:`Background` (the ``background`` fixture of tests/conftest.py, on the
machine's Redis) and the fault suite's ``Workers`` (tests/faults/parts.py, on a private one).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentloop.models import Chat, ChatState
from tests.helpers import wait_until
from tests.processes import REPO_ROOT, process_env
from tests.redis_urls import redis_url
from tests.worker_provider import logged_requests

#: the Celery tests' broker (and REDIS_URL); database 15, the SSE tests take 1-14.
REDIS_URL = os.environ.get("AGENTLOOP_TEST_REDIS_URL", redis_url(15))
IN_CI = os.environ.get("CI") == "true"
DEADLINE = 60.0  # seconds any one wait may take before the test fails
POLL = 0.05


def unavailable(reason: str) -> None:
    """Skip, or fail under ``CI=true``: CI must run the Celery integration tests."""
    # Function-local: pytest is only needed when a part is missing.
    import pytest

    if IN_CI:
        pytest.fail(f"{reason}; under CI=true the Celery integration tests must run")
    pytest.skip(f"{reason} (start it with: bash scripts/services.sh start)")


@dataclass
class Worker:
    name: str
    process: subprocess.Popen[bytes]
    log: Path
    #: the Celery node name (``-n``), which remote control addresses.
    nodename: str = ""
    #: where this test's part of the log starts (a worker kept between tests: :class:`Pool`).
    offset: int = 0
    #: the file the worker creates once it consumes.
    ready: Path | None = None

    def output(self) -> str:
        if not self.log.exists():
            return ""
        with self.log.open("rb") as log:
            log.seek(self.offset)
            return log.read().decode(errors="replace")

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
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)


def start_worker(
    tmp: Path,
    name: str,
    *,
    queue: str,
    broker_url: str,
    run_log: Path,
    provider_log: Path | None = None,
    flag: Path | None = None,
    clock_offset: float = 0.0,
    netns: str | None = None,
    database_url: str | None = None,
    agentloop: dict[str, Any] | None = None,
    pythonpath: Path | None = None,
    concurrency: int = 1,
    kill_points: Path | None = None,
    queue_file: Path | None = None,
    pool: str = "prefork",
    env: dict[str, Any] | None = None,
) -> tuple[Worker, Path]:
    """A ``celery worker`` (prefork, one process) on ``queue``, logging to ``tmp/<name>.log``;
    returns it and the file it creates once ready (the caller waits for it).

    ``agentloop`` settings go on top of the tests' own; tools log their runs to ``run_log``,
    the ``rules`` provider its requests to ``provider_log``; held tools wait for ``flag``;
    ``clock_offset`` moves the worker's clock (seconds, time-machine); ``netns`` runs it in
    that network namespace; ``database_url`` points it at another database address;
    ``pythonpath`` is a folder it imports from too (code this process has, say);
    ``concurrency`` sizes its pool; its processes stop at the ``kill_points`` a test arms in
    that folder (tests/kill_points.py); ``queue_file`` names the queue its jobs go to (a worker
    moved between tests' queues: :class:`Pool`); ``pool`` is Celery's ``--pool``; ``env`` adds
    to (or, with None, removes from) its environment (another settings module, say).
    """
    ready = tmp / f"{name}.ready"
    log = tmp / f"{name}.log"
    nodename = f"{name}-{uuid.uuid4().hex[:6]}@{socket.gethostname()}"
    worker_settings = {"BACKGROUND": "celery", "REDIS_URL": broker_url, **(agentloop or {})}
    environment = process_env(
        AGENTLOOP_TEST_QUEUE=queue,
        AGENTLOOP_TEST_BROKER_URL=broker_url,
        AGENTLOOP_TEST_WORKER_READY=ready,
        AGENTLOOP_TEST_SETTINGS=json.dumps(worker_settings),
        AGENTLOOP_TEST_RUN_LOG=run_log,
        AGENTLOOP_TEST_PROVIDER_LOG=provider_log,
        AGENTLOOP_TEST_FLAG=flag,
        AGENTLOOP_TEST_CLOCK_OFFSET=clock_offset or None,
        AGENTLOOP_TEST_KILL_POINTS=kill_points,
        AGENTLOOP_TEST_QUEUE_FILE=queue_file,
        **(env or {}),
    )
    if database_url:
        environment["DATABASE_URL"] = database_url
    if pythonpath is not None:
        environment["PYTHONPATH"] = f"{environment['PYTHONPATH']}{os.pathsep}{pythonpath}"
    command = [
        sys.executable, "-m", "celery", "-A", "tests.celery_app", "worker",
        f"--pool={pool}", f"--concurrency={concurrency}", "--loglevel=INFO",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
        "-n", nodename, "-Q", queue,
    ]  # fmt: skip
    if netns:
        command = ["ip", "netns", "exec", netns, *command]
    with log.open("w") as output:
        process = subprocess.Popen(  # noqa: S603 - our own interpreter
            command,
            env=environment,
            cwd=REPO_ROOT,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: killpg reaches the pool too
        )
    return Worker(name, process, log, nodename, ready=ready), ready


def worker_logs(workers: Iterable[Worker], tail: int) -> str:
    """The last ``tail`` characters of each worker's log, with its exit status."""
    return "\n".join(
        f"--- worker {w.name} (exit {w.process.poll()}) ---\n{w.output()[-tail:]}" for w in workers
    )


class Pool:
    """Workers kept between the tests of one module, so that most tests don't pay a worker's
    start (2 to 3 s each on a 2-core machine).

    A worker is kept only if it was started with nothing of one test's own (no kill points, no
    extra import folder): its settings, pool size and ``flag`` are its key, and a later test
    asking for the same gets it. Each test still has a queue of its own: the kept worker is
    told to consume the new test's queue (Celery's remote control) and the jobs it sends go
    there too (``AGENTLOOP_TEST_QUEUE_FILE``, tests/celery_app.py). The files a worker's tools
    and provider log to, and the flag file, are links in the pool's folder that point into the
    current test's own ``tmp`` folder, so a test reads only what its own chats did. At a test's
    end a worker goes back only once it has stopped consuming that test's queue and runs
    nothing; a worker still busy (a held tool, a stream) is killed, as one not kept is.
    """

    #: seconds a test's end waits for a kept worker to finish what it runs before killing it.
    SETTLE = 2.0

    def __init__(self, folder: Path, app: Any) -> None:
        self.folder = folder
        self.app = app
        self.queue_file = folder / "queue"
        self._idle: dict[str, list[Worker]] = {}
        self._started = 0

    #: the files kept workers log to and wait for, as links into the current test's folder.
    LINKED = ("runs.log", "model_calls.log", "never-created")

    def serve(self, tmp: Path) -> None:
        """Point the links at a new test's folder ``tmp`` (before any of its workers runs)."""
        for name in self.LINKED:
            link = self.folder / name
            link.unlink(missing_ok=True)
            link.symlink_to(tmp / name)

    def lend(self, key: str, name: str, queue: str) -> Worker | None:
        """An idle kept worker of ``key``, now consuming ``queue``; None if there is none."""
        while self._idle.get(key):
            kept = self._idle[key].pop()
            self.queue_file.write_text(queue)
            replies = self.app.control.add_consumer(
                queue, destination=[kept.nodename], reply=True, timeout=5
            )
            if kept.process.poll() is None and _answered(replies, kept.nodename):
                size = kept.log.stat().st_size if kept.log.exists() else 0
                return Worker(name, kept.process, kept.log, kept.nodename, size, kept.ready)
            kept.kill()
        return None

    def start(self, name: str, queue: str, start: Callable[..., tuple[Worker, Path]]) -> Any:
        """Start a worker to keep (``start(folder, name, queue_file)``); returns its ready file."""
        self._started += 1
        self.queue_file.write_text(queue)
        return start(self.folder, f"{name}-{self._started}", self.queue_file)

    def take_back(self, key: str, worker: Worker, queue: str) -> None:
        """Keep ``worker`` for the next test if it stops consuming ``queue`` and is idle."""
        if worker.process.poll() is None and self._settle(worker, queue):
            self._idle.setdefault(key, []).append(worker)
        else:
            worker.kill()

    def close(self) -> None:
        for kept in self._idle.values():
            for worker in kept:
                worker.kill()
        self._idle.clear()

    def _settle(self, worker: Worker, queue: str) -> bool:
        replies = self.app.control.cancel_consumer(
            queue, destination=[worker.nodename], reply=True, timeout=5
        )
        if not _answered(replies, worker.nodename):
            return False
        deadline = time.monotonic() + self.SETTLE
        inspect = self.app.control.inspect([worker.nodename], timeout=2, limit=1)
        while time.monotonic() < deadline:
            active, reserved = inspect.active(), inspect.reserved()
            if active is None or reserved is None:
                return False
            if not active.get(worker.nodename) and not reserved.get(worker.nodename):
                return True
            time.sleep(POLL)
        return False


def _answered(replies: Any, nodename: str) -> bool:
    return any(nodename in reply for reply in replies or [])


@dataclass
class Background:
    """The test's queue, its workers, and the files the tools and provider log to."""

    queue: str
    tmp: Path
    run_log: Path
    provider_log: Path
    workers: list[Worker] = field(default_factory=list)
    #: the module's kept workers (None: every worker is the test's own).
    pool: Pool | None = None
    _borrowed: list[tuple[str, Worker]] = field(default_factory=list)

    def start_worker(
        self,
        name: str,
        *,
        flag: bool = False,
        concurrency: int = 1,
        kill_points: Path | None = None,
        pythonpath: Path | None = None,
        **agentloop: Any,
    ) -> Worker:
        """A worker process on this test's queue; ``agentloop`` settings go on top of the
        tests' own; ``flag`` makes wait_for_flag/charge_card_slowly hold until killed (or until
        the test creates ``tmp/never-created``); ``concurrency``, ``kill_points`` and
        ``pythonpath`` as for :func:`start_worker`. A worker with neither ``kill_points`` nor
        ``pythonpath`` may be one kept from an earlier test of the module (:class:`Pool`)."""
        pool = self.pool if kill_points is None and pythonpath is None else None
        key = json.dumps([flag, concurrency, agentloop], sort_keys=True, default=str)
        if pool is not None:
            kept = pool.lend(key, name, self.queue)
            if kept is not None:
                self.workers.append(kept)
                self._borrowed.append((key, kept))
                return kept

        def start(folder: Path, worker_name: str, queue_file: Path | None) -> Any:
            # self.tmp's own files, or the pool's links to them (same names: Pool.LINKED)
            run_log, provider_log, flag_file = (folder / name for name in Pool.LINKED)
            return start_worker(
                folder,
                worker_name,
                queue=self.queue,
                broker_url=REDIS_URL,
                run_log=run_log,
                provider_log=provider_log,
                flag=flag_file if flag else None,
                agentloop=agentloop,
                concurrency=concurrency,
                kill_points=kill_points,
                pythonpath=pythonpath,
                queue_file=queue_file,
            )

        if pool is not None:
            worker, ready = pool.start(name, self.queue, start)
            self._borrowed.append((key, worker))
        else:
            worker, ready = start(self.tmp, name, None)
        self.workers.append(worker)
        self.wait(ready.exists, f"worker {name} to be ready")
        return worker

    def close(self) -> None:
        """Kill this test's own workers; give kept ones back to the pool (or kill them)."""
        borrowed = {id(worker) for _, worker in self._borrowed}
        for worker in self.workers:
            if id(worker) not in borrowed:
                worker.kill()
        for key, worker in self._borrowed:
            assert self.pool is not None
            self.pool.take_back(key, worker, self.queue)

    def logs(self) -> str:
        return worker_logs(self.workers, 4000)

    def wait(self, condition: Callable[[], Any], what: str, timeout: float = DEADLINE) -> Any:
        """Poll ``condition`` until it is true; fail with the workers' logs at the deadline."""
        return wait_until(condition, what, timeout, self.logs, poll=POLL)

    def runs(self) -> list[str]:
        return self.run_log.read_text().split() if self.run_log.exists() else []

    def model_calls(self) -> list[dict[str, Any]]:
        return logged_requests(self.provider_log)


def settled(chat: Chat) -> bool:
    """Idle with no lease and nothing left to do (re-read from the database)."""
    chat.refresh_from_db()
    return chat.state == ChatState.IDLE and not chat.lease_token and chat.is_complete()


def new_chat(user: Any, *tools: Any) -> Chat:
    """A chat on the ``rules`` provider (tests/worker_provider.py) offering ``tools``."""
    chat = Chat.objects.create(model="rules:test", owner=user)
    if tools:
        chat.with_tools(*tools)
    return chat

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
import subprocess
import sys
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
) -> tuple[Worker, Path]:
    """A ``celery worker`` (prefork, one process) on ``queue``, logging to ``tmp/<name>.log``;
    returns it and the file it creates once ready (the caller waits for it).

    ``agentloop`` settings go on top of the tests' own; tools log their runs to ``run_log``,
    the ``rules`` provider its requests to ``provider_log``; held tools wait for ``flag``;
    ``clock_offset`` moves the worker's clock (seconds, time-machine); ``netns`` runs it in
    that network namespace; ``database_url`` points it at another database address;
    ``pythonpath`` is a folder it imports from too (code this process has, say);
    ``concurrency`` sizes its pool; its processes stop at the ``kill_points`` a test arms in
    that folder (tests/kill_points.py).
    """
    ready = tmp / f"{name}.ready"
    log = tmp / f"{name}.log"
    worker_settings = {"BACKGROUND": "celery", "REDIS_URL": broker_url, **(agentloop or {})}
    env = process_env(
        AGENTLOOP_TEST_QUEUE=queue,
        AGENTLOOP_TEST_BROKER_URL=broker_url,
        AGENTLOOP_TEST_WORKER_READY=ready,
        AGENTLOOP_TEST_SETTINGS=json.dumps(worker_settings),
        AGENTLOOP_TEST_RUN_LOG=run_log,
        AGENTLOOP_TEST_PROVIDER_LOG=provider_log,
        AGENTLOOP_TEST_FLAG=flag,
        AGENTLOOP_TEST_CLOCK_OFFSET=clock_offset or None,
        AGENTLOOP_TEST_KILL_POINTS=kill_points,
    )
    if database_url:
        env["DATABASE_URL"] = database_url
    if pythonpath is not None:
        env["PYTHONPATH"] = f"{env['PYTHONPATH']}{os.pathsep}{pythonpath}"
    command = [
        sys.executable, "-m", "celery", "-A", "tests.celery_app", "worker",
        "--pool=prefork", f"--concurrency={concurrency}", "--loglevel=INFO",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
        "-n", f"{name}-{uuid.uuid4().hex[:6]}@%h", "-Q", queue,
    ]  # fmt: skip
    if netns:
        command = ["ip", "netns", "exec", netns, *command]
    with log.open("w") as output:
        process = subprocess.Popen(  # noqa: S603 - our own interpreter
            command,
            env=env,
            cwd=REPO_ROOT,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: killpg reaches the pool too
        )
    return Worker(name, process, log), ready


def worker_logs(workers: Iterable[Worker], tail: int) -> str:
    """The last ``tail`` characters of each worker's log, with its exit status."""
    return "\n".join(
        f"--- worker {w.name} (exit {w.process.poll()}) ---\n{w.output()[-tail:]}" for w in workers
    )


@dataclass
class Background:
    """The test's queue, its workers, and the files the tools and provider log to."""

    queue: str
    tmp: Path
    run_log: Path
    provider_log: Path
    workers: list[Worker] = field(default_factory=list)

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
        tests' own; ``flag`` makes wait_for_flag/charge_card_slowly hold until killed;
        ``concurrency``, ``kill_points`` and ``pythonpath`` as for :func:`start_worker`."""
        worker, ready = start_worker(
            self.tmp,
            name,
            queue=self.queue,
            broker_url=REDIS_URL,
            run_log=self.run_log,
            provider_log=self.provider_log,
            flag=self.tmp / "never-created" if flag else None,
            agentloop=agentloop,
            concurrency=concurrency,
            kill_points=kill_points,
            pythonpath=pythonpath,
        )
        self.workers.append(worker)
        self.wait(ready.exists, f"worker {name} to be ready")
        return worker

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

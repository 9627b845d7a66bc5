"""Fixtures of the fault suite: a private broker, workers on it, the sweeper, the invariants.

The scenarios with real parts run on PostgreSQL (the database faults need a server;
``make test``'s second run): on SQLite they are skipped. Without ``redis-server`` or Celery
they are skipped too, except under ``CI=true``, where that fails the run.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings

from agentloop.models import Chat
from tests.faults import invariants
from tests.faults.parts import DEADLINE, RedisServer, Workers, unavailable, wait_for
from tests.faults.tools import Charge, Lookup, Nap, SlowCharge

#: the tools every scenario's chats carry (the rule says which ones the model calls).
TOOLS = (Lookup, Charge, SlowCharge, Nap)


@pytest.fixture
def postgresql() -> None:
    """The scenarios with real parts run on PostgreSQL only (the database faults need a
    server; one run bounds the suite's time): on SQLite they are skipped."""
    if connection.vendor != "postgresql":
        pytest.skip("the fault suite runs on PostgreSQL (DATABASE_URL=postgres://...)")


@pytest.fixture
def redis_server(postgresql, tmp_path) -> Iterator[RedisServer]:
    """A private ``redis-server`` on a free port, killed at the end whatever happened."""
    try:
        import celery  # noqa: F401
        import redis  # noqa: F401
    except ImportError as exc:
        unavailable(f"{exc.name} is not installed (pip install -e '.[celery]')")
    if shutil.which("redis-server") is None:
        unavailable("redis-server is not installed (apt-get install redis-server)")
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.kill()


@dataclass
class Faults:
    """One scenario: the private broker, the workers, the chats sent and the sweeper."""

    redis: RedisServer
    workers: Workers
    tmp: Path
    sent: list[invariants.Sent] = field(default_factory=list)
    sweep_every: float = 0.0
    _last_sweep: float = 0.0
    sweeps_failed: int = 0

    def send(self, user: Any, rule: str, *, now: bool = True) -> Chat:
        """A chat with the suite's tools asked ``rule`` and run in the background."""
        chat = Chat.objects.create(model="rules:test", owner=user)
        chat.with_tools(*TOOLS)
        chat.ask_later(rule)
        if now:
            chat.complete_later()
        self.sent.append(invariants.Sent(chat.pk, rule))
        return chat

    def sweep(self) -> None:
        """The sweeper, as celery beat runs it; a sweep during a broker outage fails (beat's
        task would not even be delivered) and the next one tries again."""
        # Function-local: recovery imports the models, loaded after Django's setup.
        from agentloop.runners.sweeper import resume_stalled

        self._last_sweep = time.monotonic()
        try:
            resume_stalled()
        except Exception:
            self.sweeps_failed += 1
            connection.close()

    def wait(self, condition: Any, what: str, timeout: float = DEADLINE) -> Any:
        """Poll ``condition`` (sweeping every ``sweep_every`` seconds when set)."""

        def check() -> Any:
            if self.sweep_every and time.monotonic() - self._last_sweep >= self.sweep_every:
                self.sweep()
            return condition()

        return wait_for(check, what, timeout, on_timeout=self.report)

    def report(self) -> str:
        """The chats' rows and transcripts, then the workers' logs (for a failed wait)."""
        lines = []
        for item in self.sent:
            chat = Chat.objects.get(pk=item.chat_pk)
            lines.append(
                f"chat {chat.pk}: {chat.state} lease={chat.lease_token[:6]!r} "
                f"expires={chat.lease_expires_at} updated={chat.updated_at} error={chat.error!r}"
            )
            for message in chat.messages.order_by("id"):
                lines.append(f"    {message.role} {message.status} {message.content[:60]!r}")
            for call in chat.tool_calls.order_by("id"):
                lines.append(f"    call {call.call_id} {call.name} {call.state}")
        return "\n".join(lines) + "\n" + self.workers.logs()

    def all_settled(self) -> bool:
        return all(invariants.settled(Chat.objects.get(pk=s.chat_pk)) for s in self.sent)

    def check(self) -> None:
        """The invariants, after every scenario."""
        invariants.assert_invariants(self.sent, self.workers.run_log, self.workers.logs())


def _celery_app(broker_url: str, queue: str) -> Any:
    """A Celery app of this process publishing to the private broker (tests.celery_app's
    transport options: a job unacknowledged for 5 s goes back to the queue)."""
    # Function-local: Celery is the optional "celery" extra.
    from celery import Celery

    from tests import celery_app

    app = Celery("agentloop_faults", set_as_current=False)
    app.conf.update(
        broker_url=broker_url,
        broker_connection_retry_on_startup=True,
        broker_transport_options=celery_app.app.conf.broker_transport_options,
        task_default_queue=queue,
        task_ignore_result=True,
    )
    return app


@pytest.fixture
def faults(redis_server, tmp_path) -> Iterator[Faults]:
    """A scenario on the private broker (also ``REDIS_URL``): this process enqueues to it."""
    from celery import current_app

    previous = current_app._get_current_object()
    broker = redis_server.url(0)
    workers = Workers(tmp_path, broker)
    app = _celery_app(broker, workers.queue)
    app.set_current()
    agentloop = {**settings.AGENTLOOP, "BACKGROUND": "celery", "REDIS_URL": broker}
    try:
        with override_settings(AGENTLOOP=agentloop):
            yield Faults(redis_server, workers, tmp_path)
    finally:
        workers.stop_all()
        app.close()
        previous.set_current()

"""Running chats in the background: Celery when configured, else in-process threads.

``enqueue(chat)`` schedules one ``step`` job after the current transaction commits.
Each job runs :func:`agentloop._runner.run_step` and schedules the next one, so a
conversation advances one step per job until it is complete, waiting, cancelled,
stopped or failed. Without a broker (the embedded default) the same job function
runs on a small thread pool in this process: fine for ``runserver`` and demos, not
for production (a system check says so when ``DEBUG`` is off).
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from django.apps import apps
from django.db import close_old_connections, connections, transaction
from django.db.models.functions import Now

from ._runner import StepOutcome, run_step
from .conf import agentloop_settings

__all__ = [
    "backend_name",
    "enqueue",
    "follow_up",
    "mark_unsent",
    "run_job",
    "wait_for_embedded_jobs",
]

logger = logging.getLogger(__name__)


def backend_name() -> str:
    """The runner of background steps: "celery", "embedded" or "django_tasks", from
    ``AGENTLOOP["RUNNER"]`` ("auto": Celery when its app has a broker, else embedded)."""
    choice = agentloop_settings.RUNNER
    if choice == "auto":
        choice = agentloop_settings.BACKGROUND  # the older name of the setting
    if choice in ("celery", "embedded", "django_tasks"):
        return str(choice)
    try:
        # Function-local: Celery is an optional dependency (the "celery" extra).
        from celery import current_app
    except ImportError:
        return "embedded"
    return "celery" if current_app.conf.broker_url else "embedded"


def enqueue(
    chat_id: Any, model_label: str = "agentloop.Chat", *, countdown: float | None = None,
    attempt: int = 0, using: str | None = None,
) -> None:  # fmt: skip
    """Schedule a step of the chat once the current transaction commits."""
    transaction.on_commit(
        lambda: _send_or_mark(chat_id, model_label, countdown=countdown, attempt=attempt),
        using=using,
    )


def _send_or_mark(chat_id: Any, model_label: str, *, countdown: float | None, attempt: int) -> None:
    """Send the job; if the broker can't take it (down, restarting), mark the queued chat
    stalled at once instead of failing the caller: the next sweep, or a worker reconnecting
    to the broker, sends it (no wait for ``STALE_QUEUED_SECONDS``)."""
    try:
        _send(chat_id, model_label, countdown=countdown, attempt=attempt)
    except Exception:
        logger.exception(
            "Chat %s: its next job could not be sent; the sweeper sends it again", chat_id
        )
        mark_unsent(chat_id, model_label)


def mark_unsent(chat_id: Any, model_label: str = "agentloop.Chat") -> bool:
    """Date a queued, unheld chat back by ``STALE_QUEUED_SECONDS``, so the sweeper's next run
    finds it stalled (one UPDATE); False when the chat isn't queued and free any more."""
    chat_model: Any = apps.get_model(model_label)
    # The database's clock, as the sweeper's query reads it.
    stale = Now() - timedelta(seconds=agentloop_settings.STALE_QUEUED_SECONDS + 1)
    try:
        return bool(
            chat_model._default_manager.filter(pk=chat_id, state="queued", lease_token="").update(
                updated_at=stale
            )
        )
    except Exception:
        # The database is down too: the sweeper finds the chat after STALE_QUEUED_SECONDS.
        logger.exception("Chat %s: could not mark its lost job", chat_id)
        return False


def _send(chat_id: Any, model_label: str, *, countdown: float | None, attempt: int) -> None:
    runner = backend_name()
    if runner == "celery":
        # Function-local: the tasks module needs Celery, an optional dependency.
        from .tasks import step_chat

        step_chat.apply_async((chat_id, model_label, attempt), countdown=countdown)
    elif runner == "django_tasks":
        # Function-local: defining a django.tasks task needs Django 6 and its TASKS setting.
        from ._django_tasks import enqueue_step

        enqueue_step(chat_id, model_label, countdown, attempt)
    else:
        _embedded().submit(chat_id, model_label, countdown=countdown, attempt=attempt)


def follow_up(outcome: StepOutcome, chat_id: Any, model_label: str, attempt: int = 0) -> None:
    """What a finished job schedules: the next step, or a retry of this one (the chat counts
    its attempts and fails once ``STEP_RETRIES`` are used up). When the database could not
    be reached the job counts (``attempt``): after ``STEP_RETRIES`` such tries it stops and
    the sweeper finds the chat later."""
    if outcome.enqueue_next:
        _send_or_mark(chat_id, model_label, countdown=None, attempt=0)
    elif outcome.action == "retry":
        _send_or_mark(chat_id, model_label, countdown=outcome.retry_in, attempt=0)
    elif outcome.action == "unreachable":
        if attempt < agentloop_settings.STEP_RETRIES:
            _send_or_mark(chat_id, model_label, countdown=outcome.retry_in, attempt=attempt + 1)
        else:
            logger.error(
                "Chat %s: the database could not be reached in %d tries (%s); the job stops "
                "and the sweeper (resume_stalled_chats) enqueues the chat again",
                chat_id, attempt + 1, outcome.error,
            )  # fmt: skip


def run_job(chat_id: Any, model_label: str = "agentloop.Chat", attempt: int = 0) -> StepOutcome:
    """One job: a step under the lease; then the next job is scheduled."""
    outcome = run_step(chat_id, model_label, attempt)
    follow_up(outcome, chat_id, model_label, attempt)
    return outcome


class _EmbeddedRunner:
    """A small thread pool that runs jobs in this process (no broker needed)."""

    def __init__(self, workers: int) -> None:
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="agentloop-job")
        self.pending = 0
        self.idle = threading.Condition()

    def submit(
        self, chat_id: Any, model_label: str, *, countdown: float | None, attempt: int
    ) -> None:
        with self.idle:
            self.pending += 1
        if countdown:
            timer = threading.Timer(countdown, self._start, (chat_id, model_label, attempt))
            timer.daemon = True
            timer.start()
        else:
            self._start(chat_id, model_label, attempt)

    def _start(self, chat_id: Any, model_label: str, attempt: int) -> None:
        self.pool.submit(self._job, chat_id, model_label, attempt)

    def _job(self, chat_id: Any, model_label: str, attempt: int) -> None:
        close_old_connections()
        try:
            run_job(chat_id, model_label, attempt)
        except Exception:
            logger.exception("Background step of chat %s failed", chat_id)
        finally:
            connections.close_all()
            with self.idle:
                self.pending -= 1
                self.idle.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        with self.idle:
            return self.idle.wait_for(lambda: self.pending == 0, timeout)


_runner: _EmbeddedRunner | None = None
_runner_lock = threading.Lock()


def _embedded() -> _EmbeddedRunner:
    global _runner
    with _runner_lock:
        if _runner is None:
            _runner = _EmbeddedRunner(agentloop_settings.EMBEDDED_WORKERS)
        return _runner


def wait_for_embedded_jobs(timeout: float | None = None) -> bool:
    """Block until the embedded runner has no jobs left (demos and tests); True if idle."""
    return _embedded().wait(timeout)

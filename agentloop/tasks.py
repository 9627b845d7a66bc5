"""Celery tasks. Thin: a primary key in, the logic in :mod:`agentloop.runners`.

The periodic ones (the sweeper, the batch poller, retention) go into beat's schedule with
:func:`beat_schedule`: ``CELERY_BEAT_SCHEDULE = beat_schedule()`` in the settings.

Also a worker bootstep, added to every worker that imports this module: when the worker's
connection to the broker comes back after a loss, it sends again the jobs of chats queued
before the loss (a broker restarted without persistence lost them), so chats in flight go
on without waiting for the sweeper. And a check at the worker's start: a ``threads`` or
``gevent`` worker whose settings would run Django's connection pool dry logs why
(agentloop.E020, ``agentloop.runners.pools``).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery import bootsteps, shared_task
from celery.signals import worker_init
from django.db import connections

from .exceptions import ConfigurationError
from .runners import Job, run_job
from .runners.celery import STEP_TASK
from .runners.pools import starving_reuse
from .runners.sweeper import resend_queued, resume_stalled

__all__ = [
    "PERIODIC_TASKS",
    "ResendAfterReconnect",
    "beat_schedule",
    "delete_idle_chats",
    "embed_past_messages",
    "poll_batches",
    "resume_stalled_chats",
    "run_eval_case",
    "step_chat",
]

logger = logging.getLogger(__name__)


@shared_task(
    name=STEP_TASK,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
def step_chat(chat_id: Any, model_label: str = "agentloop.Chat", attempt: int = 0) -> str:
    """Run one step of a chat and send the next; returns what happened. ``attempt``
    counts the job's tries after the database could not be reached."""
    # A job that could not reach the database is sent again (counted) before this one is
    # acknowledged (acks_late): never done while its chat still waits.
    return run_job(Job(chat_id, model_label, attempt=attempt)).action


@shared_task(name="agentloop.resume_stalled_chats", ignore_result=True)
def resume_stalled_chats() -> int:
    """Re-enqueue chats whose worker died (expired lease) or whose job was lost."""
    return len(resume_stalled())


@shared_task(name="agentloop.poll_batches", ignore_result=True)
def poll_batches() -> int:
    """Refresh open batches; append the answers of ended ones to their chats, and put those
    of eval runs' batches into their cases (run it every minute or so with celery beat).
    Returns how many batches were polled."""
    # Function-local: batches import the models; Celery may load tasks before apps are ready.
    from .batches import poll
    from .evals.batch_rounds import poll as poll_eval_runs

    return len(poll()) + len(poll_eval_runs())


@shared_task(name="agentloop.delete_idle_chats", ignore_result=True)
def delete_idle_chats(days: int | None = None) -> int:
    """Delete chats idle for more than ``days`` (default ``AGENTLOOP["RETENTION_DAYS"]``;
    unset: nothing); run it daily with celery beat. Returns how many chats went."""
    # Function-local: the data functions import the models; Celery may load tasks before apps.
    from .data import delete_idle_chats as delete

    report = delete(days)
    if report.deleted.chats:
        logger.info("%s", report)
    return report.deleted.chats


@shared_task(name="agentloop.embed_past_messages", ignore_result=True)
def embed_past_messages(batches: int = 10) -> int:
    """Embed past chats' messages for search across an owner's chats (nothing while
    ``AGENTLOOP["PAST_CHATS_EMBEDDING_MODEL"]`` is unset): ``batches`` batches, then, while
    more are pending, this job again (it goes on where it stopped). Returns how many."""
    # Function-local: it imports the models; Celery may load tasks before apps are ready.
    from .past_chats import embed_pending_messages

    progress = embed_pending_messages(batches=batches)
    if progress.more:
        embed_past_messages.apply_async(args=(batches,))
    return progress.embedded


#: agentloop's periodic tasks, each with its entry's name in beat's schedule.
PERIODIC_TASKS: dict[str, str] = {
    # Re-enqueues chats whose worker died or whose job was lost: needed by every project.
    "agentloop.resume_stalled_chats": "agentloop-resume-stalled-chats",
    # Appends the answers of provider batches that ended (nothing to do without batches).
    "agentloop.poll_batches": "agentloop-poll-batches",
    # Deletes chats idle for RETENTION_DAYS (nothing to do while that is unset).
    "agentloop.delete_idle_chats": "agentloop-delete-idle-chats",
    # Embeds past chats' messages (nothing to do while PAST_CHATS_EMBEDDING_MODEL is unset).
    "agentloop.embed_past_messages": "agentloop-embed-past-messages",
}


def beat_schedule(
    *,
    resume_stalled_chats: float = 60.0,
    poll_batches: float | None = 300.0,
    delete_idle_chats: float | None = 24 * 60 * 60.0,
    embed_past_messages: float | None = 60.0,
) -> dict[str, dict[str, Any]]:
    """Celery beat's entries for agentloop's periodic tasks, every ``n`` seconds each
    (``None`` leaves one out; the sweeper, ``resume_stalled_chats``, is always needed)::

        from agentloop.tasks import beat_schedule

        CELERY_BEAT_SCHEDULE = beat_schedule()  # or {**beat_schedule(), "yours": {...}}

    An entry whose task has nothing to do costs one query at most (no batches open, no
    ``RETENTION_DAYS``, no ``PAST_CHATS_EMBEDDING_MODEL``: none), so the defaults fit a
    project that uses none of them.
    """
    periods = {
        "agentloop.resume_stalled_chats": resume_stalled_chats,
        "agentloop.poll_batches": poll_batches,
        "agentloop.delete_idle_chats": delete_idle_chats,
        "agentloop.embed_past_messages": embed_past_messages,
    }
    schedule: dict[str, dict[str, Any]] = {}
    for task, period in periods.items():
        if period is None and task != "agentloop.resume_stalled_chats":
            continue
        argument = task.removeprefix("agentloop.")
        if isinstance(period, bool) or not isinstance(period, int | float) or not period > 0:
            raise ConfigurationError(
                f"beat_schedule({argument}=...) takes a number of seconds above 0"
                + (" or None" if task != "agentloop.resume_stalled_chats" else "")
                + f", not {period!r}"
            )
        schedule[PERIODIC_TASKS[task]] = {"task": task, "schedule": float(period)}
    return schedule


class ResendAfterReconnect(bootsteps.StartStopStep):
    """A consumer bootstep: on each reconnection to the broker, re-send the jobs of chats
    queued before the connection was lost (:func:`agentloop.runners.sweeper.resend_queued`)."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        #: when the connection was lost (monotonic: the cutoff is taken on the database's
        #: clock, this many seconds before its now).
        self.lost_at: float | None = None

    def start(self, parent: Any) -> None:
        lost_at, self.lost_at = self.lost_at, None
        if lost_at is None:
            return  # the first connection: nothing was lost that this worker knows of
        try:
            sent = resend_queued(time.monotonic() - lost_at)
        except Exception:
            logger.exception("Re-sending the jobs of queued chats after a reconnection failed")
        else:
            if sent:
                logger.warning(
                    "Reconnected to the broker: re-sent the jobs of %d queued chat(s)", len(sent)
                )
        finally:
            connections.close_all()  # the consumer's thread keeps no connection open

    def stop(self, parent: Any) -> None:
        # Called when the connection is lost (the consumer restarts) and at shutdown; the
        # first loss counts (a retry that fails again calls this too).
        if self.lost_at is None:
            self.lost_at = time.monotonic()


@worker_init.connect
def _add_reconnect_step(sender: Any, **kwargs: Any) -> None:
    steps = sender.app.steps["consumer"]
    if ResendAfterReconnect not in steps:
        steps.add(ResendAfterReconnect)


@worker_init.connect
def _say_if_connections_starve(sender: Any, **kwargs: Any) -> None:
    # The worker's pool is known here (``-P threads`` on its command line), not to
    # ``manage.py check`` (agentloop.E020 sees only CELERY_WORKER_POOL).
    problem = starving_reuse(sender.pool_cls, sender.app.conf)
    if problem:
        logger.error(
            "%s Remove CELERY_DB_REUSE_MAX from this worker's settings (agentloop.E020).", problem
        )


@shared_task(
    name="agentloop.run_eval_case", acks_late=True, reject_on_worker_lost=True, ignore_result=True
)
def run_eval_case(case_id: Any) -> str:
    """Replay and score one eval case; a case another job holds is sent again for when its
    lease ends (a job whose worker died comes back that way). Returns what it did."""
    # Function-local: the runs import the models; Celery may load tasks before apps are ready.
    from .evals.running import run_case, send_jobs

    outcome = run_case(case_id)
    if outcome.retry_in is not None:
        send_jobs([case_id], countdown=outcome.retry_in)
    return outcome.action

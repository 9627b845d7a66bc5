"""The Celery runner: each job is a message for the ``agentloop.step_chat`` task.

Jobs are sent by task name through Celery's current app (the project's, once its package
imports it), so sending needs no import of :mod:`agentloop.tasks`; a worker runs them once
it has loaded that module (``app.autodiscover_tasks()``).
"""

from __future__ import annotations

from celery import current_app

from .runner import Job, Runner

__all__ = ["BROKER_MARK", "STEP_TASK", "CeleryRunner"]

#: the registered name of the step task (``agentloop.tasks.step_chat``).
STEP_TASK = "agentloop.step_chat"
#: a key the sweeper keeps in a Redis broker: when it is gone, so is every job the broker
#: held (a restart without persistence, a flush).
BROKER_MARK = "agentloop:broker-mark"


class CeleryRunner(Runner):
    """Sends each job to Celery's broker; a countdown is Celery's own."""

    name = "celery"

    def send(self, job: Job) -> None:
        # A signature applies the registered task's own options (and CELERY_TASK_ALWAYS_EAGER),
        # or sends by name when this process has not loaded the task.
        signature = current_app.signature(STEP_TASK, args=job.args)
        signature.apply_async(countdown=job.countdown, **_reprs(job))

    def lost_jobs(self) -> bool:
        """On a Redis broker: whether the sweeper's mark is gone (set again here). A worker
        that reconnects to a restarted broker re-sends what it lost (``agentloop.tasks``);
        one started afresh, or one that died, doesn't: the sweeper finds out by this."""
        with current_app.connection_for_write() as connection:
            if getattr(connection.transport, "driver_type", "") != "redis":
                return False  # RabbitMQ keeps its durable queues across restarts
            client = connection.default_channel.client
            return bool(client.set(BROKER_MARK, "1", nx=True))

    def send_many(self, jobs: list[Job]) -> None:
        # One producer (one broker connection, taken from the pool once) for the batch.
        with current_app.producer_or_acquire() as producer:
            for job in jobs:
                signature = current_app.signature(STEP_TASK, args=job.args)
                signature.apply_async(countdown=job.countdown, producer=producer, **_reprs(job))


def _reprs(job: Job) -> dict[str, str]:
    # The message's shown arguments, written here: a job's are three short values, and
    # Celery's safe repr (made for arguments of any size and depth) costs more than repr().
    return {"argsrepr": repr(job.args), "kwargsrepr": "{}"}

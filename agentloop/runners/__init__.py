"""Background runners: the seam that sends one step of a chat per job, and the one job body.

``enqueue(chat_id)`` sends a step once the current transaction commits, through the runner
``AGENTLOOP["RUNNER"]`` chooses (Celery, django.tasks, or this process's threads; see
docs/background.md). Every runner's worker runs :func:`run_job`, which takes the chat's
lease, runs one step and sends what comes next, so a conversation advances one step per job
until it is complete, waiting, cancelled, stopped or failed.
"""

from __future__ import annotations

from .embedded import EmbeddedRunner, wait_for_embedded_jobs
from .enqueueing import enqueue, enqueue_many, mark_unsent, runner, runner_name
from .job import StepOutcome, run_job, run_step
from .runner import Job, Runner

__all__ = [
    "EmbeddedRunner",
    "Job",
    "Runner",
    "StepOutcome",
    "enqueue",
    "enqueue_many",
    "mark_unsent",
    "run_job",
    "run_step",
    "runner",
    "runner_name",
    "wait_for_embedded_jobs",
]

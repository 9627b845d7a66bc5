"""The loop's job as a Django Tasks task (``django.tasks``, Django 6 and later).

With ``AGENTLOOP["RUNNER"] = "django_tasks"`` each step is enqueued on the project's own
tasks backend (``settings.TASKS``), with the same lease and the same job body as the Celery
task. Imported only when that runner is chosen: defining a task needs Django 6.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.tasks import task, task_backends
from django.utils import timezone

from ._runner import run_step

__all__ = ["enqueue_step", "step_chat"]


@task
def step_chat(chat_id: Any, model_label: str = "agentloop.Chat", attempt: int = 0) -> str:
    """Run one step of a chat and enqueue the next; returns what happened. ``attempt``
    counts the job's tries after the database could not be reached."""
    # Function-local: background imports this module when it sends a job (a cycle otherwise).
    from .background import follow_up

    outcome = run_step(chat_id, model_label, attempt)
    follow_up(outcome, chat_id, model_label, attempt)
    return outcome.action


def enqueue_step(chat_id: Any, model_label: str, countdown: float | None, attempt: int = 0) -> None:
    """Enqueue a step; a delay is kept where the backend can defer tasks."""
    job = step_chat
    if countdown and task_backends[job.backend].supports_defer:
        job = job.using(run_after=timezone.now() + timedelta(seconds=countdown))
    job.enqueue(chat_id, model_label, attempt)

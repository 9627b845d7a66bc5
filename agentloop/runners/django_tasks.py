"""The django.tasks runner (Django 6 and later): each job is a task on ``settings.TASKS``.

With ``AGENTLOOP["RUNNER"] = "django_tasks"`` each step is enqueued on the project's own
tasks backend, with the same lease and the same job body as the Celery task. Imported only
when that runner is chosen: defining a task needs Django 6.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.tasks import task, task_backends
from django.utils import timezone

from .job import run_job
from .runner import Job, Runner

__all__ = ["DjangoTasksRunner", "step_chat"]


@task
def step_chat(chat_id: Any, model_label: str = "agentloop.Chat", attempt: int = 0) -> str:
    """Run one step of a chat and send the next; returns what happened. ``attempt``
    counts the job's tries after the database could not be reached."""
    return run_job(Job(chat_id, model_label, attempt=attempt)).action


class DjangoTasksRunner(Runner):
    """Enqueues each job on the step task's backend; a countdown where it can defer."""

    name = "django_tasks"

    @property
    def can_defer(self) -> bool:
        return bool(task_backends[step_chat.backend].supports_defer)

    def send(self, job: Job) -> None:
        queued = step_chat
        if job.countdown:
            queued = queued.using(run_after=timezone.now() + timedelta(seconds=job.countdown))
        queued.enqueue(*job.args)

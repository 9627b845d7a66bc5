"""The runner seam: what a background job is, and the one method a runner has.

A runner sends :class:`Job` s (one step of one chat each) to wherever they run: Celery's
broker, Django's tasks backend, or this process's threads. It does not run them itself; the
job body (:func:`agentloop.runners.job.run_job`) is one function that every runner's worker
calls. A project can bring its own runner: subclass :class:`Runner` and name its import path
in ``AGENTLOOP["RUNNER"]``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

__all__ = ["Job", "Runner"]


@dataclass(frozen=True)
class Job:
    """One step of one chat, to run in the background."""

    chat_id: Any
    model_label: str = "agentloop.Chat"
    #: seconds to wait before the step runs (a retry's backoff); None: at once.
    countdown: float | None = None
    #: tries of this job after the database could not be reached (the chat row can't count
    #: those: it was out of reach); after ``STEP_RETRIES`` the sweeper takes over.
    attempt: int = 0

    @property
    def args(self) -> tuple[Any, str, int]:
        """The job as a task's arguments (what a Celery or django.tasks message carries)."""
        return (self.chat_id, self.model_label, self.attempt)


class Runner(ABC):
    """Sends background jobs. One instance per process, made on first use."""

    #: the name ``AGENTLOOP["RUNNER"]`` chooses it by.
    name: ClassVar[str] = ""

    @property
    def can_defer(self) -> bool:
        """True when the runner honours a job's ``countdown``. A job with a countdown for a
        runner that can't defer is sent when its countdown ends, from a timer in the sending
        process (if that process dies first, the sweeper sends it)."""
        return True

    @abstractmethod
    def send(self, job: Job) -> None:
        """Hand ``job`` over to be run; raise if it could not be sent (the caller then marks
        the chat for the sweeper)."""

    def lost_jobs(self) -> bool:
        """Whether the jobs sent so far may have been lost since the sweeper last asked (a
        broker that restarted without its data): the sweeper then sends the jobs of every
        queued chat again. False unless the runner can tell (Celery on a Redis broker)."""
        return False

    def send_many(self, jobs: list[Job]) -> None:
        """Hand many jobs over (a set-based verb's batch); raise if some could not be sent
        (the caller then marks them all for the sweeper). One ``send`` each unless the runner
        can do better (Celery: one broker connection for the batch)."""
        for job in jobs:
            self.send(job)

"""The embedded runner: jobs run on a small thread pool in this process (no broker).

Fine for ``runserver``, demos and tests; not for production (a system check says so when
``DEBUG`` is off): jobs queued here are lost with the process, and the sweeper sends them
again from the database.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

from django.db import close_old_connections, connections

from ..conf import agentloop_settings
from .enqueueing import runner
from .job import run_job
from .runner import Job, Runner

__all__ = ["EmbeddedRunner", "wait_for_embedded_jobs"]

logger = logging.getLogger(__name__)


class EmbeddedRunner(Runner):
    """Runs each job on a thread of a pool of ``EMBEDDED_WORKERS``; a countdown on a timer."""

    name = "embedded"

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(
            max_workers=agentloop_settings.EMBEDDED_WORKERS, thread_name_prefix="agentloop-job"
        )
        self.pending = 0
        self.idle = threading.Condition()

    def send(self, job: Job) -> None:
        with self.idle:
            self.pending += 1
        if job.countdown:
            timer = threading.Timer(job.countdown, self._start, (job,))
            timer.daemon = True
            timer.start()
        else:
            self._start(job)

    def _start(self, job: Job) -> None:
        self.pool.submit(self._run, job)

    def _run(self, job: Job) -> None:
        close_old_connections()
        try:
            run_job(job)
        except Exception:
            logger.exception("Background step of chat %s failed", job.chat_id)
        finally:
            connections.close_all()
            with self.idle:
                self.pending -= 1
                self.idle.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until no job is left; True if idle (False: ``timeout`` ran out)."""
        with self.idle:
            return self.idle.wait_for(lambda: self.pending == 0, timeout)


def wait_for_embedded_jobs(timeout: float | None = None) -> bool:
    """Block until the embedded runner has no jobs left (demos and tests); True if idle.

    True at once when another runner is chosen: no job runs in this process then."""
    chosen = runner()
    return chosen.wait(timeout) if isinstance(chosen, EmbeddedRunner) else True

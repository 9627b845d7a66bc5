"""The Celery task of evals: one case per job (registered by ``agentloop.tasks``)."""

from __future__ import annotations

from typing import Any

from celery import shared_task

__all__ = ["run_eval_case"]


@shared_task(
    name="agentloop.run_eval_case", acks_late=True, reject_on_worker_lost=True, ignore_result=True
)
def run_eval_case(case_id: Any) -> str:
    """Replay and score one eval case; a case another job holds is sent again for when its
    lease ends (a job whose worker died comes back that way). Returns what it did."""
    # Function-local: the runs import the models; Celery may load tasks before apps are ready.
    from .runs import run_case, send_jobs

    outcome = run_case(case_id)
    if outcome.retry_in is not None:
        send_jobs([case_id], countdown=outcome.retry_in)
    return outcome.action

"""Celery tasks. Thin: a primary key in, the logic in :mod:`agentloop._runner`."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from ._recovery import resume_stalled
from ._runner import run_step
from .background import follow_up

__all__ = ["poll_batches", "resume_stalled_chats", "step_chat"]


@shared_task(
    name="agentloop.step_chat",
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
def step_chat(chat_id: Any, model_label: str = "agentloop.Chat", attempt: int = 0) -> str:
    """Run one step of a chat and enqueue the next; returns what happened. ``attempt``
    counts the job's tries after the database could not be reached."""
    # A job that could not reach the database is sent again (counted) before this one is
    # acknowledged: never done while its chat still waits.
    outcome = run_step(chat_id, model_label, attempt)
    follow_up(outcome, chat_id, model_label, attempt)
    return outcome.action


@shared_task(name="agentloop.resume_stalled_chats", ignore_result=True)
def resume_stalled_chats() -> int:
    """Re-enqueue chats whose worker died (expired lease) or whose job was lost."""
    return len(resume_stalled())


@shared_task(name="agentloop.poll_batches", ignore_result=True)
def poll_batches() -> int:
    """Refresh open batches; append the answers of ended ones to their chats (run it every
    minute or so with celery beat). Returns how many batches were polled."""
    # Function-local: batches import the models; Celery may load tasks before apps are ready.
    from .batches import poll

    return len(poll())

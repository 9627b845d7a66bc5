"""Choosing the runner and sending jobs to it.

``enqueue(chat_id)`` sends one step of a chat once the current transaction commits, through
the runner ``AGENTLOOP["RUNNER"]`` names: ``"celery"``, ``"django_tasks"``, ``"embedded"``
(in-process threads), an import path of a :class:`~agentloop.runners.runner.Runner` subclass,
or ``"auto"`` (Celery when its app has a broker, else embedded). A job the runner can't take
(a broker down or restarting) marks its chat for the sweeper instead of failing the caller.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from datetime import timedelta
from typing import Any

from django.apps import apps
from django.db import transaction
from django.db.models.functions import Now

from ..conf import agentloop_settings
from ..exceptions import ConfigurationError
from ..import_paths import load_by_path
from .runner import Job, Runner

__all__ = [
    "BUILTINS",
    "enqueue",
    "enqueue_many",
    "mark_unsent",
    "runner",
    "runner_name",
    "send",
    "send_many",
]

logger = logging.getLogger(__name__)

#: the runners ``AGENTLOOP["RUNNER"]`` names, by class path (imported on first use: each
#: brings an optional dependency, and each imports the job body, which sends through here).
BUILTINS: dict[str, str] = {
    "celery": "agentloop.runners.celery.CeleryRunner",
    "django_tasks": "agentloop.runners.django_tasks.DjangoTasksRunner",
    "embedded": "agentloop.runners.embedded.EmbeddedRunner",
}

_runners: dict[str, Runner] = {}
_lock = threading.Lock()


def runner_name() -> str:
    """The runner of background steps: a name of :data:`BUILTINS` or an import path, from
    ``AGENTLOOP["RUNNER"]`` ("auto": Celery when its app has a broker, else embedded)."""
    choice = str(agentloop_settings.RUNNER)
    if choice == "auto":
        choice = str(agentloop_settings.BACKGROUND)  # the older name of the setting
    if choice != "auto":
        return choice
    try:
        # Function-local: Celery is an optional dependency (the "celery" extra).
        from celery import current_app
    except ImportError:
        return "embedded"
    return "celery" if current_app.conf.broker_url else "embedded"


def runner() -> Runner:
    """The chosen runner (one instance per process and name)."""
    name = runner_name()
    with _lock:
        found = _runners.get(name)
        if found is None:
            runner_class = load_by_path(BUILTINS.get(name, name))
            if not (isinstance(runner_class, type) and issubclass(runner_class, Runner)):
                raise ConfigurationError(
                    f'AGENTLOOP["RUNNER"] = {name!r} is not a runner: give "celery", '
                    '"django_tasks", "embedded" or the import path of a Runner subclass.'
                )
            found = _runners[name] = runner_class()
        return found


def enqueue(
    chat_id: Any, model_label: str = "agentloop.Chat", *, countdown: float | None = None,
    using: str | None = None,
) -> None:  # fmt: skip
    """Send a step of the chat once the current transaction (on ``using``) commits."""
    job = Job(chat_id, model_label, countdown=countdown)
    transaction.on_commit(lambda: send(job), using=using)


def enqueue_many(
    chat_ids: list[Any], model_label: str = "agentloop.Chat", *, using: str | None = None
) -> None:
    """Send a step of each of the chats once the current transaction (on ``using``) commits
    (a set-based verb's batch: ``agentloop.models.bulk``)."""
    jobs = [Job(chat_id, model_label) for chat_id in chat_ids]
    if jobs:
        transaction.on_commit(lambda: send_many(jobs), using=using)


def send_many(jobs: list[Job]) -> None:
    """Send ``jobs`` now; if the runner can't take them, mark their queued chats stalled at
    once (one UPDATE), as ``send`` does for one: the sweeper sends them."""
    try:
        runner().send_many(jobs)
    except Exception:
        logger.exception("%d jobs could not all be sent; the sweeper sends them again", len(jobs))
        by_model: dict[str, list[Any]] = {}
        for job in jobs:
            by_model.setdefault(job.model_label, []).append(job.chat_id)
        for model_label, chat_ids in by_model.items():
            _mark_unsent(chat_ids, model_label)


def send(job: Job) -> None:
    """Send ``job`` now; if the runner can't take it (broker down, restarting), mark the
    queued chat stalled at once instead of failing the caller: the next sweep, or a worker
    reconnecting to the broker, sends it (no wait for ``STALE_QUEUED_SECONDS``)."""
    try:
        chosen = runner()
        if job.countdown and not chosen.can_defer:
            later = threading.Timer(job.countdown, send, (replace(job, countdown=None),))
            later.daemon = True
            later.start()
            return
        chosen.send(job)
    except Exception:
        logger.exception(
            "Chat %s: its next job could not be sent; the sweeper sends it again", job.chat_id
        )
        mark_unsent(job.chat_id, job.model_label)


def mark_unsent(chat_id: Any, model_label: str = "agentloop.Chat") -> bool:
    """Date a queued chat back by ``STALE_QUEUED_SECONDS``, so the sweeper's next run finds
    it stalled once no one holds it (one UPDATE); False when the chat isn't queued any more."""
    return bool(_mark_unsent([chat_id], model_label))


def _mark_unsent(chat_ids: list[Any], model_label: str) -> int:
    chat_model: Any = apps.get_model(model_label)
    # The database's clock, as the sweeper's query reads it.
    stale = Now() - timedelta(seconds=agentloop_settings.STALE_QUEUED_SECONDS + 1)
    # Held or not: the sweeper takes a chat only once its lease is free or expired, and a
    # holder that releases it queued sends its next job itself (dating it anew).
    unsent = chat_model._default_manager.filter(pk__in=chat_ids, state="queued")
    try:
        return int(unsent.update(updated_at=stale))
    except Exception:
        # The database is down too: the sweeper finds the chats after STALE_QUEUED_SECONDS.
        logger.exception("Chats %s: could not mark their lost jobs", chat_ids[:10])
        return 0

"""The sweeper: finding chats that stalled (a worker died, a job was lost) and sending them on."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.apps import apps
from django.db.models import Q
from django.db.models.functions import Now

from ..budgets.counters import release_expired
from ..budgets.slots import due, waiting_subjects
from ..conf import agentloop_settings
from .approval_timeouts import deny_timed_out_approvals
from .enqueueing import enqueue, runner

__all__ = ["free_chat", "resend_queued", "resume_stalled", "stalled_chats"]

logger = logging.getLogger(__name__)


def stalled_chats(model_label: str = "agentloop.Chat") -> Any:
    """Running chats whose lease expired, and queued chats nobody picked up for a while (with
    no lease, or one that expired: a process that claimed it in-process died holding it)."""
    chat_model: Any = apps.get_model(model_label)
    # The database's clock, as for every lease decision: a sweeper on a host whose clock is
    # ahead must not call a live lease expired.
    now = Now()
    stale = now - timedelta(seconds=agentloop_settings.STALE_QUEUED_SECONDS)
    # Both arms match the partial index on (state, updated_at) of chats in flight.
    return chat_model._default_manager.filter(
        Q(state="running", lease_expires_at__lt=now)
        | (
            Q(state="queued", updated_at__lt=stale)
            & (Q(lease_token="") | Q(lease_expires_at__lt=now))
            & (Q(retry_at__isnull=True) | Q(retry_at__lt=now))
        )
    )


def resume_stalled(model_label: str = "agentloop.Chat") -> list[Any]:
    """Deny approvals past ``APPROVAL_TIMEOUT`` (their background chats go on), give back
    the budget reservations of model calls whose processes died, send again the jobs of the
    queued chats if the broker lost its jobs since the last run, send the chats in line for
    a chats-in-flight place whose turn came (should the chat that freed it have died before
    sending them), then enqueue a step for each stalled chat; returns the primary keys of
    the chats whose jobs were sent again and of the stalled chats."""
    deny_timed_out_approvals(model_label)
    release_expired()
    resent = _resend_if_jobs_lost(model_label)
    for chat_label, chat_key in due(waiting_subjects()):
        enqueue(chat_key, chat_label)
    ids = list(stalled_chats(model_label).values_list("pk", flat=True))
    for chat_id in ids:
        enqueue(chat_id, model_label)
    return [*resent, *ids]


def _resend_if_jobs_lost(model_label: str) -> list[Any]:
    """When the runner says its queue lost the jobs sent to it (a Redis broker restarted
    without its data), send every queued chat's job again (``resend_queued``), whatever the
    workers saw: one that reconnected re-sent them itself, but one started afresh knows of
    nothing lost. A job that comes twice is harmless (its copy ends 'busy' or 'skipped')."""
    try:
        lost = runner().lost_jobs()
    except Exception:
        # The broker is out of reach: the next run asks again.
        logger.warning("Could not ask the broker whether it kept its jobs", exc_info=True)
        return []
    if not lost:
        return []
    sent = resend_queued(0.0, model_label)
    if sent:
        logger.warning(
            "The broker lost its jobs (restarted without its data): re-sent the jobs of %d "
            "queued chat(s)",
            len(sent),
        )
    return sent


def free_chat(chat_id: Any, model_label: str = "agentloop.Chat") -> str | None:
    """Take the lease off a chat by hand, whoever holds it, and send a running chat on
    (``manage.py agentloop unlock``). Returns the holder it had ("" when unknown), or None
    when the chat held no lease.

    For a holder that is certainly gone on another host, before its lease runs out. A holder
    that still runs writes nothing more (its writes are conditional on its lease), but a tool
    it is running finishes, and its result is dropped: the call is then answered as
    interrupted, or run again if its tool is idempotent.
    """
    chat_model: Any = apps.get_model(model_label)
    rows = chat_model._default_manager.filter(pk=chat_id)
    found = rows.values_list("lease_token", "lease_holder", "state").first()
    if found is None or not found[0]:
        return None
    token, holder, state = found
    changes: dict[str, Any] = {"lease_token": "", "lease_expires_at": None, "updated_at": Now()}
    if state == "running":
        changes["state"] = "queued"
    if not rows.filter(lease_token=token).update(**changes):
        return free_chat(chat_id, model_label)  # released or taken meanwhile: look again
    if state == "running":
        enqueue(chat_id, model_label)
    return str(holder)


def resend_queued(lost_for: float, model_label: str = "agentloop.Chat") -> list[Any]:
    """Send again the job of every queued chat last queued before the broker connection was
    lost, ``lost_for`` seconds ago (a broker restart may have lost it: a Redis without
    persistence keeps no queue); returns their keys. Times are the database's clock's.

    A chat is re-sent by one caller only: each is first dated now by an UPDATE conditional on
    the date read, so of several workers reconnecting at once one sends it. A job that comes
    twice anyway is harmless: the second finds the chat held, or moved on. A chat waiting
    out a retry gets its job for the time it was due.
    """
    chat_model: Any = apps.get_model(model_label)
    manager = chat_model._default_manager
    now = Now()
    # The queued arm of the sweeper's query (the same partial index), with another cutoff.
    lost = (
        manager.filter(
            Q(state="queued", updated_at__lt=now - timedelta(seconds=lost_for))
            & (Q(lease_token="") | Q(lease_expires_at__lt=now))
        )
        .annotate(database_now=now)
        .values_list("pk", "updated_at", "retry_at", "database_now")
    )
    sent = []
    for chat_id, updated_at, retry_at, database_now in lost:
        if not manager.filter(pk=chat_id, state="queued", updated_at=updated_at).update(
            updated_at=now
        ):
            continue  # another worker re-sent it, or it moved on
        due = (retry_at - database_now).total_seconds() if retry_at else 0.0
        enqueue(chat_id, model_label, countdown=due if due > 0 else None)
        sent.append(chat_id)
    return sent

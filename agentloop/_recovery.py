"""Finding chats that stalled (a worker died, a job was lost) and sending them on."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.apps import apps
from django.db.models import Q
from django.db.models.functions import Now

from ._approval_timeouts import deny_timed_out_approvals
from .background import enqueue
from .conf import agentloop_settings

__all__ = ["free_chat", "resume_stalled", "stalled_chats"]


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
    """Deny approvals past ``APPROVAL_TIMEOUT`` (their background chats go on), then
    enqueue a step for each stalled chat; returns the stalled chats' primary keys."""
    deny_timed_out_approvals(model_label)
    ids = list(stalled_chats(model_label).values_list("pk", flat=True))
    for chat_id in ids:
        enqueue(chat_id, model_label)
    return ids


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

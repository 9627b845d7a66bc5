"""Retention: ``delete_idle_chats(days)`` deletes the chats nobody has touched for ``days``.

A chat is idle when its row and its latest message are both older than the cutoff and no
run holds it or is queued for it. Only whole conversations go: a top-level chat with all its
subagent chats, and only when every one of them is idle. Usage rows stay for accounting,
with their owner; they lose the link to the chat (``AGENTLOOP["RETENTION_DAYS"]``, run every
day by ``agentloop.delete_idle_chats`` or ``manage.py agentloop retention``).

Memories past their ``expires_at`` go at every run too (``delete_expired_memories``), with or
without a retention period: an expiry is a date someone chose.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import OuterRef, Q, Subquery
from django.db.models.functions import Now
from django.utils import timezone

from ..conf import agentloop_settings
from ..models.memories import Memory
from .deletion import ChatModels, Deleted, delete_chats

__all__ = [
    "RetentionReport",
    "delete_expired_memories",
    "delete_idle_chats",
    "expired_memories",
    "idle_chats",
]

#: chats looked at, and deleted, per transaction.
BATCH = 200


@dataclass
class RetentionReport:
    """What ``delete_idle_chats`` did."""

    days: int | None
    cutoff: datetime | None
    deleted: Deleted = field(default_factory=Deleted)
    #: idle chats kept because one of their subagent chats was active.
    kept_for_subagents: int = 0
    #: memories deleted because their ``expires_at`` had passed.
    memories_expired: int = 0

    def __str__(self) -> str:
        expired = f"Deleted {self.memories_expired} expired memories."
        if self.days is None:
            return (
                "No retention of chats: AGENTLOOP['RETENTION_DAYS'] is None and no --days "
                f"was given. {expired}"
            )
        gone = self.deleted
        return (
            f"Deleted {gone.chats} chats idle for more than {self.days} days (before "
            f"{self.cutoff:%Y-%m-%d %H:%M %Z}): {gone.messages} messages, {gone.tool_calls} "
            f"tool calls; usage rows kept. {self.kept_for_subagents} kept for an active "
            f"subagent chat. {expired}"
        )


class _IdleFilter:
    """Chats idle since ``cutoff``: row and latest message older, no run holding or queued."""

    def __init__(self, latest: Any, cutoff: datetime) -> None:
        self.latest = latest
        self.cutoff = cutoff

    def apply(self, queryset: Any) -> Any:
        return queryset.annotate(latest_message=Subquery(self.latest)).filter(
            Q(created_at__lt=self.cutoff, updated_at__lt=self.cutoff),
            ~Q(state__in=["queued", "running"]),
            Q(lease_token=""),
            Q(latest_message__lt=self.cutoff) | Q(latest_message__isnull=True),
        )


def idle_chats(days: int, *, chat_model: Any = None, using: str = "default") -> Any:
    """The top-level chats idle for more than ``days`` days, as a queryset (their subagent
    chats are not looked at here: ``delete_idle_chats`` checks them too)."""
    models = ChatModels.of(chat_model)
    idle = _IdleFilter(_latest(models), timezone.now() - timedelta(days=days))
    return idle.apply(_top_level(models, using))


def _top_level(models: ChatModels, using: str) -> Any:
    chats = models.chat._default_manager.using(using).all()
    return chats.filter(parent__isnull=True) if models.has_children else chats


def _latest(models: ChatModels) -> Any:
    return (
        models.message._default_manager.filter(chat_id=OuterRef("pk"))
        .order_by("-id")
        .values("created_at")[:1]
    )


def delete_idle_chats(
    days: int | None = None, *, chat_model: Any = None, using: str = "default"
) -> RetentionReport:
    """Delete the chats idle for more than ``days`` days (default
    ``AGENTLOOP["RETENTION_DAYS"]``; None: nothing is deleted), a batch per transaction.

    Each batch is checked again under the rows' lock, so a chat someone writes to meanwhile
    stays. Usage rows are kept, with their owner. Memories past their expiry go first,
    whatever ``days`` is (:func:`delete_expired_memories`).
    """
    days = agentloop_settings.RETENTION_DAYS if days is None else days
    if days is not None and (isinstance(days, bool) or not isinstance(days, int) or days < 1):
        raise ValueError(f"days must be a whole number of days of at least 1, not {days!r}")
    expired = delete_expired_memories(using=using)
    if days is None:
        return RetentionReport(days=None, cutoff=None, memories_expired=expired)
    models = ChatModels.of(chat_model)
    cutoff = timezone.now() - timedelta(days=days)
    report = RetentionReport(days=days, cutoff=cutoff, memories_expired=expired)
    idle = _IdleFilter(_latest(models), cutoff)
    top = _top_level(models, using)
    after: Any = None
    while True:
        page = top if after is None else top.filter(pk__gt=after)
        batch = list(idle.apply(page).order_by("pk").values_list("pk", flat=True)[:BATCH])
        if not batch:
            return report
        after = batch[-1]
        keep = _with_active_subagents(models, batch, idle, using)
        report.kept_for_subagents += len(keep)
        chosen = [pk for pk in batch if pk not in keep]
        if chosen:
            deleted, _gone = delete_chats(
                models, chosen, usage="keep", using=using, still=idle.apply
            )
            report.deleted.add(deleted)


def _with_active_subagents(
    models: ChatModels, pks: list[Any], idle: _IdleFilter, using: str
) -> set[Any]:
    """The chats of ``pks`` with a subagent chat (at any depth) that is not idle (one query
    per depth, and one for the activity of them all)."""
    if not models.has_children:
        return set()
    manager = models.chat._default_manager.using(using)
    root_of: dict[Any, Any] = {}
    level = {pk: pk for pk in pks}
    while level:
        found = manager.filter(parent_id__in=list(level)).values_list("pk", "parent_id")
        level = {pk: level[parent] for pk, parent in found if pk not in root_of}
        root_of.update(level)
    if not root_of:
        return set()
    active = manager.filter(pk__in=list(root_of)).exclude(
        pk__in=idle.apply(manager.filter(pk__in=list(root_of))).values("pk")
    )
    return {root_of[pk] for pk in active.values_list("pk", flat=True)}


def expired_memories(*, using: str = "default") -> Any:
    """The memories whose ``expires_at`` has passed (by the database's clock), as a queryset."""
    return Memory._default_manager.using(using).filter(expires_at__lte=Now())


def delete_expired_memories(*, using: str = "default") -> int:
    """Delete the memories past their ``expires_at``, a batch of primary keys per statement
    (no long lock on a big table); returns how many went."""
    deleted = 0
    while True:
        expired = expired_memories(using=using).order_by("pk")
        batch = list(expired.values_list("pk", flat=True)[:BATCH])
        if not batch:
            return deleted
        # The expiry is checked again in the DELETE: one extended meanwhile stays.
        _total, counts = expired_memories(using=using).filter(pk__in=batch).delete()
        deleted += counts.get(Memory._meta.label, 0)

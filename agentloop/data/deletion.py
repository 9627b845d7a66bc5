"""What the data functions work on: a chat model's related models, an owner's chats and a
chat's subagent chats, and deleting a set of chats with nothing left behind.

Deleting goes through Django's collector (``QuerySet.delete()``), so a project's own rows
that point at a chat with ``on_delete=CASCADE`` go too, and the receivers of ``post_delete``
run (agentloop's deletes each chat's Redis event stream). After the commit the chats' event
streams are replaced by short-lived tombstones (``EventBackend.erase``): an event a worker
still had queued can't bring a stream back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.apps import apps
from django.db import transaction

from ..agents.subagents import has_children
from ..conf import agentloop_settings, get_chat_model
from ..live_events import chat_key, erase_events

__all__ = [
    "ChatModels",
    "Deleted",
    "delete_chats",
    "forget_streams",
    "owner_pk",
    "subagent_chats",
]


@dataclass(frozen=True)
class ChatModels:
    """A chat model and the models of its rows (``messages``, ``tool_calls``, ``usage_records``)."""

    chat: Any
    message: Any
    tool_call: Any
    usage: Any

    @classmethod
    def of(cls, chat_model: Any = None) -> ChatModels:
        """The models of ``chat_model`` (default ``AGENTLOOP["CHAT_MODEL"]``)."""
        model = chat_model or get_chat_model()
        meta: Any = model._meta
        return cls(
            chat=model,
            message=meta.get_field("messages").related_model,
            tool_call=meta.get_field("tool_calls").related_model,
            usage=meta.get_field("usage_records").related_model,
        )

    @property
    def has_children(self) -> bool:
        return has_children(self.chat)


def owner_pk(owner: Any) -> Any:
    """The primary key of ``owner`` (a user, or already a primary key)."""
    if owner is None:
        raise ValueError("owner must be a user or a user's primary key, not None")
    return getattr(owner, "pk", owner)


def subagent_chats(models: ChatModels, pks: list[Any], using: str = "default") -> list[Any]:
    """The subagent chats of the chats ``pks``, at every depth (one query per depth)."""
    if not models.has_children:
        return []
    found: list[Any] = []
    seen = set(pks)
    level = list(pks)
    while level:
        level = [
            pk
            for pk in models.chat._default_manager.using(using)
            .filter(parent_id__in=level)
            .values_list("pk", flat=True)
            if pk not in seen
        ]
        seen.update(level)
        found += level
    return found


@dataclass
class Deleted:
    """What one :func:`delete_chats` removed, by kind of row."""

    chats: int = 0
    messages: int = 0
    tool_calls: int = 0
    usage_anonymised: int = 0
    usage_deleted: int = 0
    #: rows of other models (a project's own, admin log entries) deleted with the chats.
    other: int = 0

    def add(self, other: Deleted) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


def delete_chats(
    models: ChatModels,
    pks: list[Any],
    *,
    usage: str,
    using: str = "default",
    still: Callable[[Any], Any] | None = None,
) -> tuple[Deleted, list[Any]]:
    """Delete the chats ``pks`` and their subagent chats in one transaction; returns what went
    and the primary keys of every chat deleted.

    The chat rows are locked first (``SELECT ... FOR UPDATE``): a step still running one of
    them waits at its next write, then finds the row gone and writes nothing (its lease
    statement matches no row; a row it inserted fails the foreign key at its commit).
    ``usage`` says what becomes of the chats' usage rows: ``"keep"`` (they lose the link to
    the chat and message, as the foreign keys say), ``"anonymise"`` (the owner and the error
    text go too) or ``"delete"``. ``still`` (a queryset filter) re-checks, under the lock,
    that each chat may still go (retention: still idle); the chats it drops are left alone.
    """
    deleted = Deleted()
    manager = models.chat._default_manager.using(using)
    with transaction.atomic(using=using):
        locked = manager.filter(pk__in=pks)
        if still is not None:
            locked = still(locked)
        tops = list(locked.select_for_update().order_by("pk").values_list("pk", flat=True))
        if not tops:
            return deleted, []
        children = subagent_chats(models, tops, using)
        if children:
            list(manager.filter(pk__in=children).select_for_update().values_list("pk"))
        family = tops + children
        rows = models.usage._default_manager.using(using).filter(chat_id__in=family)
        if usage == "delete":
            deleted.usage_deleted = rows.delete()[0]
        elif usage == "anonymise":
            deleted.usage_anonymised = rows.update(owner=None, chat=None, message=None, error="")
        deleted.other += _delete_log_entries(models.chat, family, using)
        _total, by_model = manager.filter(pk__in=tops).delete()
    deleted.chats = by_model.pop(models.chat._meta.label, 0)
    deleted.messages = by_model.pop(models.message._meta.label, 0)
    deleted.tool_calls = by_model.pop(models.tool_call._meta.label, 0)
    deleted.other += sum(by_model.values())
    # After the commit (at once outside a transaction): a rolled back delete keeps its streams.
    transaction.on_commit(lambda: forget_streams(models.chat, family), using=using)
    return deleted, family


def forget_streams(chat_model: Any, pks: list[Any]) -> None:
    """Replace the event streams of the deleted chats ``pks`` by tombstones (see the module
    docstring); they expire a while after any step of those chats could still publish."""
    keys = [chat_key(_Named(chat_model, pk)) for pk in pks]
    ttl = int(2 * agentloop_settings.LEASE_SECONDS) + 60
    erase_events(keys, ttl)


class _Named:
    """Enough of a chat for ``chat_key`` (its model's label and its primary key)."""

    def __init__(self, chat_model: Any, pk: Any) -> None:
        self._meta = chat_model._meta
        self.pk = pk


def _delete_log_entries(chat_model: Any, pks: list[Any], using: str) -> int:
    """The admin's history of the deleted chats (its entries repeat their titles)."""
    if not apps.is_installed("django.contrib.admin"):
        return 0
    # Function-local: django.contrib.admin is optional, and its models load with the apps.
    from django.contrib.admin.models import LogEntry
    from django.contrib.contenttypes.models import ContentType

    content_type = ContentType.objects.db_manager(using).get_for_model(chat_model)
    entries = LogEntry.objects.using(using).filter(
        content_type=content_type, object_id__in=[str(pk) for pk in pks]
    )
    return int(entries.delete()[0])

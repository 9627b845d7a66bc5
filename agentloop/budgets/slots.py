"""The chats-in-flight quota: at most ``chats_in_flight`` of a subject's chats run at once.

A chat takes a place (a ``BudgetSlot`` row) at its first model call of a run, in the same
transaction as the call's reservation, whose UPDATE of the subject's ``Budget`` row holds
that row's lock: the subject's chats take places one at a time, and each counts the others
with the rows committed before it. A place is free again once its chat no longer runs: not
queued or running, and no verb in a process holds it (a chat waiting for a person, idle,
stopped or failed runs no more); the next chat that asks for a place deletes those.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.apps import apps
from django.db.models import Q
from django.db.models.functions import Now

from .rows import slot_model

__all__ = ["running", "take_slot"]


def running(chat_model: Any, keys: list[str], using: str) -> set[str]:
    """Which of the chats ``keys`` run now: queued or running, or held by a verb."""
    live = Q(state__in=["queued", "running"]) | Q(lease_token__gt="", lease_expires_at__gt=Now())
    rows = chat_model._default_manager.using(using).filter(live, pk__in=keys)
    return {str(pk) for pk in rows.values_list("pk", flat=True)}


def take_slot(subject: str, limit: int, chat: Any, using: str) -> bool:
    """Give ``chat`` a place of ``subject``'s quota of ``limit``; False when every place is
    taken by a chat that still runs. Call it holding the subject's row lock."""
    slots = slot_model()._default_manager.using(using)
    label, key = chat._meta.label_lower, str(chat.pk)
    places = list(slots.filter(budget_id=subject).values_list("pk", "chat_label", "chat_key"))
    if any((chat_label, chat_key) == (label, key) for _, chat_label, chat_key in places):
        return True
    by_model: dict[str, list[str]] = defaultdict(list)
    for _, chat_label, chat_key in places:
        by_model[chat_label].append(chat_key)
    live: set[tuple[str, str]] = set()
    for chat_label, keys in by_model.items():
        try:
            model = apps.get_model(chat_label)
        except LookupError:
            continue  # a chat model no longer installed: its places are free
        live.update((chat_label, found) for found in running(model, keys, using))
    gone = [pk for pk, chat_label, chat_key in places if (chat_label, chat_key) not in live]
    if gone:
        slots.filter(pk__in=gone).delete()
    if len(places) - len(gone) >= limit:
        return False
    slots.create(budget_id=subject, chat_label=label, chat_key=key)
    return True

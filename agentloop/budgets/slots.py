"""The chats-in-flight quota: at most ``chats_in_flight`` of a subject's chats run at once, the
others waiting in line in the order they came.

A chat takes a place (a ``BudgetSlot`` row) at its first model call of a run, in the same
transaction as the call's reservation, whose UPDATE of the subject's ``Budget`` row holds
that row's lock: the subject's chats take places one at a time, and each counts the others
with the rows committed before it. A place is free again once its chat no longer runs: not
queued or running, and no verb in a process holds it (a chat waiting for a person, idle,
stopped or failed runs no more).

A background chat that finds every place taken queues for one: its row says since when it
waits (``waiting_since``), and the line is the order of the rows' keys. It stays ``queued``
with no job in flight; when a place frees, the chat that freed it (or the sweeper, should
that be lost) sends the job of the first chat in line (:func:`due`), which then takes the
place. A chat in line is never overtaken by one that came later.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.apps import apps
from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Now
from django.utils import timezone

from .budget_models import budget_model, slot_model
from .limits import limits_of

__all__ = ["due", "leave", "running", "take_slot", "waiting_subjects"]

#: a place's holder or a chat in line: (row key, chat model label, chat key, waits).
_Place = tuple[Any, str, str, bool]


def running(chat_model: Any, keys: list[str], using: str) -> set[str]:
    """Which of the chats ``keys`` run now: queued or running, or held by a verb."""
    live = Q(state__in=["queued", "running"]) | Q(lease_token__gt="", lease_expires_at__gt=Now())
    rows = chat_model._default_manager.using(using).filter(live, pk__in=keys)
    return {str(pk) for pk in rows.values_list("pk", flat=True)}


def _live(places: list[_Place], using: str) -> set[tuple[str, str]]:
    """The (label, key) of the places' chats that run now (a constant number of queries:
    one per chat model)."""
    by_model: dict[str, list[str]] = defaultdict(list)
    for _, chat_label, chat_key, _ in places:
        by_model[chat_label].append(chat_key)
    live: set[tuple[str, str]] = set()
    for chat_label, keys in by_model.items():
        try:
            model = apps.get_model(chat_label)
        except LookupError:
            continue  # a chat model no longer installed: its places are free
        live.update((chat_label, found) for found in running(model, keys, using))
    return live


def _places(subject: str, using: str) -> list[_Place]:
    """The subject's places and its line, in the order they came."""
    rows = slot_model()._default_manager.using(using).filter(budget_id=subject).order_by("pk")
    return [
        (pk, label, key, since is not None)
        for pk, label, key, since in rows.values_list(
            "pk", "chat_label", "chat_key", "waiting_since"
        )
    ]


def take_slot(subject: str, limit: int, chat: Any, using: str, *, wait: bool = False) -> bool:
    """Give ``chat`` a place of ``subject``'s quota of ``limit``; False when every place is
    taken by a chat that still runs, or is owed to a chat in line before it. ``wait``: the
    chat queues for a place (its row stays, in line). Call it holding the subject's row
    lock."""
    slots = slot_model()._default_manager.using(using)
    label, key = chat._meta.label_lower, str(chat.pk)
    places = _places(subject, using)
    own = next((place for place in places if (place[1], place[2]) == (label, key)), None)
    if own is not None and not own[3]:
        return True  # it holds a place this run
    live = _live(places, using)
    gone = [pk for pk, chat_label, chat_key, _ in places if (chat_label, chat_key) not in live]
    if gone:
        slots.filter(pk__in=gone).delete()
    held = sum(1 for _, *chat, waits in places if not waits and tuple(chat) in live)
    ahead = sum(
        1
        for pk, *chat, waits in places
        if waits and tuple(chat) in live and (own is None or pk < own[0])
    )
    if held + ahead < limit:
        if own is not None and own[0] not in gone:
            slots.filter(pk=own[0]).update(waiting_since=None, taken_at=timezone.now())
        else:
            slots.create(budget_id=subject, chat_label=label, chat_key=key)
        return True
    if wait and (own is None or own[0] in gone):
        slots.create(budget_id=subject, chat_label=label, chat_key=key, waiting_since=Now())
    return False


def leave(subjects: list[str], chat: Any, using: str) -> None:
    """``chat``'s run ended: its places (or its places in line) in ``subjects`` are free now,
    unless it runs again already (a message came in). Each subject's row is locked first, as
    :func:`take_slot` is called, so a chat taking a place meanwhile sees one or the other."""
    label, key = chat._meta.label_lower, str(chat.pk)
    budgets = budget_model()._default_manager.using(using)
    slots = slot_model()._default_manager.using(using)
    with transaction.atomic(using=using):
        for subject in sorted(subjects):  # in key order, as reservations lock them
            budgets.filter(subject=subject).update(updated_at=timezone.now())
        if key in running(type(chat), [key], using):
            return
        slots.filter(budget_id__in=subjects, chat_label=label, chat_key=key).delete()


def due(subjects: list[str], using: str = "default") -> list[tuple[str, str]]:
    """The chats in line whose turn has come in ``subjects``: the first ones, as many as
    places are free, that wait queued with no job holding them. Their jobs are to be sent
    (each takes its place in :func:`take_slot`); the (chat model label, chat key) of each."""
    budgets = budget_model()._default_manager.using(using)
    columns = ("subject", "chats_in_flight")
    rows = {row["subject"]: row for row in budgets.filter(subject__in=subjects).values(*columns)}
    found: list[tuple[str, str]] = []
    for subject in sorted(rows):
        limit = limits_of(rows[subject]).chats_in_flight
        places = _places(subject, using)
        if limit is None:
            limit = len(places)  # the quota was lifted: everyone in line goes
        live = _live(places, using)
        held = sum(1 for _, *chat, waits in places if not waits and tuple(chat) in live)
        line = [(label, key) for _, label, key, waits in places if waits and (label, key) in live]
        found.extend(chat for chat in line[: max(0, limit - held)] if chat not in found)
    return _unheld(found, using)


def _unheld(chats: list[tuple[str, str]], using: str) -> list[tuple[str, str]]:
    """Those of ``chats`` that are queued and held by no job (one whose step runs now sends
    its own next job)."""
    by_model: dict[str, list[str]] = defaultdict(list)
    for chat_label, chat_key in chats:
        by_model[chat_label].append(chat_key)
    free: set[tuple[str, str]] = set()
    for chat_label, keys in by_model.items():
        model = apps.get_model(chat_label)
        unheld = Q(lease_token="") | Q(lease_expires_at__lt=Now())
        rows = model._default_manager.using(using).filter(unheld, state="queued", pk__in=keys)
        free.update((chat_label, str(pk)) for pk in rows.values_list("pk", flat=True))
    return [chat for chat in chats if chat in free]


def waiting_subjects(using: str = "default") -> list[str]:
    """The subjects with chats in line (the sweeper looks for lost turns among them)."""
    rows = slot_model()._default_manager.using(using).filter(waiting_since__isnull=False)
    return sorted(set(rows.values_list("budget_id", flat=True)))

"""What subjects spent against their limits: this day, this month, reserved by calls in flight,
and their chats running now (the admin's budget list, or a project's own page)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.apps import apps

from .budget_models import budget_model, slot_model
from .limits import LIMITS, Limits, dollars, limits_of, this_day, this_month
from .slots import running
from .subjects import Subject

__all__ = ["Spend", "chats_in_flight", "spend_of", "spends"]


@dataclass(frozen=True)
class Spend:
    """A subject's use of its budget now."""

    subject: str
    label: str
    limits: Limits
    cost_per_day: Decimal
    cost_per_month: Decimal
    tokens_per_day: int
    tokens_per_month: int
    chats_in_flight: int
    #: held by model calls in flight (settled when they answer).
    reserved_cost: Decimal
    reserved_tokens: int

    def used(self, limit: str) -> Any:
        """What counts against ``limit`` ("cost_per_day", ...) now."""
        return getattr(self, limit)

    def reached(self) -> list[str]:
        """The limits with nothing left (the next model call stops)."""
        return [
            name
            for name in LIMITS
            if self.limits.value(name) is not None and self.used(name) >= self.limits.value(name)
        ]


def chats_in_flight(subjects: Iterable[str], using: str = "default") -> dict[str, int]:
    """How many chats of each subject run now, holding a place of its quota (a constant number
    of queries: one, plus one per chat model)."""
    places = (
        slot_model()
        ._default_manager.using(using)
        .filter(
            budget_id__in=list(subjects),
            waiting_since__isnull=True,  # not those in line
        )
    )
    by_model: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for budget, label, key in places.values_list("budget_id", "chat_label", "chat_key"):
        by_model[label].append((str(budget), key))
    counts: dict[str, int] = defaultdict(int)
    for label, held in by_model.items():
        try:
            model = apps.get_model(label)
        except LookupError:
            continue
        live = running(model, [key for _, key in held], using)
        for subject, key in held:
            counts[subject] += key in live
    return dict(counts)


def spends(rows: Iterable[Any], using: str = "default") -> list[Spend]:
    """The spend of each ``Budget`` row (no query but :func:`chats_in_flight`'s)."""
    rows = list(rows)
    day, month = this_day(), this_month()
    flying = chats_in_flight([row.subject for row in rows], using)
    return [
        Spend(
            subject=row.subject,
            label=row.label or row.subject,
            limits=limits_of(row),
            cost_per_day=dollars(row.day_cost if row.day == day else 0),
            cost_per_month=dollars(row.month_cost if row.month == month else 0),
            tokens_per_day=row.day_tokens if row.day == day else 0,
            tokens_per_month=row.month_tokens if row.month == month else 0,
            chats_in_flight=flying.get(row.subject, 0),
            reserved_cost=dollars(row.reserved_cost),
            reserved_tokens=row.reserved_tokens,
        )
        for row in rows
    ]


def spend_of(subject: Any, using: str = "default") -> Spend:
    """The spend of ``subject`` (a user, a model instance, a string key or a Subject); all
    zero for one that never called a model."""
    found = Subject.of(subject)
    row = budget_model()._default_manager.using(using).filter(subject=found.key).first()
    return spends([row or budget_model()(subject=found.key, label=found.label)], using)[0]

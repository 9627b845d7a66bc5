"""The counters: reserving a model call's estimate against each subject's ``Budget`` row, and
charging its exact cost when its usage row is written.

A reservation is one conditional UPDATE per subject: the row's counters grow by the estimate
only where this day's and this month's spend, plus what the calls in flight reserved, plus
the estimate, stay within each limit. Two processes reserving the last cent at once queue on
the row's lock; the second sees the first's reservation and finds no room. Subjects are taken
in key order (no two calls deadlock), all in one transaction: a subject without room
leaves the others untouched. A ``BudgetReservation`` row per subject remembers the amount,
so that the charge (in the usage row's transaction) gives back exactly what is still held,
and a reservation whose process died expires (:func:`release_expired`). Its expiry is set and
judged by the database's clock, as a lease's is: a process whose clock is behind or ahead
neither makes a reservation that expires at once nor calls a live one expired.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import (
    BigIntegerField,
    Case,
    DateTimeField,
    ExpressionWrapper,
    F,
    Q,
    Value,
    When,
)
from django.db.models.functions import Now
from django.db.models.lookups import LessThanOrEqual
from django.utils import timezone

from ..conf import agentloop_settings
from ..engine.rate_limiting import CallEstimate
from ..exceptions import BudgetExceededError
from .budget_models import budget_model, reservation_model
from .limits import Limits, day_now, limits_of, month_now, reached, units
from .slots import take_slot
from .subjects import Subject

__all__ = ["Reservation", "charge", "release_expired", "reserve"]

#: the limits held by the counters, with the counter each compares and the estimate's part.
_COUNTED = (
    ("cost_per_day", "day", "day_cost", "reserved_cost", "cost"),
    ("cost_per_month", "month", "month_cost", "reserved_cost", "cost"),
    ("tokens_per_day", "day", "day_tokens", "reserved_tokens", "tokens"),
    ("tokens_per_month", "month", "month_tokens", "reserved_tokens", "tokens"),
)


@dataclass
class Reservation:
    """What a model call reserved: its rows (key, subject) and the amounts."""

    token: str
    cost: int  # units of 1e-8 USD
    tokens: int
    #: (BudgetReservation key, subject key) per subject.
    rows: list[tuple[Any, str]] = field(default_factory=list)
    #: the subjects with a chats-in-flight quota: the chat holds (or waits for) a place.
    places: list[str] = field(default_factory=list)

    @property
    def subjects(self) -> list[str]:
        return [subject for _, subject in self.rows]


_INT = BigIntegerField()


def _current(counter: str, period: str, start: Any) -> Any:
    """A counter's value for the period starting ``start`` (an expression: the database's
    day or month; 0 once the period has passed)."""
    return Case(When(**{period: start}, then=F(counter)), default=Value(0), output_field=_INT)


def _room(limits: Limits, day: Any, month: Any, cost: int, tokens: int) -> Q:
    """Where a row has room for ``cost`` and ``tokens`` more under ``limits``."""
    condition = Q()
    starts = {"day": day, "month": month}
    need = {"cost": cost, "tokens": tokens}
    for limit, period, counter, reserved, part in _COUNTED:
        value = limits.value(limit)
        if value is None:
            continue
        ceiling = units(value) if part == "cost" else int(value)
        # counter + reserved + need <= ceiling, written as counter + reserved <= ceiling - need
        # (a query expression on one side, a parameter on the other).
        spent = _current(counter, period, starts[period]) + F(reserved)
        condition &= Q(LessThanOrEqual(spent, Value(ceiling - need[part], output_field=_INT)))
    return condition


def reserve(
    subjects: list[Subject], estimate: CallEstimate, chat: Any, using: str, *, wait: bool = False
) -> Reservation:
    """Reserve ``estimate`` for a model call of ``chat`` against every subject's budget, and
    a place of each subject's chats-in-flight quota, or none of them: raises
    ``BudgetExceededError`` (naming the first limit without room) when one has none.
    ``wait``: a chat that finds no place queues for one (its place in line is kept)."""
    cost, tokens = units(estimate.cost), estimate.tokens
    day, month = day_now(), month_now()  # by the database's clock, as the charge's
    reservation = Reservation(uuid.uuid4().hex, cost, tokens)
    budgets = budget_model()._default_manager.using(using)
    no_place: BudgetExceededError | None = None
    with transaction.atomic(using=using):
        _quick_commit(using)
        rows = _rows(subjects, using)
        for subject in subjects:  # in key order
            limits = limits_of(rows[subject.key])
            room = _room(limits, day, month, cost, tokens)
            grown = {
                "reserved_cost": F("reserved_cost") + cost,
                "reserved_tokens": F("reserved_tokens") + tokens,
                "updated_at": timezone.now(),
            }
            if budgets.filter(room, subject=subject.key).update(**grown):
                continue
            if release_expired(using, subject=subject.key) and budgets.filter(
                room, subject=subject.key
            ).update(**grown):
                continue  # the room was held by calls whose processes died
            _refuse(subject, using, cost, tokens)
        for subject in subjects:  # each row is locked by its UPDATE above
            quota = limits_of(rows[subject.key]).chats_in_flight
            if quota is None:
                continue
            reservation.places.append(subject.key)
            if not take_slot(subject.key, quota, chat, using, wait=wait):
                no_place = BudgetExceededError(
                    reached("chats_in_flight", quota, subject.label),
                    subject=subject.label,
                    limit="chats_in_flight",
                )
                break
        if no_place is not None:
            # Nothing is reserved, but the chat's place in line is kept (committed).
            budgets.filter(subject__in=[subject.key for subject in subjects]).update(
                reserved_cost=F("reserved_cost") - cost,
                reserved_tokens=F("reserved_tokens") - tokens,
            )
        else:
            chat_name = f"{chat._meta.label_lower}:{chat.pk}"
            reservations = reservation_model()
            made = reservations._default_manager.using(using).bulk_create(
                [
                    reservations(
                        budget_id=subject.key,
                        token=reservation.token,
                        chat=chat_name,
                        cost=cost,
                        tokens=tokens,
                        expires_at=expiry(),
                    )  # fmt: skip
                    for subject in subjects
                ]
            )
            reservation.rows = [(row.pk, str(row.budget_id)) for row in made]
    if no_place is not None:
        raise no_place
    return reservation


def expiry() -> ExpressionWrapper:
    """A new reservation's expiry: ``BUDGET_RESERVATION_SECONDS`` from now by the database's
    clock (never this process's, which may be behind or ahead of the others')."""
    seconds = timedelta(seconds=agentloop_settings.BUDGET_RESERVATION_SECONDS)
    return ExpressionWrapper(Now() + Value(seconds), output_field=DateTimeField())


def _quick_commit(using: str) -> None:
    """On PostgreSQL, outside a caller's transaction, the reservation's commit doesn't wait
    for the WAL flush (for its own transaction only). A server crash can lose only a
    reservation whose call's usage row was not written yet: the row's counters and its
    reservation rows are lost together, and a usage row written later (synchronously,
    flushing the WAL up to it) finds no reservation to give back."""
    connection = connections[using]
    if connection.vendor == "postgresql" and not connection.savepoint_ids:
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('synchronous_commit', 'off', true)")


def _rows(subjects: list[Subject], using: str) -> dict[str, dict[str, Any]]:
    """Each subject's row (its own limits), made now for a subject that has none."""
    budgets = budget_model()._default_manager.using(using)
    columns = ("subject", "cost_per_day", "cost_per_month", "tokens_per_day",
               "tokens_per_month", "chats_in_flight")  # fmt: skip
    keys = [subject.key for subject in subjects]
    found = {row["subject"]: row for row in budgets.filter(subject__in=keys).values(*columns)}
    missing = [subject for subject in subjects if subject.key not in found]
    if missing:
        # Another process may make the same row at once: either insert stands.
        budgets.bulk_create(
            [budgets.model(subject=subject.key, label=subject.label[:200]) for subject in missing],
            ignore_conflicts=True,
        )
        found.update(
            (row["subject"], row)
            for row in budgets.filter(subject__in=[s.key for s in missing]).values(*columns)
        )
    return found


def _refuse(subject: Subject, using: str, cost: int, tokens: int) -> None:
    """Raise ``BudgetExceededError`` for the first of the subject's limits without room (read
    again: the row as it is now, with the database's day and month)."""
    rows = budget_model()._default_manager.using(using)
    row = rows.annotate(db_day=day_now(), db_month=month_now()).get(subject=subject.key)
    limits = limits_of(row)
    need = {"cost": cost, "tokens": tokens}
    for limit, period, counter, reserved, part in _COUNTED:
        value = limits.value(limit)
        if value is None:
            continue
        start = row.db_day if period == "day" else row.db_month
        spent = getattr(row, counter) if getattr(row, period) == start else 0
        ceiling = units(value) if part == "cost" else int(value)
        if spent + getattr(row, reserved) + need[part] > ceiling:
            raise BudgetExceededError(
                reached(limit, value, subject.label), subject=subject.label, limit=limit
            )
    # No limit is short now (one was raised meanwhile): a refusal still, the next call goes.
    raise BudgetExceededError(
        f"budget: no room for {subject.label} (try again)", subject=subject.label, limit=""
    )


def charge(
    subjects: list[Subject], cost: int, tokens: int, reservation: Reservation | None, using: str
) -> None:
    """Add an attempt's exact ``cost`` (units) and ``tokens`` to each subject's counters and
    give back what its reservation still holds. Runs in the usage row's transaction."""
    held: dict[str, tuple[int, int]] = {}
    if reservation is not None:
        rows = reservation_model()._default_manager.using(using)
        for key, reserved_for in reservation.rows:
            # Only the deleter gives the amount back: an expired reservation was already.
            if rows.filter(pk=key).delete()[0]:
                held[reserved_for] = (reservation.cost, reservation.tokens)
    day, month = day_now(), month_now()  # by the database's clock, never this process's
    budgets = budget_model()._default_manager.using(using)
    for subject in subjects:  # in key order
        given_cost, given_tokens = held.get(subject.key, (0, 0))
        changes = {
            "day_cost": _current("day_cost", "day", day) + cost,
            "day_tokens": _current("day_tokens", "day", day) + tokens,
            "month_cost": _current("month_cost", "month", month) + cost,
            "month_tokens": _current("month_tokens", "month", month) + tokens,
            "reserved_cost": F("reserved_cost") - given_cost,
            "reserved_tokens": F("reserved_tokens") - given_tokens,
            "updated_at": timezone.now(),
            # Last: the counters above read the periods the row had (MySQL reads left to right).
            "day": day,
            "month": month,
        }
        if budgets.filter(subject=subject.key).update(**changes):
            continue
        budgets.bulk_create([budgets.model(subject=subject.key, label=subject.label[:200])],
                            ignore_conflicts=True)  # fmt: skip
        budgets.filter(subject=subject.key).update(**changes)


def release_expired(using: str = "default", *, subject: str | None = None) -> int:
    """Give back what reservations past their expiry still hold (their processes died
    mid-call; a call still running past it is charged exactly all the same). Returns how
    many were released. The sweeper runs it; a reservation with no room runs it first.
    Expiry is judged by the database's clock, as it was set."""
    rows = reservation_model()._default_manager.using(using).filter(expires_at__lt=Now())
    if subject is not None:
        rows = rows.filter(budget_id=subject)
    released = 0
    budgets = budget_model()._default_manager.using(using)
    for key, budget, cost, tokens in rows.values_list("pk", "budget_id", "cost", "tokens"):
        with transaction.atomic(using=using):
            if reservation_model()._default_manager.using(using).filter(pk=key).delete()[0]:
                budgets.filter(subject=budget).update(
                    reserved_cost=F("reserved_cost") - cost,
                    reserved_tokens=F("reserved_tokens") - tokens,
                )
                released += 1
    return released

"""What a budget counts: a subject's limits (its ``Budget`` row's own, else
``AGENTLOOP["BUDGETS"]``'s) and the line a chat shows when one is reached; amounts; periods.

Amounts: whole units of 1e-8 US dollars in the counters (the precision of ``Usage.cost``;
integers add up exactly on every database), dollars everywhere else.

Periods: the day and the month a budget counts, the calendar's in ``settings.TIME_ZONE``
(not a request's activated time zone: every process must agree on when a day ends). The
counters take them from the database's clock, inside their statements (:func:`day_now`,
:func:`month_now`, and their SQL for the PostgreSQL one-statement forms), as leases and
reservations do: a process whose clock is behind must not count today's spend into
yesterday (and so start the day's counters again from nothing), nor one ahead start
tomorrow early. :func:`this_day` (this process's clock) is for showing spend.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import date
from decimal import ROUND_CEILING, Decimal
from typing import Any

from django.conf import settings
from django.db.models import DateField
from django.db.models.functions import Now, TruncDate, TruncMonth
from django.utils import timezone

from ..conf import agentloop_settings

__all__ = [
    "LIMITS",
    "Limits",
    "UNIT",
    "budgets_on",
    "day_now",
    "day_sql",
    "dollars",
    "limits_of",
    "month_now",
    "month_sql",
    "reached",
    "shown",
    "this_day",
    "this_month",
    "units",
    "zone_name",
]


#: one unit of the counters, in US dollars.
UNIT = Decimal("0.00000001")


def units(amount: Decimal | None) -> int:
    """``amount`` dollars in units (a part of a unit counts as one); None (no price): 0."""
    if amount is None:
        return 0
    return int((Decimal(amount) / UNIT).to_integral_value(rounding=ROUND_CEILING))


def dollars(count: int) -> Decimal:
    """``count`` units in dollars."""
    return (Decimal(count) * UNIT).quantize(UNIT)


def shown(amount: Decimal) -> str:
    """An amount as a budget's reason shows it: "$20.00", "$1,500.00", "$0.005"."""
    cents = amount.quantize(Decimal("0.01"))
    if cents == amount:
        return f"${cents:,.2f}"
    return f"${amount.normalize():,f}"


def this_day() -> date:
    """Today, in ``TIME_ZONE``, by this process's clock."""
    if not settings.USE_TZ:
        return date.today()  # naive datetimes are in TIME_ZONE already
    return timezone.localdate(timezone=timezone.get_default_timezone())


def this_month(day: date | None = None) -> date:
    """The first day of ``day``'s month (default: today's)."""
    return (day or this_day()).replace(day=1)


def _zone() -> Any:
    return timezone.get_default_timezone() if settings.USE_TZ else None


def day_now() -> TruncDate:
    """Today in ``TIME_ZONE`` by the database's clock, as a query expression."""
    return TruncDate(Now(), tzinfo=_zone())


def month_now() -> TruncMonth:
    """The first day of this month in ``TIME_ZONE`` by the database's clock (an expression)."""
    return TruncMonth(Now(), tzinfo=_zone(), output_field=DateField())


def zone_name() -> str:
    """``TIME_ZONE``'s name, the parameter of :func:`day_sql` and :func:`month_sql`."""
    return str(settings.TIME_ZONE or "UTC")


def day_sql(zone: str) -> str:
    """Today by the database's clock, in PostgreSQL; ``zone``: the placeholder of the time
    zone's name (:func:`zone_name`)."""
    return f"CAST(clock_timestamp() AT TIME ZONE {zone} AS date)"


def month_sql(zone: str) -> str:
    """The first day of this month by the database's clock, in PostgreSQL (``zone`` as for
    :func:`day_sql`)."""
    return f"CAST(date_trunc('month', clock_timestamp() AT TIME ZONE {zone}) AS date)"


#: every limit, in the order they are checked.
LIMITS = ("cost_per_day", "cost_per_month", "tokens_per_day", "tokens_per_month",
          "chats_in_flight")  # fmt: skip


@dataclass(frozen=True)
class Limits:
    """What a subject may use; None: no limit."""

    cost_per_day: Decimal | None = None
    cost_per_month: Decimal | None = None
    tokens_per_day: int | None = None
    tokens_per_month: int | None = None
    chats_in_flight: int | None = None

    def value(self, name: str) -> Any:
        return getattr(self, name)


def budgets_on() -> bool:
    """Budgets count spend: ``AGENTLOOP["BUDGETS"]`` is set (``{}`` included)."""
    return agentloop_settings.BUDGETS is not None


def limits_of(row: Any) -> Limits:
    """The limits of a subject whose ``Budget`` row (or a dict of its columns, or None: no
    row yet) sets those it has, the settings' the others."""
    defaults = agentloop_settings.BUDGETS
    values = {}
    for field in fields(Limits):
        own = row.get(field.name) if isinstance(row, dict) else getattr(row, field.name, None)
        values[field.name] = own if own is not None else getattr(defaults, field.name, None)
    return Limits(**values)


def reached(limit: str, value: Any, label: str) -> str:
    """The chat's stop reason: "budget: $20.00/day reached for owner 42"."""
    if limit == "chats_in_flight":
        what = f"{value} chat{'s' if value != 1 else ''} in flight"
    else:
        kind, _, period = limit.partition("_per_")
        tokens = f"{int(value):,} token{'s' if int(value) != 1 else ''}"
        amount = shown(Decimal(value)) if kind == "cost" else tokens
        what = f"{amount}/{period}"
    return f"budget: {what} reached for {label}"

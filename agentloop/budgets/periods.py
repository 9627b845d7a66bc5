"""The day and the month a budget counts: the calendar's in ``settings.TIME_ZONE`` (not a
request's activated time zone: every process must agree on when a day ends).

The counters take them from the database's clock, inside their statements (:func:`day_now`,
:func:`month_now`, and their SQL for the PostgreSQL one-statement forms), as leases and
reservations do: a process whose clock is behind must not count today's spend into
yesterday (and so start the day's counters again from nothing), nor one ahead start
tomorrow early. :func:`this_day` (this process's clock) is for showing spend.
"""

from __future__ import annotations

from datetime import date
from typing import Any

from django.conf import settings
from django.db.models import DateField
from django.db.models.functions import Now, TruncDate, TruncMonth
from django.utils import timezone

__all__ = [
    "day_now", "day_sql", "month_now", "month_sql", "this_day", "this_month", "zone_name",
]  # fmt: skip


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

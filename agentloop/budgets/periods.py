"""The day and the month a budget counts: the calendar's in ``settings.TIME_ZONE`` (not a
request's activated time zone: every process must agree on when a day ends)."""

from __future__ import annotations

from datetime import date

from django.conf import settings
from django.utils import timezone

__all__ = ["this_day", "this_month"]


def this_day() -> date:
    """Today, in ``TIME_ZONE``."""
    if not settings.USE_TZ:
        return date.today()  # naive datetimes are in TIME_ZONE already
    return timezone.localdate(timezone=timezone.get_default_timezone())


def this_month(day: date | None = None) -> date:
    """The first day of ``day``'s month (default: today's)."""
    return (day or this_day()).replace(day=1)

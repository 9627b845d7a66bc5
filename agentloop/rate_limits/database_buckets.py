"""Rate-limit buckets in the database (no Redis configured): a ``RateLimitBucket`` row each.

A call takes from its buckets in one transaction, in key order, each by one conditional
UPDATE (the level refilled to now, less the cost, only where the refilled level has room);
a bucket without room rolls the others back. The row's lock makes two processes taking
from one bucket queue: the second sees what the first took. On PostgreSQL "now" is the
database's clock, so every host agrees on it; elsewhere (SQLite: one host) this host's.
"""

from __future__ import annotations

import time
from typing import Any

from django.db import router, transaction
from django.db.models import F, FloatField, Func, Value
from django.db.models.functions import Greatest, Least
from django.db.models.lookups import GreaterThanOrEqual

from ..engine.rate_limiting import Bucket, RateLimiter, Shortfall, take
from ..models.rate_limits import RateLimitBucket

__all__ = ["DatabaseRateLimiter"]

_FLOAT = FloatField()


class _EpochNow(Func):
    """Seconds since the epoch now: the database's clock on PostgreSQL, else this host's."""

    output_field = _FLOAT

    def as_sql(
        self,
        compiler: Any,
        connection: Any,
        function: str | None = None,
        template: str | None = None,
        arg_joiner: str | None = None,
        **extra_context: Any,
    ) -> tuple[str, tuple[Any, ...]]:
        return "%s", (time.time(),)

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return "EXTRACT(EPOCH FROM clock_timestamp())::double precision", ()


class _NoRoom(Exception):  # noqa: N818 - rolls the transaction back; never leaves this module
    def __init__(self, short: Shortfall) -> None:
        self.short = short


class DatabaseRateLimiter(RateLimiter):
    """The buckets as rows of the database ``RateLimitBucket`` is routed to."""

    def take(self, buckets: list[Bucket]) -> Shortfall | None:
        using = router.db_for_write(RateLimitBucket)
        rows = RateLimitBucket._default_manager.using(using)
        missing = {bucket.key for bucket in buckets}
        missing -= set(rows.filter(key__in=missing).values_list("key", flat=True))
        if missing:
            # Full at first (a stamp at the epoch refills it); either of two inserts stands.
            rows.bulk_create(
                [RateLimitBucket(key=key, level=0.0, stamp=0.0) for key in sorted(missing)],
                ignore_conflicts=True,
            )
        try:
            with transaction.atomic(using=using):
                for bucket in buckets:  # in key order: no two takers deadlock
                    self._take_one(rows, bucket, using)
        except _NoRoom as short:
            return short.short
        return None

    @staticmethod
    def _take_one(rows: Any, bucket: Bucket, using: str) -> None:
        now = _EpochNow()
        elapsed = Greatest(now - F("stamp"), Value(0.0), output_field=_FLOAT)
        refilled = Least(
            Value(bucket.capacity), F("level") + elapsed * Value(bucket.per_second),
            output_field=_FLOAT,
        )  # fmt: skip
        room = GreaterThanOrEqual(refilled, Value(min(bucket.cost, bucket.capacity)))
        if rows.filter(room, key=bucket.key).update(level=refilled - bucket.cost, stamp=now):
            return
        level, stamp, at = rows.filter(key=bucket.key).annotate(at=now).values_list(
            "level", "stamp", "at"
        ).get()  # fmt: skip
        _, wait = take(level, at - stamp, bucket)
        # A bucket refilled in between the two statements: try again at once.
        raise _NoRoom(Shortfall(max(wait, 0.001), bucket))

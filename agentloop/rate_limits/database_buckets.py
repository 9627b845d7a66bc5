"""Rate-limit buckets in the database (no Redis configured): a ``RateLimitBucket`` row each.

A call takes from each bucket by one conditional UPDATE (the level refilled to now, less the
cost, only where the refilled level has room): one statement for a call with one bucket,
else one transaction taking them in key order, where a bucket without room rolls the others
back. The row's lock makes two processes taking
from one bucket queue: the second sees what the first took. On PostgreSQL "now" is the
database's clock, so every host agrees on it; elsewhere (SQLite: one host) this host's.
"""

from __future__ import annotations

import time
from typing import Any

from django.apps import apps
from django.db import router, transaction
from django.db.models import F, FloatField, Func, Value
from django.db.models.functions import Greatest, Least
from django.db.models.lookups import GreaterThanOrEqual

from ..engine.rate_limiting import Bucket, RateLimiter, Shortfall, take

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
        now = "EXTRACT(EPOCH FROM clock_timestamp())::double precision"
        if connection.in_atomic_block:
            return now, ()
        # Its own transaction (one statement): its commit needn't wait for the WAL flush. A
        # server crash can only lose a take of the bucket, which paces nothing durable.
        return f"(SELECT {now} FROM set_config('synchronous_commit', 'off', true))", ()  # noqa: S608


class _NoRoom(Exception):  # noqa: N818 - rolls the transaction back; never leaves this module
    def __init__(self, short: Shortfall) -> None:
        self.short = short


class _Missing(Exception):  # noqa: N818 - as _NoRoom: a bucket has no row yet
    pass


class DatabaseRateLimiter(RateLimiter):
    """The buckets as rows of the database ``RateLimitBucket`` is routed to."""

    def take(self, buckets: list[Bucket]) -> Shortfall | None:
        # From the app registry: the models package imports the store, which imports this.
        bucket_model = apps.get_model("agentloop", "RateLimitBucket")
        using = router.db_for_write(bucket_model)
        rows = bucket_model._default_manager.using(using)
        for _ in range(2):
            try:
                if len(buckets) == 1:
                    self._take_one(rows, buckets[0])  # one statement: its own transaction
                else:
                    with transaction.atomic(using=using):
                        for bucket in buckets:  # in key order: no two takers deadlock
                            self._take_one(rows, bucket)
            except _NoRoom as short:
                return short.short
            except _Missing:
                # Full at first (a stamp at the epoch refills it); of two inserts one stands.
                rows.bulk_create(
                    [bucket_model(key=b.key, level=0.0, stamp=0.0) for b in buckets],
                    ignore_conflicts=True,
                )
                continue
            return None
        return None  # pragma: no cover - the rows exist after the first try

    @staticmethod
    def _take_one(rows: Any, bucket: Bucket) -> None:
        now = _EpochNow()
        elapsed = Greatest(now - F("stamp"), Value(0.0), output_field=_FLOAT)
        refilled = Least(
            Value(bucket.capacity), F("level") + elapsed * Value(bucket.per_second),
            output_field=_FLOAT,
        )  # fmt: skip
        room = GreaterThanOrEqual(refilled, Value(min(bucket.cost, bucket.capacity)))
        if rows.filter(room, key=bucket.key).update(level=refilled - bucket.cost, stamp=now):
            return
        found = rows.filter(key=bucket.key).annotate(at=now).values_list("level", "stamp", "at")
        state = found.first()
        if state is None:
            raise _Missing
        level, stamp, at = state
        _, wait = take(level, at - stamp, bucket)
        # A bucket refilled in between the two statements: try again at once.
        raise _NoRoom(Shortfall(max(wait, 0.001), bucket))

"""Many chats changed at once: one conditional UPDATE per batch of ids, RETURNING those changed.

A set-based verb (``agentloop.models.bulk``) walks the chats a queryset selects in primary-key
order, ``batch_size`` at a time, each batch one statement::

    UPDATE chat SET ... WHERE <condition> AND id IN (
        SELECT id FROM chat WHERE <the queryset's filter> AND <condition> AND id > %s
        ORDER BY id LIMIT %s
    ) RETURNING id, ...

The condition is in the UPDATE's own WHERE, not only in the batch's SELECT: a row a running
step changed meanwhile (a worker claimed or released its chat) is judged again on the
version the UPDATE locks (PostgreSQL re-checks it after waiting for that writer), so a
running step's write is never overwritten by a decision made on an older version. Each
statement is its own transaction (outside a caller's), so a lease renewal waits at most for
one batch, and 100,000 chats never sit in one transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from django.db import OperationalError, connections, router, transaction
from django.db.models import Q, QuerySet
from django.db.models.sql.subqueries import UpdateQuery

__all__ = ["DEFAULT_BATCH_SIZE", "batch_chats", "count_chats", "database", "update_returning"]

#: chats per statement: small enough that a batch's row locks are held for milliseconds,
#: large enough that 100,000 chats take a hundred statements.
DEFAULT_BATCH_SIZE = 1000
#: SQLSTATEs a batch is tried again for (a deadlock with a heartbeat renewing many leases).
_RETRIED = frozenset({"40P01", "40001"})


def database(queryset: QuerySet[Any]) -> str:
    """The database a set-based verb writes ``queryset``'s chats on."""
    chosen: str | None = getattr(queryset, "_db", None)  # as QuerySet.update() picks it
    return chosen or router.db_for_write(queryset.model)


def _chosen(queryset: QuerySet[Any]) -> QuerySet[Any]:
    """The queryset as a filter that can be narrowed further (a slice becomes a subquery)."""
    if queryset.query.is_sliced:
        manager = queryset.model._default_manager.db_manager(database(queryset))
        return manager.filter(pk__in=queryset.values("pk"))
    return queryset.order_by()


def update_returning(
    queryset: QuerySet[Any], values: dict[str, Any], returning: Sequence[str] = ("pk",)
) -> list[tuple[Any, ...]]:
    """``queryset.update(**values)`` as one statement that returns the ``returning`` columns
    (field names; "pk" for the primary key) of each row it changed."""
    model, using = queryset.model, database(queryset)
    query: Any = queryset.query.chain(UpdateQuery)
    query.add_update_values(values)
    query.annotations = {}
    sql, params = query.get_compiler(using).as_sql()
    if not sql:
        return []
    connection = connections[using]
    fields = [model._meta.pk if name == "pk" else model._meta.get_field(name) for name in returning]
    columns = ", ".join(connection.ops.quote_name(field.column) for field in fields)
    attempts = 1 if connection.in_atomic_block else 3
    for attempt in range(attempts):
        try:
            with transaction.mark_for_rollback_on_error(using), connection.cursor() as cursor:
                cursor.execute(f"{sql} RETURNING {columns}", params)
                return [tuple(row) for row in cursor.fetchall()]
        except OperationalError as exc:
            state = getattr(exc.__cause__, "sqlstate", None)
            if state not in _RETRIED or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def count_chats(queryset: QuerySet[Any], condition: Q | None = None) -> int:
    """How many chats ``queryset`` selects (those meeting ``condition`` when given)."""
    chosen = _chosen(queryset)
    return (chosen if condition is None else chosen.filter(condition)).count()


def batch_chats(
    queryset: QuerySet[Any],
    condition: Q,
    values: dict[str, Any],
    *,
    returning: Sequence[str] = (),
    batch_size: int = DEFAULT_BATCH_SIZE,
    on_batch: Callable[[list[tuple[Any, ...]]], None] | None = None,
) -> int:
    """Set ``values`` on the chats of ``queryset`` that meet ``condition``, ``batch_size``
    per statement; ``on_batch`` gets each batch's changed rows (the pk, then ``returning``)
    as soon as its statement ran. Returns how many chats changed."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, not {batch_size}")
    chosen = _chosen(queryset).filter(condition)
    target = queryset.model._default_manager.db_manager(database(queryset)).filter(condition)
    changed, last, misses = 0, None, 0
    while True:
        remaining = chosen if last is None else chosen.filter(pk__gt=last)
        batch = remaining.order_by("pk").values("pk")[:batch_size]
        rows = update_returning(target.filter(pk__in=batch), values, ("pk", *returning))
        if rows:
            changed += len(rows)
            last = max(row[0] for row in rows)
            if on_batch is not None:
                on_batch(rows)
        if len(rows) == batch_size:
            continue
        # A short batch is the last one, unless running steps changed some of its chats
        # between its SELECT and its UPDATE: then chats after it may still be to do.
        beyond = chosen if last is None else chosen.filter(pk__gt=last)
        if not beyond.exists():
            break
        misses = 0 if rows else misses + 1
        if misses > 3:  # pragma: no cover - chats changing faster than they can be read
            break
    return changed

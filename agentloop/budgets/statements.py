"""The budgets' one-statement forms on PostgreSQL, for the common case: one subject whose row
exists and that has no chats-in-flight quota.

- :func:`reserve_at_once`: the reservation as one statement, the subject's conditional
  UPDATE and the reservation's INSERT selecting from it (its commit doesn't wait for the WAL
  flush: see :func:`agentloop.budgets.counters.reserve`). Its expiry is the database's
  clock plus ``BUDGET_RESERVATION_SECONDS``, computed in the statement, as a lease's is. No row
  back: no room, no row yet, or a quota; the transaction form (``counters.reserve``) then
  decides, and says which limit.
- :func:`charge_parts`: the charge as parts of the step's one-statement write (a
  data-modifying CTE behind the lease's guard ``g``: ``agentloop.django_store.writes``):
  the reservation's DELETE, and the counters' UPDATE giving back what the DELETE found.

The conditions and amounts are those of :mod:`.counters`, written in SQL: limits are the
row's own (dollars, in units: ``ROUND(x * 1e8)``) or the settings' (parameters). Only quoted
identifiers from the models' metadata go into the text; values are always parameters.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import connections
from django.utils import timezone

from ..conf import agentloop_settings
from ..engine.rate_limiting import CallEstimate
from .budget_models import budget_model, reservation_model
from .counters import Reservation
from .limits import day_sql, month_sql, units, zone_name
from .subjects import Subject

__all__ = ["charge_parts", "one_statement", "reserve_at_once"]

#: limit, its period's column, the counter, the reserved counter, the estimate's part.
_COUNTED = (
    ("cost_per_day", "day", "day_cost", "reserved_cost", "cost"),
    ("cost_per_month", "month", "month_cost", "reserved_cost", "cost"),
    ("tokens_per_day", "day", "day_tokens", "reserved_tokens", "tokens"),
    ("tokens_per_month", "month", "month_tokens", "reserved_tokens", "tokens"),
)


def one_statement(using: str) -> bool:
    """The one-statement forms apply: PostgreSQL, outside a caller's transaction."""
    connection = connections[using]
    return connection.vendor == "postgresql" and not connection.in_atomic_block


def _names(using: str) -> dict[str, str]:
    quote = connections[using].ops.quote_name
    budget, reservation = budget_model()._meta, reservation_model()._meta
    names = {name: quote(_column(budget, name)) for name in (
        "subject", "cost_per_day", "cost_per_month", "tokens_per_day", "tokens_per_month",
        "chats_in_flight", "day", "day_cost", "day_tokens", "month", "month_cost",
        "month_tokens", "reserved_cost", "reserved_tokens", "updated_at",
    )}  # fmt: skip
    names["budget"] = quote(budget.db_table)
    names["reservation"] = quote(reservation.db_table)
    for name in ("id", "budget", "token", "chat", "cost", "tokens", "expires_at"):
        names[f"r_{name}"] = quote(_column(reservation, name))
    return names


def _column(meta: Any, name: str) -> str:
    return str(meta.get_field(name).column)


def reserve_at_once(
    subject: Subject, estimate: CallEstimate, chat: Any, using: str
) -> Reservation | None:
    """The reservation in one statement, or None (nothing written) when the transaction form
    must decide: no room, no row for the subject yet, or a chats-in-flight quota."""
    n = _names(using)
    defaults = agentloop_settings.BUDGETS
    cost, tokens = units(estimate.cost), estimate.tokens
    # This day and month by the database's clock, as the charge counts them.
    starts = {"day": day_sql("%s"), "month": month_sql("%s")}
    params: list[Any] = []
    rooms = []
    for limit, period, counter, reserved, part in _COUNTED:
        default = getattr(defaults, limit, None)
        own = n[limit]
        if part == "cost":
            own = f"CAST(ROUND({own} * 100000000) AS bigint)"
            default = None if default is None else units(default)
        ceiling = f"COALESCE({own}, CAST(%s AS bigint))"
        spent = f"CASE WHEN {n[period]} = {starts[period]} THEN {n[counter]} ELSE 0 END"
        spent += f" + {n[reserved]}"
        rooms.append(f"({ceiling} IS NULL OR {spent} + %s <= {ceiling})")
        need = cost if part == "cost" else tokens
        params += [default, zone_name(), need, default]
    reservation = Reservation(uuid.uuid4().hex, cost, tokens)
    seconds = float(agentloop_settings.BUDGET_RESERVATION_SECONDS)
    chat_name = f"{chat._meta.label_lower}:{chat.pk}"
    sql = (
        "WITH q AS (SELECT set_config('synchronous_commit', 'off', true)), "  # noqa: S608
        f"u AS (UPDATE {n['budget']} SET {n['reserved_cost']} = {n['reserved_cost']} + %s, "
        f"{n['reserved_tokens']} = {n['reserved_tokens']} + %s, {n['updated_at']} = %s "
        f"WHERE {n['subject']} = %s AND {n['chats_in_flight']} IS NULL AND "
        f"{' AND '.join(rooms)} RETURNING {n['subject']}), "
        f"r AS (INSERT INTO {n['reservation']} ({n['r_budget']}, {n['r_token']}, {n['r_chat']}, "
        f"{n['r_cost']}, {n['r_tokens']}, {n['r_expires_at']}) "
        # The expiry by the database's clock, never this process's.
        f"SELECT {n['subject']}, %s, %s, %s, %s, clock_timestamp() + %s * INTERVAL '1 second' "
        f"FROM u RETURNING {n['r_id']}) "
        "SELECT r.* FROM r CROSS JOIN q"
    )
    now = timezone.now()
    values = [cost, tokens, now, subject.key, *params,
              reservation.token, chat_name, cost, tokens, seconds]  # fmt: skip
    with connections[using].cursor() as cursor:
        cursor.execute(sql, values)
        row = cursor.fetchone()
    if row is None:
        return None
    reservation.rows = [(row[0], subject.key)]
    return reservation


def charge_parts(
    add: Any, reservation: Reservation, cost: int, tokens: int, using: str
) -> list[str]:
    """The charge of an attempt with ``reservation`` as CTE parts behind the guard ``g``;
    ``add(value, sql_type)`` writes a value as a parameter, in the statement's order."""
    n = _names(using)
    ids = ", ".join(add(key, "bigint") for key, _ in reservation.rows)
    deleted = (
        f"bd AS (DELETE FROM {n['reservation']} WHERE {n['r_id']} IN ({ids}) "  # noqa: S608
        f"AND EXISTS (SELECT 1 FROM g) "
        f"RETURNING {n['r_budget']} AS subject, {n['r_cost']} AS cost, {n['r_tokens']} AS tokens)"
    )
    given = {
        part: f"CAST(COALESCE((SELECT SUM(bd.{part}) FROM bd WHERE bd.subject = "  # noqa: S608
        f"{n['budget']}.{n['subject']}), 0) AS bigint)"
        for part in ("cost", "tokens")
    }
    sets = [
        _counter(n, "day_cost", "day", cost, add),
        _counter(n, "day_tokens", "day", tokens, add),
        _counter(n, "month_cost", "month", cost, add),
        _counter(n, "month_tokens", "month", tokens, add),
        f"{n['reserved_cost']} = {n['reserved_cost']} - {given['cost']}",
        f"{n['reserved_tokens']} = {n['reserved_tokens']} - {given['tokens']}",
        f"{n['updated_at']} = {add(timezone.now(), 'timestamp with time zone')}",
        # This day and month by the database's clock, never this process's.
        f"{n['day']} = {day_sql(add(zone_name(), 'varchar'))}",
        f"{n['month']} = {month_sql(add(zone_name(), 'varchar'))}",
    ]
    subjects = ", ".join(add(subject, "varchar") for subject in reservation.subjects)
    charged = (
        f"bc AS (UPDATE {n['budget']} SET {', '.join(sets)} "  # noqa: S608
        f"WHERE {n['subject']} IN ({subjects}) AND EXISTS (SELECT 1 FROM g))"
    )
    return [deleted, charged]


def _counter(n: dict[str, str], counter: str, period: str, amount: int, add: Any) -> str:
    """``counter = <its value this period> + amount``, the period's start by the database's
    clock (parameters added in the text's order)."""
    starts = day_sql if period == "day" else month_sql
    start = starts(add(zone_name(), "varchar"))
    plus = add(amount, "bigint")
    return f"{n[counter]} = CASE WHEN {n[period]} = {start} THEN {n[counter]} ELSE 0 END + {plus}"

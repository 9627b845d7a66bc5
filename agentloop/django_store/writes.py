"""A step's write as one statement on PostgreSQL: the lease's renewal or release and the rows.

A data-modifying CTE. The chat row's conditional UPDATE (renew the lease, or release it with the
chat's next state) comes first and every INSERT selects from it, so a process that lost the
lease writes nothing; one statement is one transaction (a savepoint inside an outer one), so
the step's rows and the chat's next state commit together. One round trip where the
transaction form takes BEGIN, the lease's UPDATE, two to four writes and COMMIT (other
databases, and the rarer writes, keep that form). The statements are built here;
``RunControl.at_once`` runs them behind the lease, for ``Transcript`` and ``ToolCalls``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import connections
from django.utils import timezone

from .chat_row import ChatRow
from .fields import Casts, EmptyJson, Saving, save_value
from .reconnect import committed_message
from .sql import bound_cursor

__all__ = [
    "GUARD",
    "StepWrites",
    "Values",
    "inserted",
    "landed_rows",
    "run_statement",
    "step_writes",
]


def _type(field: Any, connection: Any) -> str:
    # Values selected (not VALUES of the INSERT itself) need their column's type spelled out.
    return str(field.cast_db_type(connection))


#: values written as constants, not parameters: psycopg caches a statement's conversion only
#: up to 50 parameters, and most of a row's columns hold one of these.
_CONSTANTS = {type(None): "NULL", bool: None, str: "''"}


class Values:
    """Value expressions of one statement and their parameters, in order."""

    def __init__(self) -> None:
        self.params: list[Any] = []

    def add(self, value: Any, sql_type: str) -> str:
        kind = type(value)
        if kind in _CONSTANTS and (kind is not str or value == ""):
            literal = _CONSTANTS[kind] or ("true" if value else "false")
            return f"CAST({literal} AS {sql_type})"
        if kind is EmptyJson:  # {} or []: a constant too (no JSON encoding per write)
            return f"CAST({value.literal} AS {sql_type})"
        self.params.append(value)
        return f"CAST(%s AS {sql_type})"

    def row(self, rows: _Rows, instance: Any) -> str:
        """``instance``'s columns of ``rows``, each as :meth:`add` writes it."""
        return ", ".join(
            rows.saving.expressions(instance, rows.connection, rows.casts, self.params)
        )


class _Rows:
    """One model's columns for an INSERT ... SELECT (less one written from a CTE)."""

    def __init__(self, model: Any, connection: Any, exclude: str | None = None) -> None:
        meta = model._meta
        quote = connection.ops.quote_name
        self.fields = [
            field
            for field in meta.concrete_fields
            if not field.primary_key and field.name != exclude
        ]
        self.table = quote(meta.db_table)
        self.pk = quote(meta.pk.column)
        self.columns = ", ".join(quote(field.column) for field in self.fields)
        self.types = [_type(field, connection) for field in self.fields]
        #: each column's value expressions (constants, a parameter).
        self.casts = [Casts(sql_type) for sql_type in self.types]
        self.saving = Saving(self.fields)
        self.connection = connection


class StepWrites:
    """The statements of one chat model on one PostgreSQL database, built once per process."""

    def __init__(self, models: Any, using: str) -> None:
        connection = self.connection = connections[using]
        quote = connection.ops.quote_name
        chat_meta = models.chat_model._meta
        self.chat_model = models.chat_model
        self.chat_table = quote(chat_meta.db_table)
        self.chat_pk = quote(chat_meta.pk.column)
        self.has_inbox = any(field.name == "inbox" for field in chat_meta.concrete_fields)
        self.message = _Rows(models.message_model, connection)
        self.message_meta = models.message_model._meta
        self.calls = _Rows(models.tool_call_model, connection, exclude="message")
        self.call_message = quote(models.tool_call_model._meta.get_field("message").column)
        self.call_key = quote(models.tool_call_model._meta.get_field("call_id").column)
        self.usage = _Rows(models.usage_model, connection, exclude="message")
        self.usage_message = quote(models.usage_model._meta.get_field("message").column)
        call_meta = models.tool_call_model._meta
        self.finish_fields = [
            call_meta.get_field(name) for name in ("state", "error", "finished_at")
        ]
        self.finish_types = [_type(field, connection) for field in self.finish_fields]
        self._releases: dict[tuple[str, ...], str] = {}
        #: an empty inbox, as the release compares it (prepared once: the same every time).
        self._empty_inbox = (
            save_value(chat_meta.get_field("inbox"), [], connection) if self.has_inbox else None
        )
        self._release_saving: dict[tuple[str, ...], Saving] = {}

    # -- the guard: the chat row's conditional UPDATE ------------------------------------------
    def release_sql(self, names: tuple[str, ...]) -> str:
        """Release with the columns ``names`` (``state`` last: queued instead when a message
        came in meanwhile); RETURNING the state set (and the halt reason, so that both guards,
        this and the renewal, return two columns)."""
        sql = self._releases.get(names)
        if sql is None:
            quote = self.connection.ops.quote_name
            meta = self.chat_model._meta
            sets = [f"{quote(meta.get_field(name).column)} = %s" for name in names]
            state = quote("state")
            if self.has_inbox:
                sets.append(f"{state} = CASE WHEN {quote('inbox')} = %s THEN %s ELSE %s END")
            else:
                sets.append(f"{state} = %s")
            sql = self._releases[names] = (
                f"UPDATE {self.chat_table} SET {', '.join(sets)} "  # noqa: S608 - identifiers
                f"WHERE {self.chat_pk} = %s AND {quote('lease_token')} = %s "
                f"RETURNING {state}, {quote('halt_reason')}"
            )
        return sql

    def release_params(self, names: tuple[str, ...], values: dict[str, Any]) -> list[Any]:
        meta = self.chat_model._meta
        saving = self._release_saving.get(names)
        if saving is None:
            saving = self._release_saving[names] = Saving([meta.get_field(n) for n in names])
        params = saving.values([values[name] for name in names], self.connection)
        if self.has_inbox:
            params += [self._empty_inbox, values["state"], "queued"]
        else:
            params.append(values["state"])
        return params

    # -- the statements ------------------------------------------------------------------------
    def answer(
        self,
        guard: str,
        values: Values,
        record: Any,
        calls: list[Any],
        usage: Any,
        extra: Callable[[Values], list[str]] | None = None,
    ) -> str:
        """The answer, its tool calls and its usage row, guarded (``values`` collects the
        parameters after the guard's); ``extra`` adds parts of its own after them (the
        usage row's budget charge), each guarded by ``g`` too."""
        m, c, u = self.message, self.calls, self.usage
        parts = [
            f"g AS ({guard})",
            f"m AS (INSERT INTO {m.table} ({m.columns}) "  # noqa: S608 - quoted identifiers
            f"SELECT {values.row(m, record)} FROM g RETURNING {m.pk})",
        ]
        select = "SELECT g.*, m.* FROM g CROSS JOIN m"
        if calls:
            aliases = ", ".join(f"f{index}" for index in range(len(c.fields)))
            rows = ", ".join([f"({values.row(c, call)})" for call in calls])
            parts.append(
                f"c AS (INSERT INTO {c.table} ({c.columns}, {self.call_message}) "  # noqa: S608
                f"SELECT v.*, m.{m.pk} FROM m CROSS JOIN (VALUES {rows}) AS v({aliases}) "
                f"RETURNING {c.pk}, {self.call_key})"
            )
            select = "SELECT g.*, m.*, c.* FROM g CROSS JOIN m CROSS JOIN c"
        parts.append(
            f"u AS (INSERT INTO {u.table} ({u.columns}, {self.usage_message}) "  # noqa: S608
            f"SELECT {values.row(u, usage)}, m.{m.pk} FROM m)"
        )
        if extra is not None:
            parts.extend(extra(values))
        return f"WITH {', '.join(parts)} {select}"

    def lone_message(self, guard: str, values: Values, record: Any) -> str:
        """A message alone (a user's), guarded."""
        m = self.message
        return (
            f"WITH g AS ({guard}), "  # noqa: S608 - quoted identifiers only; values are params
            f"m AS (INSERT INTO {m.table} ({m.columns}) SELECT {values.row(m, record)} FROM g "
            f"RETURNING {m.pk}) "
            "SELECT g.*, m.* FROM g CROSS JOIN m"
        )

    def judged(self, guard: str, values: Values, changes: dict[str, Any], key: Any) -> str:
        """A stored message's ``changes`` (what guardrails decided about it), guarded."""
        m = self.message
        meta = self.message_meta
        quote = self.connection.ops.quote_name
        sets = []
        for name, value in changes.items():
            field = meta.get_field(name)
            prepared = field.get_db_prep_save(value, self.connection)
            sets.append(
                f"{quote(field.column)} = {values.add(prepared, _type(field, self.connection))}"
            )
        values.params.append(key)
        return (
            f"WITH g AS ({guard}), "  # noqa: S608 - quoted identifiers only; values are params
            f"u AS (UPDATE {m.table} SET {', '.join(sets)} FROM g WHERE {m.table}.{m.pk} = %s) "
            "SELECT g.* FROM g"
        )

    def result(
        self, guard: str, values: Values, record: Any, state: Any, error: str, key: Any
    ) -> str:
        """A tool's result and its call's final state, guarded."""
        m, c = self.message, self.calls
        quote = self.connection.ops.quote_name
        inserted = values.row(m, record)
        finished = [state, error, timezone.now()]
        columns = zip(self.finish_fields, self.finish_types, finished, strict=True)
        sets = ", ".join(
            f"{quote(field.column)} = "
            + values.add(save_value(field, value, self.connection), sql_type)
            for field, sql_type, value in columns
        )
        values.params.append(key)
        return (
            f"WITH g AS ({guard}), "  # noqa: S608 - quoted identifiers only; values are params
            f"m AS (INSERT INTO {m.table} ({m.columns}) SELECT {inserted} FROM g "
            f"RETURNING {m.pk}), "
            f"f AS (UPDATE {c.table} SET {sets} FROM m WHERE {c.table}.{c.pk} = %s) "
            "SELECT g.*, m.* FROM g CROSS JOIN m"
        )


_WRITES: dict[tuple[Any, str], StepWrites | None] = {}
#: the statements run lately, each as one object (``run_statement``); at most this many.
_TEXTS: dict[str, str] = {}
_MOST_TEXTS = 64
#: columns the guard returns ahead of the inserted rows' (the cancel flag or the state, and
#: the halt reason).
GUARD = 2


def step_writes(row: ChatRow) -> StepWrites | None:
    """The chat model's one-statement writes on the chat's database; None if not PostgreSQL."""
    key = (row.chat_model, row.db)
    if key not in _WRITES:
        vendor = connections[row.db].vendor
        _WRITES[key] = StepWrites(row.models, row.db) if vendor == "postgresql" else None
    return _WRITES[key]


def run_statement(using: str, sql: str, params: list[Any], connection: Any = None) -> list[Any]:
    """``sql``'s rows (``connection``: ``connections[using]``, when the caller has it)."""
    # The same text as the last time, as the same object: its kept cursor is set up for it.
    known = _TEXTS.get(sql)
    if known is None:
        if len(_TEXTS) >= _MOST_TEXTS:
            _TEXTS.clear()
        known = _TEXTS[sql] = sql
    with bound_cursor(using, connection, known) as cursor:
        cursor.execute(known, params)
        return list(cursor.fetchall())


def landed_rows(row: ChatRow, record: Any, releases: bool) -> list[Any] | None:
    """The rows a step write that committed before its answer was lost would have
    returned, read back (found by its message: chat, role and creation time); None when
    it did not commit."""
    using, chat_pk = row.db, row.chat.pk
    key = committed_message(record, chat_pk, using)
    if key is None:
        return None
    # The guard's columns: what a release set, or the flag a renewal read.
    guard = ("state", "halt_reason") if releases else ("cancel_requested_at", "halt_reason")
    chats = row.models.chat_model._default_manager.using(using).filter(pk=chat_pk)
    head = chats.values_list(*guard).first() or (None,) * len(guard)
    calls = row.models.tool_call_model._default_manager.using(using).filter(message_id=key)
    return [(*head, key, *call) for call in calls.values_list("pk", "call_id")] or [(*head, key)]


def inserted(record: Any, pk: Any, using: str) -> None:
    """``record`` as the one statement inserted it (key ``pk``)."""
    record.pk = pk
    record._state.adding = False
    record._state.db = using

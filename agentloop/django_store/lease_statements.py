"""The lease's SQL: the claim, the renewals and the holder's lookup, built once per chat
model and database (see ``agentloop.django_store.leases`` for what they mean)."""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from typing import Any

from django.db import connections
from django.utils import timezone

from .field_values import quick_json_converters
from .lease_holders import holder_id
from .sql import bound_cursor, recover_prepared

__all__ = ["LeaseStatements", "attnames", "statement"]


class LeaseStatements:
    """The lease's statements for one chat model on one database, compiled once: the claim
    (``UPDATE chat SET lease ... WHERE free RETURNING every column``, its row converted as
    the ORM would), the renewals, and the holder's lookup."""

    def __init__(self, chat_model: Any, using: str) -> None:
        connection = connections[using]
        meta = chat_model._meta
        self.attnames = [field.attname for field in meta.concrete_fields]
        # The converters of a plain SELECT of the same columns turn the RETURNING row into
        # Python values exactly as the ORM would (JSON, datetimes on SQLite, ...).
        query = chat_model._default_manager.using(using).values_list(*self.attnames).query
        self.compiler = query.get_compiler(using=using)
        self.compiler.setup_query()
        columns = [selected[0] for selected in self.compiler.select]
        self.converters = quick_json_converters(self.compiler.get_converters(columns))
        quote = connection.ops.quote_name
        table = quote(meta.db_table)
        pk = self.pk = quote(meta.pk.column)
        self.table = table
        self.returning = connection.vendor == "postgresql" or (
            connection.vendor == "sqlite" and sqlite3.sqlite_version_info >= (3, 35)
        )
        #: psycopg 3 can send the claim and the transcript read together (pipeline mode).
        self.pipelines = connection.vendor == "postgresql" and _psycopg_pipelines()
        #: PostgreSQL sets and judges every expiry by its own clock, inside the statement;
        #: elsewhere (SQLite: one host) the parameters carry this host's clock.
        self.db_clock = connection.vendor == "postgresql"
        now = "clock_timestamp()" if self.db_clock else "%s"
        self.expiry = f"{now} + %s * INTERVAL '1 second'" if self.db_clock else "%s"
        self.pk_type = str(meta.pk.cast_db_type(connection))
        selected = ", ".join(quote(field.column) for field in meta.concrete_fields)
        token, expires = quote("lease_token"), quote("lease_expires_at")
        assignments = (
            f"{token} = %s, {expires} = {self.expiry}, {quote('updated_at')} = {now}, "
            f"{quote('lease_holder')} = %s"
        )
        conditions = {
            # A free chat: no lease, or an expired one.
            False: f"{pk} = %s AND ({token} = '' OR {expires} < {now})",
            # A lease whose holder is known to be gone, taken over by its token.
            True: f"{pk} = %s AND {token} = %s",
        }
        # Only quoted identifiers from the model's metadata go into the text; values are
        # always parameters.
        returning = f" RETURNING {selected}" if self.returning else ""
        # A job's claim also marks the chat running, and takes only a chat in flight: a
        # duplicate job (a re-send after a broker restart, the sweeper) finds one that moved
        # on (idle, failed...) untouched. A verb in-process keeps the state as it is.
        in_flight = f" AND {quote('state')} IN ('queued', 'running')"
        self.update_sql = {
            (with_state, takeover, job): f"UPDATE {table} SET {assignments}"  # noqa: S608
            + (f", {quote('state')} = %s" if with_state else "")
            + f" WHERE {condition}{in_flight if job else ''}{returning}"
            for with_state in (True, False)
            for takeover, condition in conditions.items()
            for job in (True, False)
        }
        # On PostgreSQL, outside a caller's transaction, the claim's commit doesn't wait for
        # the WAL flush (synchronous_commit off for this statement's transaction only): the
        # lease is visible to every process at once, and a server crash that lost it loses
        # nothing built on it, since every later write (a call's claim, the step's rows) commits
        # synchronously and flushes the WAL up to and including the claim.
        self.quick_sql = {
            form: sql.replace(
                " WHERE ",
                " FROM (SELECT set_config('synchronous_commit', 'off', true)) AS "
                f"{quote('agentloop_quick')} WHERE ",
                1,
            )
            for form, sql in self.update_sql.items()
        }
        if connection.vendor != "postgresql":
            self.quick_sql = self.update_sql
        signals = f"{quote('cancel_requested_at')}, {quote('halt_reason')}"
        self.renew_sql = (
            f"UPDATE {table} SET {expires} = {self.expiry} "  # noqa: S608
            f"WHERE {pk} = %s AND {token} = %s"
        )
        if self.returning:
            self.renew_sql += f" RETURNING {signals}"
        #: the renewal of many leases, completed by ``renew_many_sql``.
        self._renew_many = (
            f"UPDATE {table} SET {expires} = {self.expiry} "  # noqa: S608
            f"WHERE ({pk}, {token}) IN (VALUES {{rows}}) RETURNING {pk}, {token}, {signals}"
        )
        self.select_sql = f"SELECT {selected} FROM {table} WHERE {pk} = %s"  # noqa: S608
        self.holder_sql = f"SELECT {token}, {quote('lease_holder')} FROM {table} WHERE {pk} = %s"  # noqa: S608

    def clock(self, seconds: float) -> tuple[list[Any], list[Any]]:
        """The parameters of the expiry and of "now" (none for the database's own clock)."""
        if self.db_clock:
            return [seconds], []
        now = timezone.now()
        return [now + timedelta(seconds=seconds)], [now]

    def renew_many_sql(self, count: int) -> str:
        """The renewal of ``count`` leases in one statement, returning the renewed ones."""
        row = f"(CAST(%s AS {self.pk_type}), CAST(%s AS varchar))" if self.db_clock else "(%s, %s)"
        return self._renew_many.format(rows=", ".join([row] * count))

    def convert(self, attname: str, value: Any) -> Any:
        """One column's raw value as the ORM would return it."""
        index = self.attnames.index(attname)
        converters = {index: self.converters[index]} if index in self.converters else {}
        if not converters:
            return value
        row = [None] * len(self.attnames)
        row[index] = value
        return next(iter(self.compiler.apply_converters([row], converters)))[index]

    def run(
        self,
        using: str,
        pk: Any,
        token: str,
        seconds: float,
        state: str | None,
        prefetch: tuple[str, list[Any]] | None = None,
        *,
        taking_over: str | None = None,
        in_flight: bool = False,
    ) -> tuple[Any, list[Any] | None]:
        """The claimed row's values (converted), or None when the chat is held or missing;
        and the rows of ``prefetch`` (a SELECT and its parameters), read in the same round
        trip on PostgreSQL (psycopg's pipeline mode), else None (read them afterwards).
        ``taking_over``: the token of a lease whose holder is gone, taken whatever its expiry;
        ``in_flight`` (a job's claim): only a chat that is queued or running is taken."""
        connection = connections[using]
        expiry, now = self.clock(seconds)
        params: list[Any] = [token, *expiry, *now, holder_id()]
        if state is not None:
            params.append(state)
        params += [pk, taking_over] if taking_over is not None else [pk, *now]
        forms = self.update_sql if connection.in_atomic_block else self.quick_sql
        update = forms[state is not None, taking_over is not None, in_flight and state is not None]
        prefetched: list[Any] | None = None
        if prefetch is not None and self.pipelines:
            connection.ensure_connection()
            try:
                row, prefetched = self._pipelined(using, update, params, prefetch)
            except Exception as exc:
                # The server lost a prepared statement (a pooler, a migration): the
                # pipeline's one implicit transaction rolled back, so it runs again.
                retry = recover_prepared(using, exc, connection.connection)
                if not retry or connection.in_atomic_block:
                    raise
                row, prefetched = self._pipelined(using, update, params, prefetch)
        else:
            with bound_cursor(using) as cursor:
                cursor.execute(update, params)
                if self.returning:
                    row = cursor.fetchone()
                elif cursor.rowcount:
                    cursor.execute(self.select_sql, [pk])
                    row = cursor.fetchone()
                else:
                    row = None
        if row is None:
            return None, None
        if self.converters:
            row = next(iter(self.compiler.apply_converters([row], self.converters)))
        return row, prefetched

    def holder(self, using: str, pk: Any) -> tuple[str, str] | None:
        """The chat's lease token and its holder as stored now; None when it doesn't exist."""
        with connections[using].cursor() as cursor:
            cursor.execute(self.holder_sql, [pk])
            row = cursor.fetchone()
        return None if row is None else (str(row[0] or ""), str(row[1] or ""))

    @staticmethod
    def _pipelined(
        using: str, update: str, params: list[Any], prefetch: tuple[str, list[Any]]
    ) -> tuple[Any, list[Any]]:
        connection = connections[using]
        with bound_cursor(using) as cursor, bound_cursor(using) as reader:
            # Both statements go out before either answer is awaited: one round trip. Their
            # errors come at the pipeline's end, outside the cursors' translation.
            with connection.wrap_database_errors, connection.connection.pipeline():
                cursor.execute(update, params)
                reader.execute(*prefetch)
            return cursor.fetchone(), reader.fetchall()


def _psycopg_pipelines() -> bool:
    try:
        # Function-local: psycopg is the "postgres" extra; SQLite projects don't have it.
        import psycopg
    except ImportError:
        return False
    return bool(psycopg.Pipeline.is_supported())


_STATEMENTS: dict[tuple[Any, str], LeaseStatements] = {}


def statement(chat_model: Any, using: str) -> LeaseStatements:
    """The statements of ``chat_model`` on database ``using`` (built on first use)."""
    key = (chat_model, using)
    found = _STATEMENTS.get(key)
    if found is None:
        found = _STATEMENTS[key] = LeaseStatements(chat_model, using)
    return found


def attnames(chat_model: Any, using: str) -> list[str]:
    """The chat's column attributes in the order a claim returns them."""
    return statement(chat_model, using).attnames

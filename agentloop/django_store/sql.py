"""Statements built once and reused: the Django store's hot path without per-call ORM work.

Compiling a queryset or saving through ``Model.save()`` costs a few hundred microseconds
of Python per statement, more than the statement itself on a short chat. The store's
every-step reads and inserts go through these instead; the SQL is still Django's (the
compiler's for reads, the model's columns and ``get_db_prep_save`` for inserts), so every
supported database and field type works as with the ORM. Inserts bypass ``Model.save()``:
``pre_save``/``post_save`` are not sent for them (``agentloop.signals`` are).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.apps import apps
from django.db import connections
from django.db.backends.utils import CursorWrapper

from ..conf import agentloop_settings
from .fields import RowConverters, Saving, quick_json_converters
from .instances import instances

__all__ = [
    "PreparedInsert",
    "PreparedSelect",
    "PreparedUpdate",
    "bound_cursor",
    "get_by_pk",
    "recover_prepared",
]

logger = logging.getLogger("agentloop")


def bound_cursor(using: str, connection: Any = None, statement: str | None = None) -> _BoundCursor:
    """A cursor for the statements every step runs, wrapped as Django wraps its own (logged,
    counted, errors translated). On PostgreSQL with psycopg 3 it binds parameters on the
    server and, with ``AGENTLOOP["PREPARED_STATEMENTS"]`` (the default), asks psycopg to
    prepare each statement on its second run on the connection, so PostgreSQL parses and
    plans it once per connection instead of once per job (Django's own statements follow
    the database's OPTIONS ``prepare_threshold``). Elsewhere, the connection's usual
    cursor. Its raw cursors are kept for the connection's next statements. ``connection``:
    ``connections[using]``, when the caller has it already. ``statement``: the text (the
    same object each time) the cursor runs, for the kept cursor that ran it last: psycopg
    keeps a cursor's adapters set up for the statement it runs again, not for another."""
    connection = connections[using] if connection is None else connection
    return _BoundCursor(using, connection, statement)


class _BoundCursor:
    """``bound_cursor``'s context manager (a class: a step opens a few of these, and a
    generator's context manager costs twice the calls)."""

    __slots__ = ("connection", "free", "plain", "raw", "statement", "using")

    def __init__(self, using: str, connection: Any, statement: str | None) -> None:
        self.using = using
        self.connection = connection
        self.statement = statement
        self.raw: Any = None
        self.plain: Any = None

    def __enter__(self) -> Any:
        using, connection = self.using, self.connection
        preparing = agentloop_settings.PREPARED_STATEMENTS
        factory = None if using in _UNPREPARED else _CURSOR_CLASSES.get((using, preparing))
        if factory is None:
            factory = _server_binding(connection)
            if factory is not None and preparing:
                if using in _UNPREPARED:
                    _unprepare(connection)
                else:
                    factory = _preparing(factory, using)
            if factory is not None and using not in _UNPREPARED:
                _CURSOR_CLASSES[using, preparing] = factory
        if factory is None:
            self.plain = connection.cursor()
            return self.plain.__enter__()
        connection.close_if_health_check_failed()
        connection.ensure_connection()
        connection.validate_thread_sharing()
        kept = _kept_cursors(connection)
        key = factory if self.statement is None else (factory, self.statement)
        free = kept.free.get(key)
        if free is None:
            if len(kept.free) >= _MOST_KEPT:  # one list for any other statement
                key = factory
            free = kept.free.setdefault(key, [])
        self.free = free
        if free:
            raw = free.pop()
        else:
            with connection.wrap_database_errors:
                raw = kept.new(factory)
        self.raw = raw
        if connection.queries_logged:
            return connection.make_debug_cursor(raw)
        if (
            connection.execute_wrappers
            or not apps.ready
            or getattr(CursorWrapper.execute, "__code__", None) is not _DJANGO_EXECUTE
        ):
            return connection.make_cursor(raw)
        return _Direct(raw, connection)

    def __exit__(self, *exc_info: Any) -> None:
        if self.plain is not None:
            self.plain.__exit__(*exc_info)
        elif not self.raw.closed:
            self.free.append(self.raw)  # for the next statement (Django's wrapper would close it)


def _django_execute() -> Any:
    code = CursorWrapper.execute.__code__
    own = code.co_filename.replace("\\", "/").endswith("django/db/backends/utils.py")
    return code if own else None


#: Django's own ``CursorWrapper.execute``: an error tracker or tracer that replaces it (Sentry's
#: Django integration does, to see every statement) must see these statements too, so
#: ``_Direct`` serves only while it is Django's (checked at each statement: one may patch
#: it after this module is imported; one that patched it before leaves this None).
_DJANGO_EXECUTE = _django_execute()


class _Direct:
    """What Django's ``CursorWrapper`` does for the statements run here when nothing is
    logged and no ``execute_wrapper`` is installed (with either, Django's own wrappers run):
    a broken transaction refused first, the driver's errors translated. Half the calls of
    the wrapper, whose ``execute`` goes through three methods and every ``fetch`` through
    ``__getattr__`` and a new closure."""

    __slots__ = ("cursor", "db")

    def __init__(self, cursor: Any, db: Any) -> None:
        self.cursor = cursor
        self.db = db

    def execute(self, sql: str, params: Any = None) -> Any:
        db = self.db
        db.validate_no_broken_transaction()
        with db.wrap_database_errors:
            if params is None:
                return self.cursor.execute(sql)
            return self.cursor.execute(sql, params)

    def fetchone(self) -> Any:
        with self.db.wrap_database_errors:
            return self.cursor.fetchone()

    def fetchall(self) -> list[Any]:
        with self.db.wrap_database_errors:
            return self.cursor.fetchall()

    @property
    def rowcount(self) -> int:
        return self.cursor.rowcount


class _KeptCursors:
    """One connection's raw cursors between statements, kept for the next: a new psycopg
    cursor copies the connection's adapters and builds its loaders, a few microseconds more
    than the short statements of a step take to send."""

    def __init__(self, connection: Any) -> None:
        self.raw_connection = connection.connection
        self.timezone = connection.timezone
        #: by cursor class, or by cursor class and statement (``bound_cursor``).
        self.free: dict[Any, list[Any]] = {}
        self.loader = _native_tz_loader(self.raw_connection, self.timezone)
        #: the statements run once on this connection: prepared from their second run.
        self.seen: set[str] = set()

    def new(self, factory: Any) -> Any:
        raw = factory(self.raw_connection)
        raw.seen = self.seen
        if self.loader is not None:
            raw.adapters.register_loader(_TIMESTAMPTZ_OID, self.loader)
        else:
            # As Django's own cursors: its time zone where the connection's loader differs.
            loader = self.raw_connection.adapters.get_loader(_TIMESTAMPTZ_OID, 0)
            if self.timezone != loader.timezone:
                _register_tzloader(self.timezone, raw)
        return raw


#: by psycopg connection, the physical one: a pool hands one to any thread's Django connection
#: in turn, and what was prepared on it stays prepared on it. Closed ones are dropped as new
#: ones come (their cursors hold them: a weak key would never go).
_KEPT: dict[Any, _KeptCursors] = {}
_KEPT_LOCK = threading.Lock()


def _kept_cursors(connection: Any) -> _KeptCursors:
    raw = connection.connection
    kept = _KEPT.get(raw)
    if kept is None or kept.timezone is not connection.timezone:
        kept = _KeptCursors(connection)
        with _KEPT_LOCK:
            for closed in [other for other in _KEPT if other.closed]:
                del _KEPT[closed]
            _KEPT[raw] = kept
    return kept


def _native_tz_loader(raw_connection: Any, timezone: Any) -> Any:
    """psycopg's own timestamptz loader (compiled where psycopg's C extension is installed)
    when it gives exactly what Django's would: datetimes in Django's time zone, the same
    tzinfo object. Django's loader parses in Python, about 7 microseconds a value, and a
    transcript has one per message; None where they'd differ (USE_TZ off, or another zone)."""
    if timezone is None:
        return None
    # Function-local: psycopg is the "postgres" extra, absent on SQLite projects.
    import psycopg

    native = psycopg.adapters.get_loader(_TIMESTAMPTZ_OID, psycopg.pq.Format.TEXT)
    if native is None:  # pragma: no cover - psycopg always has one
        return None
    sample = native(_TIMESTAMPTZ_OID, raw_connection).load(b"2001-02-03 04:05:06.789+00")
    return native if getattr(sample, "tzinfo", None) is timezone else None


_FACTORIES: dict[str, Any] = {}
#: ``_BoundCursor``'s cursor class by database and ``PREPARED_STATEMENTS`` (where it has one).
_CURSOR_CLASSES: dict[tuple[str, bool], Any] = {}
#: the statements a connection keeps cursors for, each its own (``bound_cursor``).
_MOST_KEPT = 32
_TIMESTAMPTZ_OID = 1184


def _server_binding(connection: Any) -> Any:
    """Django's server-binding cursor class for this connection, or None."""
    if connection.vendor != "postgresql":
        return None
    if connection.alias not in _FACTORIES:
        # Function-local: the PostgreSQL backend imports psycopg, absent on SQLite projects.
        from django.db.backends.postgresql import base

        psycopg3 = getattr(base, "is_psycopg3", False)
        factory = getattr(base, "ServerBindingCursor", None) if psycopg3 else None
        _FACTORIES[connection.alias] = factory
    return _FACTORIES[connection.alias]


#: psycopg prepares nothing on a connection whose threshold is None, not even on request:
#: with the setting on, such a connection gets one no count reaches (only requests prepare).
_NEVER_BY_COUNT = 2**31 - 1
_PREPARING: dict[tuple[Any, str], Any] = {}
#: what the server answers when the statement psycopg prepared on "this" connection is not
#: there (invalid_sql_statement_name) or another client's is (duplicate_prepared_statement):
#: a pooler handing each transaction another server connection (pgbouncer before 1.21 in
#: transaction mode, or with max_prepared_statements = 0).
_POOLER_SQLSTATES = frozenset({"26000", "42P05"})
#: "cached plan must not change result type" (feature_not_supported): a migration changed a
#: column a prepared statement returns, under a connection that prepared it before.
_STALE_PLAN_SQLSTATE = "0A000"
#: databases where a pooler lost a prepared statement: this process prepares nothing there.
_UNPREPARED: set[str] = set()


def recover_prepared(using: str, error: BaseException, raw: Any) -> bool:
    """Whether ``error`` came from a prepared statement the server no longer has as psycopg
    believes, and the statement can now simply run again (nothing of it ran, and ``raw``,
    the psycopg connection, is in no transaction the error broke).

    A pooler lost it: this process stops preparing on ``using`` (one warning). A migration
    changed a table under its plan: this connection's prepared statements are dropped (and
    prepared again as they run). Anything else: False, nothing done."""
    sqlstate, cause = _sqlstate(error)
    if sqlstate == _STALE_PLAN_SQLSTATE:
        if not _forget_prepared(raw):  # pragma: no cover - another psycopg: stop instead
            _stop_preparing(using, cause, raw)
    elif sqlstate in _POOLER_SQLSTATES:
        _stop_preparing(using, cause, raw)
    else:
        return False
    # Function-local: psycopg is the "postgres" extra; only a psycopg error gets here.
    from psycopg.pq import TransactionStatus

    return bool(raw.info.transaction_status == TransactionStatus.IDLE)


def _forget_prepared(raw: Any) -> bool:
    """psycopg forgets the statements it prepared on ``raw`` and prepares them again, under
    new names, as they run; the stale ones stay on the server until the connection closes.
    (psycopg's own ``clear()`` also queues a DEALLOCATE ALL, which it sends after the next
    statement: after that statement's own new preparation, which it would then lose.)"""
    prepared = getattr(raw, "_prepared", None)
    flush = getattr(prepared, "_to_flush", None)
    if prepared is None or flush is None or not hasattr(prepared, "clear"):
        return False  # pragma: no cover - a psycopg without these
    prepared.clear()
    flush.clear()
    return True


def _sqlstate(error: BaseException) -> tuple[str | None, BaseException]:
    """The SQLSTATE of ``error`` or of the psycopg error Django wrapped in it."""
    cause: BaseException | None = error
    while cause is not None:
        sqlstate = getattr(cause, "sqlstate", None)
        if sqlstate:
            return str(sqlstate), cause
        cause = cause.__cause__
    return None, error


def _stop_preparing(using: str, cause: BaseException, raw: Any) -> None:
    if using not in _UNPREPARED:
        _UNPREPARED.add(using)
        logger.warning(
            "agentloop: a prepared statement went missing on database %r (%s): a connection "
            "pooler is between this process and PostgreSQL that doesn't keep them (pgbouncer "
            "in transaction mode needs 1.21+ with max_prepared_statements > 0). This process "
            'prepares no more statements there; set AGENTLOOP["PREPARED_STATEMENTS"] = False '
            "to start that way.",
            using,
            str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__,
        )
    if raw.prepare_threshold == _NEVER_BY_COUNT:
        raw.prepare_threshold = None


def _unprepare(connection: Any) -> None:
    """Back to Django's threshold on a connection this module set one on: psycopg uses a
    statement it prepared while it has any threshold, and those are what a pooler lost."""
    connection.ensure_connection()
    raw = connection.connection
    if raw.prepare_threshold == _NEVER_BY_COUNT:
        raw.prepare_threshold = None


def _preparing(factory: Any, using: str) -> Any:
    """``factory``'s subclass whose ``execute`` asks psycopg to prepare a statement the
    second time it runs on the connection, and runs it again when the server lost it (see
    ``recover_prepared``)."""
    key = (factory, using)
    if key not in _PREPARING:

        class Preparing(factory):
            #: the connection's statements run once (its kept cursors share one set).
            seen: set[str]

            def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
                raw = self.connection
                if raw.prepare_threshold is None:
                    raw.prepare_threshold = _NEVER_BY_COUNT
                if kwargs.get("prepare") is False or using in _UNPREPARED:
                    return super().execute(query, params, **kwargs)
                if query not in self.seen:
                    # Its first run on this connection: not prepared (preparing outside a
                    # pipeline waits for one more answer), which a connection opened per
                    # job (Celery's default) would pay on every job and never use.
                    self.seen.add(query)
                    return super().execute(query, params, **{**kwargs, "prepare": False})
                try:
                    if not kwargs:  # as always here: no arguments of another's to pass on
                        return super().execute(query, params, prepare=True)
                    return super().execute(query, params, **{**kwargs, "prepare": True})
                except Exception as exc:
                    # In pipeline mode errors come at the sync: the caller handles those.
                    if raw._pipeline is not None or not recover_prepared(using, exc, raw):
                        raise
                return super().execute(query, params, **{**kwargs, "prepare": False})

            def _send_query_prepared(self, name: bytes, pgq: Any, **kwargs: Any) -> Any:
                # As psycopg's unprepared path does: Django logs the statement from it
                # (CaptureQueriesContext, debug logging), which would otherwise read None.
                self._query = pgq
                return super()._send_query_prepared(name, pgq, **kwargs)

        _PREPARING[key] = Preparing
    return _PREPARING[key]


def _register_tzloader(timezone: Any, cursor: Any) -> None:
    # Function-local: psycopg_any imports psycopg, absent on SQLite projects.
    from django.db.backends.postgresql.psycopg_any import register_tzloader

    register_tzloader(timezone, cursor)


class PreparedSelect:
    """A queryset compiled once; each ``rows()`` runs it and applies Django's converters."""

    def __init__(self, queryset: Any, *, raw_columns: frozenset[int] = frozenset()) -> None:
        self.using = queryset.db
        self.compiler = queryset.query.get_compiler(using=self.using)
        self.sql, self.params = self.compiler.as_sql()
        fields = [selected[0] for selected in self.compiler.select[: self.compiler.col_count]]
        # Columns in ``raw_columns`` come back as the driver gives them: the caller
        # converts them itself (faster where it knows the values' shape).
        self.converters = {
            index: converter
            for index, converter in quick_json_converters(
                self.compiler.get_converters(fields)
            ).items()
            if index not in raw_columns
        }
        self._row_converters = RowConverters(self.converters)

    def rows(self, params: Any = None) -> list[Any]:
        """Run it (with ``params`` instead of the compiled ones, same order) and convert."""
        with bound_cursor(self.using, statement=self.sql) as cursor:
            cursor.execute(self.sql, self.params if params is None else params)
            rows = cursor.fetchall()
        return self.convert(rows)

    def convert(self, rows: list[Any]) -> list[Any]:
        """Rows this statement returned (read here or elsewhere), through Django's converters."""
        if self.converters:
            return self._row_converters.rows(rows, self.compiler.connection)
        return rows


_GETS: dict[tuple[Any, str], tuple[PreparedSelect, list[str]] | None] = {}


def get_by_pk(model: Any, using: str, pk: Any) -> Any:
    """``model._default_manager.get(pk=pk)`` by a SELECT compiled once per (model, database):
    the same statement, conversions, errors and ``from_db``, without building the query."""
    key = (model, using)
    if key not in _GETS:
        queryset = model._base_manager.using(using).filter(pk=0).order_by()[:21]
        select = PreparedSelect(queryset)
        compiler = select.compiler
        names = [column.target.attname for column, _, _ in compiler.select[: compiler.col_count]]
        usable = list(select.params) == [0] and not compiler.query.deferred_loading[0]
        _GETS[key] = (select, names) if usable else None
    prepared = _GETS[key]
    if prepared is None:  # pragma: no cover - Django compiles it so today
        return model._base_manager.using(using).get(pk=pk)
    select, names = prepared
    # As the ORM prepares a lookup's value: a bad one raises the ORM's own error.
    value = model._meta.pk.get_db_prep_value(
        model._meta.pk.get_prep_value(pk), connections[using], prepared=True
    )
    rows = select.rows([value])
    if not rows:
        raise model.DoesNotExist(f"{model._meta.object_name} matching query does not exist.")
    built = instances(model)
    if names == built.attnames:  # every column: built without Django's per-field calls
        return built.from_db(using, rows[0])
    return model.from_db(using, names, rows[0])  # pragma: no cover - a deferred column


class PreparedInsert:
    """``INSERT`` of one model instance, its SQL built once per database."""

    def __init__(self, model: Any) -> None:
        self.model = model
        meta = model._meta
        self.pk = meta.pk
        self.fields = [field for field in meta.concrete_fields if not field.primary_key]
        self.saving = Saving(self.fields)
        self._sql: dict[str, tuple[str, bool]] = {}

    def _statement(self, connection: Any) -> tuple[str, bool]:
        cached = self._sql.get(connection.alias)
        if cached is None:
            quote = connection.ops.quote_name
            columns = ", ".join(quote(field.column) for field in self.fields)
            placeholders = ", ".join(["%s"] * len(self.fields))
            # Only quoted identifiers from the model's own metadata go into the text;
            # values are always parameters.
            table = quote(self.model._meta.db_table)
            sql = f"INSERT INTO {table} ({columns}) VALUES ({placeholders})"  # noqa: S608
            returning = bool(connection.features.can_return_columns_from_insert)
            if returning:
                sql += f" RETURNING {quote(self.pk.column)}"
            cached = self._sql[connection.alias] = (sql, returning)
        return cached

    def insert(self, instance: Any, using: str) -> Any:
        """Insert ``instance`` (not saved before); sets and returns its primary key."""
        connection = connections[using]
        sql, returning = self._statement(connection)
        params = self.saving.of(instance, connection)
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            if returning:
                pk = cursor.fetchone()[0]
            else:
                pk = connection.ops.last_insert_id(
                    cursor, self.model._meta.db_table, self.pk.column
                )
        instance.pk = pk
        instance._state.adding = False
        instance._state.db = using
        return pk


class PreparedUpdate:
    """``UPDATE table SET <columns> WHERE <conditions>`` for one model, built once per database.

    ``where`` holds ``(column, operator)`` pairs ("=", or "<>"); values are always parameters,
    prepared with each field's ``get_db_prep_save``. ``guard`` adds ``AND EXISTS (SELECT 1
    FROM <guard table> WHERE <pk> = %s AND <column> = %s)``: a write allowed only while a
    row (the chat's lease) still says so, at no extra statement.
    """

    def __init__(
        self,
        model: Any,
        columns: tuple[str, ...],
        where: tuple[tuple[str, str], ...],
        guard: tuple[Any, str, str] | None = None,
    ) -> None:
        self.model = model
        meta = model._meta
        self.fields = [meta.get_field(name) for name in columns]
        self.where_fields = [(meta.get_field(name), operator) for name, operator in where]
        self._saving = Saving(self.fields + [field for field, _ in self.where_fields])
        self.guard = guard
        self._sql: dict[str, str] = {}

    def _statement(self, connection: Any) -> str:
        sql = self._sql.get(connection.alias)
        if sql is None:
            quote = connection.ops.quote_name
            assignments = ", ".join(f"{quote(field.column)} = %s" for field in self.fields)
            conditions = " AND ".join(
                f"{quote(field.column)} {operator} %s" for field, operator in self.where_fields
            )
            if self.guard is not None:
                guard_model, key, column = self.guard
                guard_meta = guard_model._meta
                guard_table = quote(guard_meta.db_table)
                guard_key = quote(guard_meta.get_field(key).column)
                guard_column = quote(guard_meta.get_field(column).column)
                exists = f"SELECT 1 FROM {guard_table} WHERE {guard_key} = %s"  # noqa: S608
                conditions += f" AND EXISTS ({exists} AND {guard_column} = %s)"
            # Only quoted identifiers from the models' metadata go into the text.
            table = quote(self.model._meta.db_table)
            statement = f"UPDATE {table} SET {assignments} WHERE {conditions}"  # noqa: S608
            sql = self._sql[connection.alias] = statement
        return sql

    def run(self, using: str, values: list[Any], where: list[Any], guard: Any = ()) -> int:
        """Rows changed."""
        connection = connections[using]
        if len(values) != len(self.fields):
            raise ValueError(f"{len(self.fields)} values expected, not {len(values)}")
        params = self._saving.values([*values, *where], connection)
        params += list(guard)
        statement = self._statement(connection)
        with bound_cursor(using, connection, statement) as cursor:
            cursor.execute(statement, params)
            return int(cursor.rowcount)

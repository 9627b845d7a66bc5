"""One writer per chat: a lease (token + expiry) on the chat row, taken by every writing verb.

Taking a lease is one conditional UPDATE that also returns the chat row (``claim``), so a
job loads its chat in the same statement that makes it the only writer. While the lease is
held, each write transaction of the Django store starts by renewing it (:meth:`Lease.ensure`,
which locks the row until the transaction ends), and the verb's last write releases it in the
same transaction (:meth:`Lease.release`). A process whose lease was taken over fails that
UPDATE and writes nothing (``LeaseLostError``).

A single heartbeat thread per process renews every lease held here while a long model call or
tool runs. It rides out transient database errors, retrying until the lease would expire; just
before that it marks the lease lost, so the step writes nothing more and a takeover can't make
a tool run twice.
"""

from __future__ import annotations

import logging
import secrets
import sqlite3
import threading
import time
from datetime import datetime, timedelta
from typing import Any

from django.db import close_old_connections, connections
from django.utils import timezone

from .conf import agentloop_settings
from .django_store.sql import PreparedUpdate, bound_cursor, recover_prepared
from .exceptions import LeaseLostError

__all__ = ["UNREAD", "Lease", "attnames", "claim", "claim_row", "heartbeats", "renewal"]

logger = logging.getLogger(__name__)


class _ClaimStatement:
    """``UPDATE chat SET lease ... WHERE free RETURNING every column``, compiled once per
    (chat model, database); the returned row goes through Django's converters."""

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
        self.converters = self.compiler.get_converters(columns)
        quote = connection.ops.quote_name
        table = quote(meta.db_table)
        pk = quote(meta.pk.column)
        self.returning = connection.vendor == "postgresql" or (
            connection.vendor == "sqlite" and sqlite3.sqlite_version_info >= (3, 35)
        )
        #: psycopg 3 can send the claim and the transcript read together (pipeline mode).
        self.pipelines = connection.vendor == "postgresql" and _psycopg_pipelines()
        selected = ", ".join(quote(field.column) for field in meta.concrete_fields)
        assignments = (
            f"{quote('lease_token')} = %s, {quote('lease_expires_at')} = %s, "
            f"{quote('updated_at')} = %s"
        )
        condition = (
            f"{pk} = %s AND ({quote('lease_token')} = '' OR {quote('lease_expires_at')} < %s)"
        )
        # Only quoted identifiers from the model's metadata go into the text; values are
        # always parameters.
        returning = f" RETURNING {selected}" if self.returning else ""
        # Two forms: a job's claim also marks the chat running; a verb in-process keeps it.
        # A job's claim takes only a chat in flight: a duplicate job (a re-send after a
        # broker restart, the sweeper) finds one that moved on (idle, failed...) untouched.
        in_flight = f" AND {quote('state')} IN ('queued', 'running')"
        self.update_sql: dict[bool | str, str] = {
            True: f"UPDATE {table} SET {assignments}, {quote('state')} = %s "  # noqa: S608
            f"WHERE {condition}{returning}",
            "job": f"UPDATE {table} SET {assignments}, {quote('state')} = %s "  # noqa: S608
            f"WHERE {condition}{in_flight}{returning}",
            False: f"UPDATE {table} SET {assignments} WHERE {condition}{returning}",  # noqa: S608
        }
        # On PostgreSQL, outside a caller's transaction, the claim's commit doesn't wait for
        # the WAL flush (synchronous_commit off for this statement's transaction only): the
        # lease is visible to every process at once, and a server crash that lost it loses
        # nothing built on it, since every later write (a call's claim, the step's rows) commits
        # synchronously and flushes the WAL up to and including the claim.
        self.quick_sql = {
            with_state: sql.replace(
                " WHERE ",
                " FROM (SELECT set_config('synchronous_commit', 'off', true)) AS "
                f"{quote('agentloop_quick')} WHERE ",
                1,
            )
            for with_state, sql in self.update_sql.items()
        }
        if connection.vendor != "postgresql":
            self.quick_sql = self.update_sql
        self.renew_sql = (
            f"UPDATE {table} SET {quote('lease_expires_at')} = %s "  # noqa: S608
            f"WHERE {pk} = %s AND {quote('lease_token')} = %s"
        )
        if self.returning:
            self.renew_sql += f" RETURNING {quote('cancel_requested_at')}"
        self.select_sql = f"SELECT {selected} FROM {table} WHERE {pk} = %s"  # noqa: S608

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
        expires: datetime,
        state: str | None,
        prefetch: tuple[str, list[Any]] | None = None,
        in_flight: bool = False,
    ) -> tuple[Any, list[Any] | None]:
        """The claimed row's values (converted), or None when the chat is held or missing
        (or, ``in_flight``, neither queued nor running); and the rows of ``prefetch`` (a
        SELECT and its parameters), read in the same round trip on PostgreSQL (psycopg's
        pipeline mode), else None (read them afterwards)."""
        connection = connections[using]
        now = timezone.now()
        params: list[Any] = [token, expires, now]
        if state is not None:
            params.append(state)
        params += [pk, now]
        forms = self.update_sql if connection.in_atomic_block else self.quick_sql
        update = forms["job" if in_flight and state is not None else state is not None]
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


_STATEMENTS: dict[tuple[Any, str], _ClaimStatement] = {}
#: a renewal's answer when the database can't return the cancel flag with it.
UNREAD: Any = object()
_LOST: Any = object()


def _statement(chat_model: Any, using: str) -> _ClaimStatement:
    key = (chat_model, using)
    statement = _STATEMENTS.get(key)
    if statement is None:
        statement = _STATEMENTS[key] = _ClaimStatement(chat_model, using)
    return statement


def attnames(chat_model: Any, using: str) -> list[str]:
    """The chat's column attributes in the order a claim returns them."""
    return _statement(chat_model, using).attnames


class Lease:
    """A held lease on one chat row."""

    def __init__(
        self, chat_model: Any, chat_pk: Any, token: str, seconds: float, using: str = "default"
    ) -> None:
        self.chat_model = chat_model
        self.chat_pk = chat_pk
        self.token = token
        self.seconds = seconds
        self.using = using
        #: set when the lease can't be trusted any more (expired unrenewed, or taken over).
        self.lost = threading.Event()
        #: monotonic time of the last successful renewal (or the take).
        self.renewed_at = time.monotonic()

    def __repr__(self) -> str:
        return f"<Lease chat={self.chat_pk} token={self.token[:6]}…>"

    @property
    def _rows(self) -> Any:
        return self.chat_model._default_manager.using(self.using).filter(
            pk=self.chat_pk, lease_token=self.token
        )

    @classmethod
    def take(
        cls, chat_model: Any, chat_pk: Any, seconds: float | None = None, using: str = "default"
    ) -> Lease | None:
        """The lease if the chat is free (no lease, or an expired one), else None."""
        claimed = claim_row(chat_model, chat_pk, seconds=seconds, using=using)
        return claimed[0] if claimed is not None else None

    def renew(self) -> bool:
        """Push the expiry out; False if the lease is no longer ours."""
        return self._renew() is not _LOST

    def _renew(self) -> Any:
        """Renew; the chat's cancel flag as read by the same statement (``UNREAD`` where the
        database can't return it), or ``_LOST`` when the lease is no longer ours."""
        statement = _statement(self.chat_model, self.using)
        with connections[self.using].cursor() as cursor:
            cursor.execute(*renewal(self))
            if statement.returning:
                row = cursor.fetchone()
                if row is None:
                    return _LOST
                # As the ORM would read it (SQLite gives naive datetimes or text).
                flag = self.flag_from(row[0])
            elif not cursor.rowcount:
                return _LOST
            else:
                flag = UNREAD
        self.renewed_at = time.monotonic()
        return flag

    def flag_from(self, raw: Any) -> Any:
        """The cancel flag as a renewal's RETURNING gave it, converted as the ORM would."""
        return _statement(self.chat_model, self.using).convert("cancel_requested_at", raw)

    def ensure(self) -> Any:
        """Renew, or raise :class:`LeaseLostError` (call first in a write transaction: the
        renewal's row lock makes a would-be taker wait for the commit). Returns the cancel
        flag read by the same statement (``UNREAD`` where it can't be)."""
        flag = _LOST if self.lost.is_set() else self._renew()
        if flag is _LOST:
            self.lost.set()
            raise LeaseLostError(
                f"The lease on chat {self.chat_pk} was lost (expired or taken over); "
                "this process stops without writing."
            )
        return flag

    def release(self, **fields: Any) -> bool:
        """Give the chat up, setting ``fields`` (e.g. state) in the same UPDATE."""
        if self.lost.is_set():
            return False
        values = {"lease_token": "", "lease_expires_at": None, "updated_at": timezone.now()}
        values.update(fields)
        names = tuple(sorted(values))
        key = (self.chat_model, names)
        update = _RELEASES.get(key)
        if update is None:
            # One statement per set of columns, built once per process (a job releases with
            # one of a handful of sets), not an ORM update compiled per job.
            update = _RELEASES[key] = PreparedUpdate(
                self.chat_model, names, (("id", "="), ("lease_token", "="))
            )
        released = bool(
            update.run(self.using, [values[name] for name in names], [self.chat_pk, self.token])
        )
        heartbeats.stop(self)
        return released

    def release_unless_queued(self, **fields: Any) -> str:
        """Release with ``fields`` if no message was queued meanwhile ("released"); if one
        was, release as ``queued`` instead ("queued": send the chat's next job); "lost" when
        the lease is not ours. No extra statement when nothing was queued."""
        if self.lost.is_set():
            return "lost"
        if not _has_inbox(self.chat_model):
            return "released" if self.release(**fields) else "lost"
        values = {"lease_token": "", "lease_expires_at": None, "updated_at": timezone.now()}
        values.update(fields)
        names = tuple(sorted(values))
        key = (self.chat_model, names, "inbox")
        update = _RELEASES.get(key)
        if update is None:
            update = _RELEASES[key] = PreparedUpdate(
                self.chat_model, names, (("id", "="), ("lease_token", "="), ("inbox", "="))
            )
        where = [self.chat_pk, self.token, []]
        if update.run(self.using, [values[name] for name in names], where):
            heartbeats.stop(self)
            return "released"
        if self.release(**{**fields, "state": "queued"}):
            return "queued"
        return "lost"


def renewal(lease: Lease) -> tuple[str, list[Any]]:
    """The renewal's UPDATE (RETURNING the cancel flag where the database can) and its
    parameters, for a statement that writes behind it (``django_store.writes``)."""
    expires = timezone.now() + timedelta(seconds=lease.seconds)
    sql = _statement(lease.chat_model, lease.using).renew_sql
    return sql, [expires, lease.chat_pk, lease.token]


def _has_inbox(chat_model: Any) -> bool:
    return any(field.name == "inbox" for field in chat_model._meta.concrete_fields)


_RELEASES: dict[tuple[Any, ...], PreparedUpdate] = {}


def claim_row(
    chat_model: Any,
    chat_pk: Any,
    *,
    seconds: float | None = None,
    using: str = "default",
    state: str | None = "running",
    prefetch: tuple[str, list[Any]] | None = None,
    in_flight: bool = False,
) -> tuple[Lease, Any, list[Any] | None] | None:
    """Take the lease on a free chat and read its row, in one statement.

    Returns the lease, the row's values (in ``concrete_fields`` order) and the raw rows of
    ``prefetch`` when they could be read in the same round trip; None when another process
    holds the chat (or it does not exist; or, ``in_flight``, it is neither queued nor
    running: a job's claim).
    """
    seconds = float(seconds or agentloop_settings.LEASE_SECONDS)
    token = secrets.token_hex(16)
    statement = _statement(chat_model, using)
    expires = timezone.now() + timedelta(seconds=seconds)
    row, prefetched = statement.run(using, chat_pk, token, expires, state, prefetch, in_flight)
    if row is None:
        return None
    return Lease(chat_model, chat_pk, token, seconds, using), row, prefetched


def claim(
    chat_model: Any,
    chat_pk: Any,
    *,
    using: str = "default",
    prefetch: tuple[str, list[Any]] | None = None,
    in_flight: bool = False,
) -> tuple[Lease, Any, list[Any] | None] | None:
    """Take the lease and load the chat (one statement): ``(lease, chat, prefetched rows)``
    or None if held (see ``claim_row`` for ``prefetch`` and ``in_flight``)."""
    claimed = claim_row(chat_model, chat_pk, using=using, prefetch=prefetch, in_flight=in_flight)
    if claimed is None:
        return None
    lease, row, prefetched = claimed
    chat = chat_model.from_db(using, _statement(chat_model, using).attnames, row)
    return lease, chat, prefetched


class _Heartbeats:
    """One daemon thread per process renewing every lease held here."""

    def __init__(self) -> None:
        self._leases: set[Lease] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, lease: Lease) -> None:
        """Keep ``lease`` alive until :meth:`stop` (or its release)."""
        with self._lock:
            self._leases.add(lease)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="agentloop-heartbeat", daemon=True
                )
                self._thread.start()

    def stop(self, lease: Lease) -> None:
        with self._lock:
            self._leases.discard(lease)

    def _due(self) -> list[Lease]:
        now = time.monotonic()
        with self._lock:
            return [lease for lease in self._leases if now - lease.renewed_at >= lease.seconds / 3]

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._leases:
                    self._thread = None
                    connections.close_all()
                    return
                tick = min(lease.seconds for lease in self._leases) / 6
            self._wake.wait(max(0.05, min(tick, 1.0)))
            for lease in self._due():
                beat(lease)


def beat(lease: Lease) -> None:
    """Renew ``lease`` once; on a database error retry later, and mark it lost before it
    would expire (the step then writes nothing more)."""
    try:
        close_old_connections()
        if not lease.renew():
            lease.lost.set()
            heartbeats.stop(lease)
            logger.warning("Lost the lease on chat %s (taken over)", lease.chat_pk)
    except Exception:
        # A transient error (a restarted server, a dropped connection): drop the connection
        # so the next try opens a new one, and keep trying while the lease still holds.
        logger.warning("Lease renewal for chat %s failed; retrying", lease.chat_pk, exc_info=True)
        try:
            connections[lease.using].close()
        except Exception:  # noqa: S110 - closing a broken connection may fail too
            pass
        margin = max(lease.seconds / 6, 0.1)
        if time.monotonic() - lease.renewed_at >= lease.seconds - margin:
            lease.lost.set()
            heartbeats.stop(lease)
            logger.error(
                "Chat %s: the lease could not be renewed before it expires; the step is "
                "abandoned and writes nothing more",
                lease.chat_pk,
            )


heartbeats = _Heartbeats()

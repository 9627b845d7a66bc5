"""One writer per chat: a lease (token + expiry) on the chat row, taken by every writing verb.

Taking a lease is one conditional UPDATE that also returns the chat row (``claim``), so a
job loads its chat in the same statement that makes it the only writer. While the lease is
held, each write transaction of the Django store starts by renewing it (:meth:`Lease.ensure`,
which locks the row until the transaction ends), and the verb's last write releases it in the
same transaction (:meth:`Lease.release`). A process whose lease was taken over fails that
UPDATE and writes nothing (``LeaseLostError``).

A single heartbeat thread per process renews every lease held here, all of them in one
statement, while a long model call or tool runs. It rides out transient database errors,
retrying until the lease would expire; just before that it marks the lease lost, so the step
writes nothing more and a takeover can't make a tool run twice.

One clock: on PostgreSQL every expiry is set and judged by the database's clock inside the
statement (``clock_timestamp()``), never a worker's, so a host whose clock is ahead can't take
a live lease. (SQLite is one file on one host: its processes share that host's clock.)

A lease records its holder (host, boot, pid and the process's start time). A claimant on the
same host that finds the holder gone (the process died, or its pid now names another process)
takes the chat at once instead of waiting for the expiry; across hosts a dead holder's lease
runs out within three heartbeat periods (``LEASE_SECONDS``; the heartbeat renews every third).

The lease's SQL (the claim, the renewals and the holder's lookup) is built once per chat
model and database. A holder is ``"<host>/<boot>:<pid>:<start time>"``: the host's name
and, on Linux, its boot (a pid means nothing after a reboot), the process id, and the
process's start time (so a pid the kernel gave to another process since doesn't pass for
the holder). Only a holder on this host can be judged; elsewhere the lease's expiry tells.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from django.db import close_old_connections, connections
from django.utils import timezone

from ..conf import agentloop_settings
from ..exceptions import LeaseLostError
from .fields import RowConverters, quick_json_converters
from .instances import instances
from .reconnect import CONNECTION_ERRORS, discard, unusable
from .sql import PreparedUpdate, bound_cursor, recover_prepared
from .waiting import mark_retried, release_connection

__all__ = [
    "Lease",
    "LeaseStatements",
    "UNREAD",
    "attnames",
    "claim",
    "claim_row",
    "heartbeats",
    "holder_alive",
    "holder_id",
    "renewal",
    "lease_statements",
]


_IDENTITY: tuple[int, str] = (0, "")


def holder_id() -> str:
    """This process as a lease holder: ``"<host>/<boot>:<pid>:<start time>"``."""
    global _IDENTITY
    pid = os.getpid()
    if _IDENTITY[0] != pid:  # computed once per process (a forked child is a new holder)
        _IDENTITY = (pid, f"{_host()}:{pid}:{_started(pid) or ''}")
    return _IDENTITY[1]


def _host() -> str:
    """This host: its name and, on Linux, its boot (a pid means nothing after a reboot)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as file:
            boot = file.read().strip()[:8]
    except OSError:
        boot = ""
    name = socket.gethostname()[:180]
    return f"{name}/{boot}" if boot else name


def _stat(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` from the process state on (field 3), or None: no such process."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            text = file.read()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def _started(pid: int) -> str | None:
    """When ``pid`` started (clock ticks after boot; Linux), None where that can't be read."""
    fields = _stat(pid)
    return fields[19] if fields is not None and len(fields) > 19 else None


def holder_alive(holder: str) -> bool | None:
    """Whether the process named by ``holder`` (see :func:`holder_id`) still runs: None when
    this host can't tell (another host, or a holder written by an older version)."""
    try:
        host, pid_text, started = holder.rsplit(":", 2)
        pid = int(pid_text)
    except ValueError:
        return None
    if host != _host():
        return None  # another host: only the lease's expiry tells
    if os.path.isdir("/proc/self"):
        fields = _stat(pid)
        if fields is None or fields[0] in ("Z", "X", "x"):
            return False  # gone, or a zombie nobody reaped yet
        # The pid names another process now when it started at another time.
        return not started or (len(fields) > 19 and fields[19] == started)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
        self.row_converters = RowConverters(self.converters)
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
        connection: Any = None,
    ) -> tuple[Any, list[Any] | None]:
        """The claimed row's values (converted), or None when the chat is held or missing;
        and the rows of ``prefetch`` (a SELECT and its parameters), read in the same round
        trip on PostgreSQL (psycopg's pipeline mode), else None (read them afterwards).
        ``taking_over``: the token of a lease whose holder is gone, taken whatever its expiry;
        ``in_flight`` (a job's claim): only a chat that is queued or running is taken;
        ``connection``: ``connections[using]``, when the caller has it."""
        if connection is None:
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
                row, prefetched = self._pipelined(using, connection, update, params, prefetch)
            except Exception as exc:
                # The server lost a prepared statement (a pooler, a migration): the
                # pipeline's one implicit transaction rolled back, so it runs again.
                retry = recover_prepared(using, exc, connection.connection)
                if not retry or connection.in_atomic_block:
                    raise
                row, prefetched = self._pipelined(using, connection, update, params, prefetch)
        else:
            with bound_cursor(using, connection, update) as cursor:
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
            row = self.row_converters.rows([row], self.compiler.connection)[0]
        return row, prefetched

    def holder(self, using: str, pk: Any) -> tuple[str, str] | None:
        """The chat's lease token and its holder as stored now; None when it doesn't exist."""
        with connections[using].cursor() as cursor:
            cursor.execute(self.holder_sql, [pk])
            row = cursor.fetchone()
        return None if row is None else (str(row[0] or ""), str(row[1] or ""))

    @staticmethod
    def _pipelined(
        using: str,
        connection: Any,
        update: str,
        params: list[Any],
        prefetch: tuple[str, list[Any]],
    ) -> tuple[Any, list[Any]]:
        reading = bound_cursor(using, connection, prefetch[0])
        with bound_cursor(using, connection, update) as cursor, reading as reader:
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


def lease_statements(chat_model: Any, using: str) -> LeaseStatements:
    """The statements of ``chat_model`` on database ``using`` (built on first use)."""
    key = (chat_model, using)
    found = _STATEMENTS.get(key)
    if found is None:
        found = _STATEMENTS[key] = LeaseStatements(chat_model, using)
    return found


def attnames(chat_model: Any, using: str) -> list[str]:
    """The chat's column attributes in the order a claim returns them."""
    return lease_statements(chat_model, using).attnames


logger = logging.getLogger(__name__)


#: a renewal's answer when the database can't return the cancel flag with it.
UNREAD: Any = object()


_LOST: Any = object()


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
        #: monotonic time just before the last successful renewal (or the take) was sent: the
        #: database's expiry is at least ``seconds`` after it.
        self.renewed_at = time.monotonic()
        #: taken inside a caller's transaction: uncommitted, so no other connection can see or
        #: renew it; the row's lock holds others off until that transaction ends.
        self.in_transaction = False
        #: a halt asked for by another process, as a renewal read it ("" when none).
        self.halt_reason = ""
        #: set when a renewal sees a cancel or a halt (the run's checkpoint then reads it).
        self.notice: threading.Event | None = None
        #: set with ``lost`` when the lease was given up because the database could not be
        #: reached before it expired (not taken over): the step is tried again.
        self.unreachable = False
        _HELD[token] = self

    def __repr__(self) -> str:
        return f"<Lease chat={self.chat_pk} token={self.token[:6]}…>"

    @property
    def remaining(self) -> float:
        """Seconds until the lease expires, as far as this process knows (its last renewal)."""
        return self.renewed_at + self.seconds - time.monotonic()

    @property
    def margin(self) -> float:
        """How long before expiry a holder gives up: early enough that the database's clock
        agrees it still held the lease."""
        return max(self.seconds / 6, 0.1)

    def give_up_unreachable(self) -> None:
        """Give the lease up: the database could not be reached before it expires."""
        self.unreachable = True
        self.lost.set()

    def held_again(self, renewed_at: float) -> None:
        """A write conditional on this lease's token renewed it after it was given up as
        unreachable (a computed result's, ``reconnect.retried``'s ``keep``): no other process
        took the chat meanwhile, so it is held again, renewed from ``renewed_at``."""
        self.renewed_at = renewed_at
        if self.unreachable:
            self.unreachable = False
            self.lost.clear()
            heartbeats.start(self)

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
        statement = lease_statements(self.chat_model, self.using)
        sent = time.monotonic()
        with connections[self.using].cursor() as cursor:
            cursor.execute(*renewal(self))
            if statement.returning:
                row = cursor.fetchone()
                if row is None:
                    return _LOST
                flag = self.observe(row[0], row[1])
            elif not cursor.rowcount:
                return _LOST
            else:
                flag = UNREAD
        self.renewed_at = sent
        return flag

    def observe(self, raw_flag: Any, halt_reason: Any) -> Any:
        """What a renewal read with the chat row: keeps a halt asked for elsewhere; returns
        the cancel flag, converted as the ORM would."""
        if halt_reason:
            self.halt_reason = str(halt_reason)
        return lease_statements(self.chat_model, self.using).convert(
            "cancel_requested_at", raw_flag
        )

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

    def forget(self) -> None:
        """This process is done with the lease (released, lost, or given up after an error):
        the heartbeat stops, and a claim from this process may take it if it is still held."""
        heartbeats.stop(self)
        if _HELD.get(self.token) is self:
            del _HELD[self.token]

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
        try:
            return bool(
                update.run(self.using, [values[name] for name in names], [self.chat_pk, self.token])
            )
        finally:
            self.forget()  # the step ends here, whatever the statement did

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
        try:
            released = update.run(self.using, [values[name] for name in names], where)
        except BaseException:
            self.forget()  # the step ends here, whatever the statement did
            raise
        if released:
            self.forget()
            return "released"
        if self.release(**{**fields, "state": "queued"}):
            return "queued"
        return "lost"


def renewal(lease: Lease) -> tuple[str, list[Any]]:
    """The renewal's UPDATE (RETURNING the cancel flag and the halt reason where the database
    can) and its parameters, for a statement that writes behind it (``django_store.writes``)."""
    statement = lease_statements(lease.chat_model, lease.using)
    expiry, _ = statement.clock(lease.seconds)
    return statement.renew_sql, [*expiry, lease.chat_pk, lease.token]


def _has_inbox(chat_model: Any) -> bool:
    found = _INBOXES.get(chat_model)
    if found is None:
        found = _INBOXES[chat_model] = any(
            field.name == "inbox" for field in chat_model._meta.concrete_fields
        )
    return found


_INBOXES: dict[Any, bool] = {}


_RELEASES: dict[tuple[Any, ...], PreparedUpdate] = {}


#: the leases this process holds, by token (a lease left in the database by this process but
#: held by no live ``Lease`` here was leaked by an error, and may be taken at once).
_HELD: weakref.WeakValueDictionary[str, Lease] = weakref.WeakValueDictionary()


def _gone(token: str, holder: str) -> bool:
    """The lease ``token`` can be taken whatever its expiry: its holder is gone, or it is this
    process and no lease here holds it any more (an error left it behind)."""
    if not token or not holder:
        return False
    if holder == holder_id():
        held = _HELD.get(token)
        # Given up as unreachable, a step may still be writing its result (``held_again``).
        return held is None or (held.lost.is_set() and not held.unreachable)
    return holder_alive(holder) is False


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
    holds the chat (or it does not exist; or, ``in_flight``, a job's claim, it is neither
    queued nor running). A lease whose holder is known to be gone (a dead process on this
    host) is taken over at once, with one more statement to find that out.
    """
    seconds = float(seconds or agentloop_settings.LEASE_SECONDS)
    token = secrets.token_hex(16)
    statement = lease_statements(chat_model, using)
    sent = time.monotonic()
    connection = connections[using]  # this thread's (the same wrapper after a reconnect)
    row, prefetched = _claiming(
        using, connection, lambda: statement.run(using, chat_pk, token, seconds, state, prefetch,
                                                 in_flight=in_flight, connection=connection)
    )  # fmt: skip
    if row is None:
        held = statement.holder(using, chat_pk)
        if held is not None and held[0] == token:
            # Our own claim: it committed on a connection that dropped before its answer
            # came, and ran again (``_claiming``). Take it as it stands now.
            held = (token, "")
        elif held is None or not _gone(*held):
            return None
        row, prefetched = statement.run(
            using, chat_pk, token, seconds, state, prefetch, taking_over=held[0],
            in_flight=in_flight,
        )  # fmt: skip
        if row is None:
            return None  # someone else took it first
        if held[1]:
            logger.warning(
                "Chat %s: took over the lease of %s, a process on this host that is gone",
                chat_pk,
                held[1],
            )
    lease = Lease(chat_model, chat_pk, token, seconds, using)
    lease.renewed_at = sent
    lease.in_transaction = connection.in_atomic_block
    return lease, row, prefetched


def _claiming(using: str, connection: Any, work: Any) -> Any:
    """The claim's ``work()``, on a connection the pool hands out without its health check
    (``CONN_HEALTH_CHECKS``: a round trip per check-out); when that connection turns out to
    be dropped (a server restart, a pooler's idle timeout), once more on a new one, checked.
    Running it again is safe: the claim's token is the same, and a claim that committed
    before its answer was lost is found by it. A connection that can't be had at all (a pool
    timeout, a refused connection) raises at once, as before; inside a caller's transaction
    nothing is retried."""
    if connection.in_atomic_block:
        return work()
    outer = mark_retried(True)
    try:
        return work()
    except CONNECTION_ERRORS:
        if connection.connection is None or not unusable(using):
            raise  # never connected, or the statement failed, not the connection
        discard(using)
    finally:
        mark_retried(outer)
    logger.warning("A claim's connection was dropped; trying it once more on a new one")
    return work()


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
    chat = instances(chat_model).from_db(using, row)
    return lease, chat, prefetched


class _Heartbeats:
    """One daemon thread per process renewing every lease held here, in one statement per
    chat model and database."""

    def __init__(self) -> None:
        self._leases: set[Lease] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, lease: Lease) -> None:
        """Keep ``lease`` alive until :meth:`stop` (or its release)."""
        if lease.in_transaction:
            # Uncommitted: the heartbeat's own connection can't see it (and would wait on
            # its row lock); the lock itself keeps others off until the transaction ends.
            return
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
            due = self._due()
            if due:
                beat(*due)
                for using in {lease.using for lease in due}:
                    release_connection(using)  # back to Django's pool between beats


#: the most leases one renewal statement names (a few thousand parameters at most).
_BATCH = 500


def beat(*leases: Lease) -> None:
    """Renew ``leases`` (one statement per chat model, database and lease length); on a
    database error retry later, and mark a lease lost before it would expire (its step then
    writes nothing more)."""
    groups: dict[tuple[Any, str, float], list[Lease]] = {}
    for lease in leases:
        if lease.lost.is_set():  # given up by its step: never renewed again
            heartbeats.stop(lease)
            continue
        groups.setdefault((lease.chat_model, lease.using, lease.seconds), []).append(lease)
    for (_, using, _), group in groups.items():
        for start in range(0, len(group), _BATCH):
            batch = group[start : start + _BATCH]
            sent = time.monotonic()
            try:
                close_old_connections()
                renewed = _renew_many(batch)
            except Exception:
                # A transient error (a restarted server, a dropped connection): drop the
                # connection so the next try opens a new one; keep trying while leases hold.
                logger.warning("Lease renewal failed; retrying", exc_info=True)
                try:
                    connections[using].close()
                except Exception:  # noqa: S110 - closing a broken connection may fail too
                    pass
                for lease in batch:
                    _give_up_if_expiring(lease)
                continue
            for lease in batch:
                _renewed(lease, renewed, sent)


def _renewed(lease: Lease, renewed: dict[tuple[str, str], tuple[Any, Any]], sent: float) -> None:
    signals = renewed.get((str(lease.chat_pk), lease.token))
    if signals is None:
        if _HELD.get(lease.token) is lease:  # not released meanwhile: taken over
            lease.lost.set()
            heartbeats.stop(lease)
            logger.warning("Lost the lease on chat %s (taken over)", lease.chat_pk)
        return
    lease.renewed_at = sent
    if signals[0] is UNREAD:
        return
    flag = lease.observe(*signals)
    notice = lease.notice
    if notice is not None and (flag is not None or lease.halt_reason):
        # A cancel or a halt from elsewhere: the next checkpoint reads it; a cancel also cuts
        # a model call in flight (the watchdog), with or without Redis.
        if flag is not None:
            notice.cancelling = True  # type: ignore[attr-defined]
        notice.set()


def _renew_many(leases: Iterable[Lease]) -> dict[tuple[str, str], tuple[Any, Any]]:
    """Renew ``leases`` (one chat model, database and length) in one statement: the renewed
    ones' cancel flags and halt reasons, by (str(pk), token)."""
    leases = list(leases)
    first = leases[0]
    statement = lease_statements(first.chat_model, first.using)
    expiry, _ = statement.clock(first.seconds)
    params: list[Any] = list(expiry)
    for lease in leases:
        params += [lease.chat_pk, lease.token]
    with connections[first.using].cursor() as cursor:
        if not statement.returning:  # an old SQLite: one statement each
            found: dict[tuple[str, str], tuple[Any, Any]] = {}
            for lease in leases:
                cursor.execute(*renewal(lease))
                if cursor.rowcount:
                    found[str(lease.chat_pk), lease.token] = (UNREAD, "")
            return found
        cursor.execute(statement.renew_many_sql(len(leases)), params)
        return {(str(pk), token): (flag, halt) for pk, token, flag, halt in cursor.fetchall()}


def _give_up_if_expiring(lease: Lease) -> None:
    if lease.remaining <= lease.margin:
        lease.give_up_unreachable()
        heartbeats.stop(lease)
        logger.error(
            "Chat %s: the lease could not be renewed before it expires; the step is "
            "abandoned and writes nothing more (but a result it computed, if the database "
            "comes back before another process takes the chat)",
            lease.chat_pk,
        )


heartbeats = _Heartbeats()

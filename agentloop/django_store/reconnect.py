"""Connection faults are transient: a dropped, refused or timed-out connection is closed and
the work runs again on a new one while the chat's lease is still valid.

Django leaves a connection that failed this way broken until something closes it (it
reconnects only at a request's boundaries), so a step whose connection dropped while a tool
or a stream ran would fail every statement after, its release included. Here the store
closes it, waits a little and tries again. A write whose statement may have committed
before its answer was lost is looked for first (``landed``), so nothing is written twice.
When the lease would expire before the work succeeds, the lease is marked lost (the step
writes nothing more) and the chat is left for the next job.

A computed result (a tool's, a model's answer) is not given up that way: its write goes on
being tried past the lease's expiry, for up to ``RESULT_OUTLASTS_LEASE`` seconds more. Its
statement is conditional on the lease's token, so it lands only if no other process took
the chat meanwhile (while the database is out of reach, none can); then the lease is held
again and the step goes on. Nothing else runs meanwhile: the lease counts as given up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from django.db import InterfaceError, OperationalError, connections

from ..exceptions import LeaseLostError
from .waiting import mark_retried

__all__ = [
    "CONNECTION_ERRORS",
    "RESULT_OUTLASTS_LEASE",
    "committed_message",
    "discard",
    "is_connection_fault",
    "retried",
    "unusable",
]

logger = logging.getLogger("agentloop")

T = TypeVar("T")


class Held(Protocol):
    """What ``retried`` needs of a lease (``leases.Lease``; named here by its shape, since
    ``leases`` itself retries its claim with this module's helpers)."""

    chat_pk: Any
    lost: threading.Event

    @property
    def remaining(self) -> float: ...

    @property
    def margin(self) -> float: ...

    @property
    def unreachable(self) -> bool: ...

    def give_up_unreachable(self) -> None: ...


#: what a dropped or refused connection, or a pool with none to give, raises (Django's own
#: wrappers of the driver's errors; psycopg_pool's timeout is an OperationalError too).
CONNECTION_ERRORS = (OperationalError, InterfaceError)

#: the first wait before trying again on a new connection, and the longest.
_FIRST_WAIT = 0.05
_LONGEST_WAIT = 1.0
#: seconds past its lease's expiry a computed result's write goes on being tried (``retried``'s
#: ``keep``): a database outage shorter than the lease plus this loses no result.
RESULT_OUTLASTS_LEASE = 300.0


def is_connection_fault(error: BaseException) -> bool:
    """Whether ``error`` is a transient database error: a job tries the step again later."""
    return isinstance(error, CONNECTION_ERRORS)


def unusable(using: str) -> bool:
    """The connection failed, not the statement: never opened (refused, a pool timeout), or
    closed or broken by the driver (dropped). SQLite's errors leave it usable."""
    raw = connections[using].connection
    if raw is None:
        return True
    return bool(getattr(raw, "closed", False) or getattr(raw, "broken", False))


def discard(using: str) -> None:
    """Close this thread's connection to ``using``, so the next statement opens a new one."""
    try:
        connections[using].close()
    except Exception:  # noqa: S110 - closing a broken connection may fail too
        pass


def committed_message(record: Any, chat_pk: Any, using: str) -> Any | None:
    """The key of ``record``, a message row a write inserted, if that write committed (its
    answer may have been lost): found by chat, role and creation time (set here, to the
    microsecond, before the first try); None when it is not there."""
    rows = type(record)._default_manager.using(using)
    found = rows.filter(chat_id=chat_pk, role=record.role, created_at=record.created_at)
    return found.values_list("pk", flat=True).first()


def retried(
    lease: Held | None,
    using: str,
    work: Callable[[], T],
    *,
    landed: Callable[[], T | None] | None = None,
    keep: bool = False,
) -> T:
    """``work()``; after a connection fault, again on a new connection until it succeeds or
    ``lease`` would expire (then ``LeaseLostError``: the lease is marked lost).

    ``landed`` (for a write) says whether a failed try committed after all, its result then
    standing for the write's; it runs before each new try. Inside a caller's transaction,
    without a lease, or on an error that left the connection usable, nothing is retried.
    ``keep`` (a computed result's write, conditional on the lease's token): past the lease's
    expiry the lease is given up (nothing else runs) but this goes on being tried, for up to
    ``RESULT_OUTLASTS_LEASE`` seconds more, unless the lease was taken over."""
    wait = _FIRST_WAIT
    failed = False
    connection = connections[using]  # this thread's: the same wrapper after a reconnect
    while True:
        outer = mark_retried(lease is not None and not connection.in_atomic_block)
        try:
            if failed and landed is not None:
                done = landed()
                if done is not None:
                    return done
            return work()
        except CONNECTION_ERRORS as exc:
            if lease is None or connection.in_atomic_block or not unusable(using):
                raise
            discard(using)
            failed = True
            left = lease.remaining - lease.margin
            if lease.lost.is_set() or left <= wait:
                taken = lease.lost.is_set() and not lease.unreachable
                if not keep or taken or left + RESULT_OUTLASTS_LEASE <= wait:
                    lease.give_up_unreachable()
                    raise LeaseLostError(
                        f"Chat {lease.chat_pk}: the database could not be reached before the "
                        f"lease ran out ({exc}); this step writes nothing more."
                    ) from exc
                if not lease.lost.is_set():
                    logger.warning(
                        "Chat %s: the database is still out of reach as the lease runs out; "
                        "the result is written once it is back, unless another process took "
                        "the chat meanwhile",
                        lease.chat_pk,
                    )
                lease.give_up_unreachable()  # nothing else of the step runs meanwhile
            logger.warning(
                "Chat %s: database connection failed (%s); trying again on a new one",
                lease.chat_pk,
                str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
            )
            time.sleep(wait)
            wait = min(wait * 2, _LONGEST_WAIT)
        finally:
            mark_retried(outer)

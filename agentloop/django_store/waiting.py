"""Giving the database connection back while a step waits (docs/background.md, choosing a pool).

A step claims and reads, then waits on a model or a tool for seconds, then writes. Holding
the connection across the wait ties one PostgreSQL backend to every chat in flight; giving
it back ties them to the pool's size instead. With Django's pool (``OPTIONS["pool"]``,
Django 5.1+) giving back is a check-in and taking again a check-out, a few tens of
microseconds; without one it is a new connection per wait (a few milliseconds, and the
connection's prepared statements are lost), so by default ("auto") only a pool releases.
"""

from __future__ import annotations

import threading
from typing import Any

from django.db import connections

from ..conf import agentloop_settings

__all__ = ["gives_back", "mark_retried", "release_connection"]

#: whether the statements this thread (greenlet, under gevent) runs now are tried again on a
#: new connection after a fault (``reconnect.retried``, with a lease, outside a transaction).
_retried = threading.local()


def mark_retried(on: bool) -> bool:
    """Mark this thread's next statements as retried (or not); returns the mark before."""
    before: bool = getattr(_retried, "on", False)
    _retried.on = on
    return before


def gives_back(connection: Any) -> bool:
    """Whether ``AGENTLOOP["RELEASE_CONNECTIONS"]`` has ``connection`` given back during waits."""
    setting = agentloop_settings.RELEASE_CONNECTIONS
    if setting == "auto":
        return bool(connection.settings_dict.get("OPTIONS", {}).get("pool"))
    return bool(setting)


def release_connection(using: str) -> None:
    """Give ``using``'s connection of this thread back, when it has one, the setting says so,
    and no transaction is open on it (a caller's ``atomic()`` keeps its connection)."""
    if agentloop_settings.RELEASE_CONNECTIONS == "auto" and not _pooled(using):
        return  # known without this thread's connection (a step waits a few times)
    connection = connections[using]
    raw = connection.connection
    if raw is None or connection.in_atomic_block or not gives_back(connection):
        return
    # psycopg_pool's, on the connections it hands out (and taken off as they go back).
    pool = getattr(raw, "_pool", None)
    connection.close()
    if pool is not None:
        _next_out(pool, raw)
        _check_unless_retrying(pool)


def _pooled(using: str) -> bool:
    # The database's settings: the dict its connections hold as ``settings_dict``.
    settings = connections.settings.get(using)
    if settings is None:
        return True  # not known here: as the connection says
    return bool(settings.get("OPTIONS", {}).get("pool"))


def _check_unless_retrying(pool: Any) -> None:
    """With ``CONN_HEALTH_CHECKS`` the pool checks each connection it hands out (a round
    trip). A step's claim and its writes after a wait run once more on a new connection when
    the one handed out was dropped (``leases._claiming``, ``reconnect.retried``), so the
    check is skipped for them (two round trips fewer per step). Everything else is checked
    as before."""
    check = getattr(pool, "_check", None)
    if check is None or getattr(check, "agentloop_retrying", False):
        return

    def checked(conn: Any) -> None:
        if not getattr(_retried, "on", False):
            check(conn)

    checked.agentloop_retrying = True  # type: ignore[attr-defined]
    pool._check = checked


def _next_out(pool: Any, raw: Any) -> None:
    """Make ``raw``, just checked in, the pool's next check-out. psycopg_pool hands out the
    connection idle the longest: with two idle, a zero-latency step would switch server
    processes at every wait (``bench/in_flight.py --release-cost``: 1.14x to 1.17x a job that
    keeps its connection, against 1.03x to 1.07x with one). The one just used is warm; the
    others stay idle, and the pool's ``max_idle`` closes those no longer needed."""
    idle = getattr(pool, "_pool", None)
    lock = getattr(pool, "_lock", None)
    if idle is None or lock is None:  # pragma: no cover - another psycopg_pool: leave it
        return
    with lock:
        if len(idle) > 1 and idle[-1] is raw:
            idle.rotate(1)

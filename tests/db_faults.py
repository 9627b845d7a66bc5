"""Faults a test inflicts on its OWN PostgreSQL test database (never on the server): drop a
connection (``pg_terminate_backend``) or refuse new ones for a while (``ALLOW_CONNECTIONS``).

Each helper opens a short-lived psycopg connection of its own (to the test database, or to
the ``postgres`` database for ``ALTER DATABASE``), so the connections under test are untouched.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connections

__all__ = ["backend_pid", "refusing_connections", "terminate", "terminate_all"]


def _admin(dbname: str | None = None) -> Any:
    # Function-local: psycopg is the "postgres" extra; these helpers run on PostgreSQL only.
    import psycopg

    settings = connections["default"].settings_dict
    return psycopg.connect(
        dbname=dbname or settings["NAME"],
        user=settings["USER"] or None,
        password=settings["PASSWORD"] or None,
        host=settings["HOST"] or None,
        port=settings["PORT"] or None,
        autocommit=True,
    )


def backend_pid(using: str = "default") -> int:
    """The server process behind this thread's connection (connecting it if needed)."""
    connection = connections[using]
    connection.ensure_connection()
    return int(connection.connection.info.backend_pid)


def terminate(*pids: int) -> None:
    """Drop these connections, as a server restart or a network cut would, and wait until
    their server processes are gone."""
    with _admin() as admin:
        for pid in pids:
            admin.execute("SELECT pg_terminate_backend(%s, 10000)", [pid])


def terminate_all() -> int:
    """Drop every connection to the test database (this thread's too: it is closed, to be
    opened again by the next query); how many were dropped."""
    with _admin("postgres") as admin:
        dropped = _terminate_all(admin)
    connections.close_all()
    return dropped


def _terminate_all(admin: Any) -> int:
    name = connections["default"].settings_dict["NAME"]
    rows = admin.execute(
        "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
        "WHERE datname = %s AND pid <> pg_backend_pid()",
        [name],
    ).fetchall()
    return len(rows)


@contextmanager
def refusing_connections() -> Iterator[None]:
    """The test database refuses new connections (and its open ones, this thread's too, are
    dropped) inside the block; it accepts them again after it, whatever happened."""
    name = connections["default"].settings_dict["NAME"]
    quoted = '"' + name.replace('"', '""') + '"'
    with _admin("postgres") as admin:
        admin.execute(f"ALTER DATABASE {quoted} ALLOW_CONNECTIONS false")  # noqa: S608
        try:
            _terminate_all(admin)
            yield
        finally:
            admin.execute(f"ALTER DATABASE {quoted} ALLOW_CONNECTIONS true")  # noqa: S608
            connections.close_all()  # this thread's were dropped: the next query reconnects

"""Faults a test inflicts on its OWN PostgreSQL test database (never on the server): drop a
connection (``pg_terminate_backend``) or refuse new ones for a while (``ALLOW_CONNECTIONS``).

Each helper opens a short-lived psycopg connection of its own (to the test database, or to
the ``postgres`` database for ``ALTER DATABASE``), so the connections under test are untouched.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connections

__all__ = [
    "LosingProxy",
    "backend_pid",
    "lose_next_reply",
    "refusing_connections",
    "terminate",
    "terminate_all",
    "through_proxy",
]


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


class LosingProxy:
    """A TCP proxy in front of PostgreSQL, owned by the test: after :meth:`lose_next_reply`
    it drops the next answer the server sends and cuts that connection, as a network failure
    just after a statement committed would (the server flushes its answer after the commit)."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.cuts = 0
        self._armed = False
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def lose_next_reply(self) -> None:
        with self._lock:
            self._armed = True

    def close(self) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _cut(self) -> bool:
        with self._lock:
            armed, self._armed = self._armed, False
            self.cuts += armed
            return armed

    def _pump(self, source: socket.socket, target: socket.socket, replies: bool) -> None:
        try:
            while data := source.recv(65536):
                if replies and self._cut():
                    break
                target.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, target):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                end.close()


#: the proxy the current test's connections go through (see ``lose_next_reply``).
proxy: LosingProxy | None = None


def lose_next_reply() -> None:
    """The current test's proxy drops the next answer from the server (a tool calls it)."""
    if proxy is None:
        raise RuntimeError("no LosingProxy in front of the database in this test")
    proxy.lose_next_reply()


@contextmanager
def through_proxy() -> Iterator[LosingProxy]:
    """Every new connection of this process goes through a :class:`LosingProxy`."""
    global proxy
    settings = connections["default"].settings_dict
    saved = settings["HOST"], settings["PORT"]
    proxy = LosingProxy(saved[0] or "127.0.0.1", int(saved[1] or 5432))
    connections.close_all()
    settings["HOST"], settings["PORT"] = "127.0.0.1", str(proxy.port)
    try:
        yield proxy
    finally:
        settings["HOST"], settings["PORT"] = saved
        connections.close_all()
        proxy.close()
        proxy = None

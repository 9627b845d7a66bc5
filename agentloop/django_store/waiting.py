"""Giving the database connection back while a step waits (docs/background.md, choosing a pool).

A step claims and reads, then waits on a model or a tool for seconds, then writes. Holding
the connection across the wait ties one PostgreSQL backend to every chat in flight; giving
it back ties them to the pool's size instead. With Django's pool (``OPTIONS["pool"]``,
Django 5.1+) giving back is a check-in and taking again a check-out, a few tens of
microseconds; without one it is a new connection per wait (a few milliseconds, and the
connection's prepared statements are lost), so by default ("auto") only a pool releases.
"""

from __future__ import annotations

from typing import Any

from django.db import connections

from ..conf import agentloop_settings

__all__ = ["gives_back", "release_connection"]


def gives_back(connection: Any) -> bool:
    """Whether ``AGENTLOOP["RELEASE_CONNECTIONS"]`` has ``connection`` given back during waits."""
    setting = agentloop_settings.RELEASE_CONNECTIONS
    if setting == "auto":
        return bool(connection.settings_dict.get("OPTIONS", {}).get("pool"))
    return bool(setting)


def release_connection(using: str) -> None:
    """Give ``using``'s connection of this thread back, when it has one, the setting says so,
    and no transaction is open on it (a caller's ``atomic()`` keeps its connection)."""
    connection = connections[using]
    if connection.connection is None or connection.in_atomic_block:
        return
    if gives_back(connection):
        connection.close()

"""Django's connection pool, seen from one process: ``pooled_waits.py`` (the test sets
``AGENTLOOP_TEST_DB_POOL``).

Gives the connection back five times, reading ``pg_backend_pid()`` between (which server
process each check-out got), then runs a streamed ``ask()`` whose provider records, at the
start of the model call and after each chunk, whether this thread holds a connection and
how many of the pool's connections are idle. Counts the connections the ask checked out
and the pool's checks of them (``CONN_HEALTH_CHECKS``). Then terminates the server processes
of every idle pooled connection (from a connection of its own, as a server restart or a
pooler's idle timeout would) and asks again: the claim, handed a dropped connection
unchecked, runs once more on a new one. Prints ``SUMMARY {json}``.
"""

from __future__ import annotations

import json
from typing import Any

import django


def main() -> None:
    from psycopg_pool import ConnectionPool

    checked = []
    check = ConnectionPool.check_connection  # Django hands this to the pool it makes

    def counted(conn: Any) -> None:
        checked.append(conn)
        check(conn)

    ConnectionPool.check_connection = staticmethod(counted)  # type: ignore[method-assign]
    django.setup()
    from django.db import connection

    from agentloop import providers
    from agentloop.django_store.waiting import release_connection
    from agentloop.messages import ModelResponse, TextDelta
    from agentloop.models import Chat
    from agentloop.providers import Provider

    connection.ensure_connection()  # opens the pool
    release_connection("default")
    pool = connection.pool
    pool.wait(timeout=30)  # its min_size connections are open and idle
    pids = []
    for _ in range(5):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pids.append(cursor.fetchone()[0])
        release_connection("default")

    seen: list[dict[str, Any]] = []

    class Watching(Provider):
        name = "watching"

        def _look(self) -> None:
            stats = pool.get_stats()
            seen.append(
                {
                    "held": connection.connection is not None,
                    "idle": stats["pool_available"],
                    "size": stats["pool_size"],
                }
            )

        def request(self, request: Any, on_chunk: Any = None) -> Any:
            self._look()
            for word in ("a ", "b"):
                if on_chunk is not None:
                    on_chunk(TextDelta(text=word))
                    self._look()
            return ModelResponse(content="a b")

    providers.register("watching", Watching())
    chat = Chat.objects.create(model="watching:m")
    release_connection("default")
    checks, requests = len(checked), pool.get_stats()["requests_num"]
    answer = chat.ask("Hi", stream=lambda chunk: None)
    check_outs = pool.get_stats()["requests_num"] - requests
    ask_checks = len(checked) - checks
    during_ask = list(seen)

    import psycopg

    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with psycopg.connect(**params, autocommit=True) as killer:
        terminated = killer.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND application_name = %s",
            [params.get("application_name", "")],
        ).fetchone()[0]
    checks = len(checked)
    again = chat.ask("Again", stream=lambda chunk: None)
    summary = {
        "pids": pids,
        "during_ask": during_ask,
        "answer": answer.content,
        "check_outs": check_outs,
        "checks": ask_checks,
        "terminated": terminated,
        "answer_after_termination": again.content,
        "checks_after_termination": len(checked) - checks,
        "messages": list(chat.messages.values_list("role", "content")),
    }
    print("SUMMARY " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()

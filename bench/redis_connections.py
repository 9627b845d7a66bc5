"""Redis connections of one worker process running many chats at once.

    python bench/redis_connections.py [--pool threads|gevent] [--concurrency 100] [--chats 100]

One ``celery worker`` with a ``threads`` (or ``gevent``) pool of ``--concurrency`` runs
``--chats`` chats at once, each streaming an answer (``stream:400:0.05``, 20 s) with live
events and cancel notices on a private ``redis-server`` this script starts (so every
connection to it is agentloop's; Celery's broker is the usual Redis). While the chats
stream, it counts the worker process's connections to that server (``CLIENT LIST``, matched
to the worker's sockets through /proc) and the chats streaming; then it cancels every chat
(over Redis) and waits until none runs. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.workers import (  # noqa: E402
    DEFAULT_DATABASE_URL,
    DEFAULT_REDIS_URL,
    empty_tables,
    machine,
    setup,
    workers,
)
from tests.redis_server import RedisServer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pool", default="threads", choices=["threads", "gevent"])
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--chats", type=int, default=100)
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    parser.add_argument("--broker-url", default=DEFAULT_REDIS_URL)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp))
        server.start()
        try:
            print(json.dumps({**measure(args, server), "machine": machine()}))
        finally:
            server.stop()


def measure(args: argparse.Namespace, server: RedisServer) -> dict[str, object]:
    agentloop = {"REDIS_URL": server.url(), "CANCEL_POLL_INTERVAL": 600,
                 "PARTIAL_SAVE_INTERVAL": 2.0}  # fmt: skip
    setup(args.database_url, args.broker_url, agentloop)
    from django.db import transaction

    from agentloop.models import Chat, Usage

    empty_tables()
    started: list = []
    with workers(args.concurrency, agentloop, pool=args.pool, started=started.append):
        worker = started[0]
        with transaction.atomic():
            chats = [Chat.objects.create(model="rules:stream") for _ in range(args.chats)]
            for number, chat in enumerate(chats):
                chat.ask_later(f"stream:400:0.05 chat-{number}").complete_later()
        most_streaming, most_connections, names = 0, 0, set()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            streaming = Chat.objects.filter(state="running").count()
            connections = server.connections_of(worker.pid)
            most_streaming = max(most_streaming, streaming)
            if streaming >= most_streaming:
                most_connections = max(most_connections, len(connections))
                names |= {c["name"] for c in connections}
            time.sleep(0.5)
        for chat in chats:
            chat.cancel()
        settle = time.monotonic() + 120
        while Chat.objects.filter(state__in=["queued", "running"]).exists():
            if time.monotonic() > settle:
                break
            time.sleep(0.2)
        cancelled = Usage.objects.filter(status="cancelled").count()
        in_flight = Chat.objects.filter(state__in=["queued", "running"]).count()
        return {
            "pool": args.pool,
            "concurrency": args.concurrency,
            "chats": args.chats,
            "most_chats_streaming_at_once": most_streaming,
            "worker_redis_connections_then": most_connections,
            "connection_names": sorted(names),
            "calls_cancelled_mid_stream": cancelled,
            "chats_still_running_after_the_cancels": in_flight,
        }


if __name__ == "__main__":
    main()

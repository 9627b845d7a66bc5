"""Shared by the background benchmarks: the database, Celery worker processes, percentiles."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/agentloop_bench_background"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/13"  # the tests use 14 (emptied by tests) and 15
DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"


def setup(
    database_url: str,
    redis_url: str,
    agentloop: dict[str, Any] | None = None,
    *,
    broker_url: str | None = None,
) -> None:
    """Create and migrate the benchmark database; configure Django in this process.

    The Celery broker is ``broker_url`` (Redis or RabbitMQ), else ``redis_url``.
    """
    import psycopg
    from psycopg import sql

    parts = urlsplit(database_url)
    name = parts.path.lstrip("/")
    try:
        maintenance = urlunsplit(parts._replace(path="/postgres"))
        with psycopg.connect(maintenance, autocommit=True, connect_timeout=3) as conn:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    except psycopg.OperationalError as exc:
        sys.exit(
            f"PostgreSQL is not reachable: {str(exc).strip()}\n"
            "Start it with `bash scripts/services.sh start`, or pass --database-url."
        )
    try:
        import redis

        redis.Redis.from_url(redis_url, socket_connect_timeout=2).ping()
    except Exception as exc:
        sys.exit(
            f"Redis is not reachable at {redis_url}: {exc}\n"
            "Start it with `bash scripts/services.sh start`, or pass --redis-url."
        )
    broker_url = broker_url or redis_url
    if not broker_url.startswith("redis"):
        _check_broker(broker_url)
    os.environ["BENCH_DATABASE_URL"] = database_url
    os.environ["BENCH_BROKER_URL"] = broker_url
    os.environ["BENCH_AGENTLOOP"] = json.dumps(agentloop or {})
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.background_settings"
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0, interactive=False)
    if not _schema_matches_models():
        # A migration edited in place (early development): these tables only hold bench rows.
        print("agentloop tables don't match the models: recreating them", file=sys.stderr)
        from django.db import connection

        with connection.cursor() as cursor:
            for table in connection.introspection.table_names(cursor):
                if table.startswith("agentloop_"):
                    cursor.execute(f'DROP TABLE IF EXISTS "{table}" CASCADE')
            cursor.execute("DELETE FROM django_migrations WHERE app = 'agentloop'")
        call_command("migrate", verbosity=0, interactive=False)


def _check_broker(url: str) -> None:
    """Exit with a clear line if the broker (e.g. RabbitMQ) does not answer."""
    from kombu import Connection  # local: Celery (and kombu) are an optional extra

    try:
        with Connection(url, connect_timeout=3) as connection:
            connection.ensure_connection(max_retries=1)
    except Exception as exc:
        sys.exit(
            f"The broker is not reachable at {url}: {exc}\n"
            "Start the broker, or pass another --broker."
        )


def _schema_matches_models() -> bool:
    from django.apps import apps
    from django.db import DatabaseError, connection

    for model in apps.get_app_config("agentloop").get_models():
        columns = ", ".join(f'"{field.column}"' for field in model._meta.concrete_fields)
        try:
            with connection.cursor() as cursor:
                cursor.execute(f'SELECT {columns} FROM "{model._meta.db_table}" LIMIT 0')
        except DatabaseError:
            return False
    return True


def empty_tables() -> None:
    from agentloop.models import Chat, Usage

    Usage.objects.all().delete()
    Chat.objects.all().delete()


def use_queue(queue: str) -> None:
    """Publish from this process to ``queue`` (the workers consume it)."""
    from bench.celery_app import app

    app.conf.task_default_queue = queue


@contextmanager
def workers(
    concurrency: int,
    agentloop: dict[str, Any],
    *,
    env: dict[str, str] | None = None,
    pool: str = "prefork",
    started: Callable[[subprocess.Popen[bytes]], None] | None = None,
    processes: int = 1,
) -> Iterator[str]:
    """``processes`` ``celery worker``s (one by default) with ``concurrency`` processes
    (threads, greenlets: ``pool``) each, on one fresh queue (yielded); ``started`` is given
    each worker's process once it consumes."""
    queue = f"agentloop-bench-{uuid.uuid4().hex[:8]}"
    # A plain `kill` of the benchmark must stop its workers too (the finally below).
    signal.signal(signal.SIGTERM, lambda *args: sys.exit("terminated"))
    with tempfile.TemporaryDirectory() as tmp:
        running: list[tuple[subprocess.Popen[bytes], Path, Path]] = []
        try:
            for number in range(processes):
                ready, log = Path(tmp) / f"ready-{number}", Path(tmp) / f"worker-{number}.log"
                process_env = {
                    **os.environ,
                    "PYTHONPATH": str(ROOT),
                    "BENCH_QUEUE": queue,
                    "BENCH_WORKER_READY": str(ready),
                    "BENCH_AGENTLOOP": json.dumps(agentloop),
                    **(env or {}),
                }
                command = [
                    sys.executable, "-m", "celery", "-A", "bench.celery_app", "worker",
                    f"--concurrency={concurrency}", f"--pool={pool}", "--loglevel=WARNING",
                    "--without-gossip", "--without-mingle", "--without-heartbeat",
                    "-n", f"{queue}-{number}@%h", "-Q", queue,
                ]  # fmt: skip
                with log.open("w") as output:
                    process = subprocess.Popen(  # noqa: S603
                        command, env=process_env, cwd=ROOT, stdout=output,
                        stderr=subprocess.STDOUT, start_new_session=True,
                    )  # fmt: skip
                running.append((process, ready, log))
            deadline = time.monotonic() + 60
            for process, ready, log in running:
                while not ready.exists():
                    if process.poll() is not None or time.monotonic() > deadline:
                        sys.exit(f"The Celery worker did not start:\n{log.read_text()}")
                    time.sleep(0.05)
            use_queue(queue)
            if started is not None:
                for process, _, _ in running:
                    started(process)
            yield queue
        finally:
            for process, _, _ in running:
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGTERM)
            for process, _, _ in running:
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
            _delete_queue(queue)


def _delete_queue(queue: str) -> None:
    """Drop the run's queue from the broker, so RabbitMQ does not collect one per run."""
    from bench.celery_app import app  # local: the Celery app reads the Django settings

    try:
        with app.connection_for_write() as connection:
            connection.default_channel.queue_delete(queue)
    except Exception as exc:  # a leftover empty queue is harmless: say so and go on
        print(f"could not delete queue {queue}: {exc}", file=sys.stderr)


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile (p95 of 40 samples is the 38th smallest)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def machine() -> dict[str, Any]:
    import platform

    with open("/proc/loadavg") as loadavg:
        load = " ".join(loadavg.read().split()[:3])
    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average": load,
    }

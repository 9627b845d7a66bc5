"""Chats in flight: N chats waiting on a slow model at once in one ``celery worker``.

    python bench/in_flight.py --pool threads --concurrency 100 --chats 300 [--latency 1]
    python bench/in_flight.py --matrix [--json out.json] [--broker amqp]
    python bench/in_flight.py --pool gevent --concurrency 150 --workers 2 --chats 900
    python bench/in_flight.py --reconnect-cost

A fake OpenAI-compatible server (bench/fake_openai.py: real HTTP, SSE, ``--latency`` seconds
per call) answers every chat the same way: it asks for the ``lookup`` tool, the tool runs (at
once), it answers "answer: <the tool's result>". So each chat is three jobs (model, tool,
model) and two model calls. The ``--chats`` chats are created first, then enqueued at once;
the wall time runs from the first publish to the last chat settled, against the
latency-bound ideal ``ceil(N / C) x 2 x latency`` (C: the worker's concurrency; with
``--workers W``, W worker processes on one queue, say one per core, C is W times it).

Sampled every 50 ms while they run: the worker's PostgreSQL backends (``pg_stat_activity``,
by the worker's ``application_name``) and its resident memory (all its processes); every
0.5 s its TCP connections to Redis (the worker's own sockets; Redis is a private
``redis-server`` this script starts, the broker and agentloop's ``REDIS_URL``). At the
end: the worker's CPU time (user + system, all its processes) per step, and a check that
every chat was answered exactly (its four messages, two usage rows, and 2 x N model calls
at the server). Then, in the same worker, two floors, each timed the same way: Celery's
(``bench.paced_hop``: a chat's three jobs that only wait) and the libraries'
(``bench.library_hop``, bench/library_floor.py: the same jobs done with psycopg's pool,
httpx and redis-py alone, with none of agentloop's code).

The database is PostgreSQL (``--database-url``, default ``agentloop_bench_inflight``),
with Django's connection pool (``--db-pool-size``, 0: none) and ``RELEASE_CONNECTIONS``
"auto". The OpenAI provider's HTTP client here allows as many connections as the worker
has concurrency (httpx's default is 100 per client). ``--reconnect-cost`` measures what
giving a connection back and taking one again costs, with and without the pool.
See bench/README.md for recorded figures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agentloop import tool  # noqa: E402

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/agentloop_bench_inflight"
#: (Celery pool, concurrency, chats): the issue's shapes.
MATRIX = (
    ("prefork", 2, 20),
    ("threads", 100, 300),
    ("gevent", 300, 900),
    ("gevent", 500, 1000),
    ("gevent", 1000, 1000),
)
TICK = 0.05
#: The worker's Celery settings (docs/running-at-scale.md, "Choosing a pool"): one pooled
#: broker connection for publishing, no remote control (its pidbox), for few Redis
#: connections; one result backend object for the process, not one made per greenlet.
WORKER_CELERY = {
    "BROKER_POOL_LIMIT": 1,
    "WORKER_ENABLE_REMOTE_CONTROL": False,
    "RESULT_BACKEND_THREAD_SAFE": True,
}


@tool
def lookup(key: str) -> str:
    """Looks a key up (instant).

    Args:
        key: What to look up.
    """
    return f"value of {key}"


# -- the private Redis ---------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def private_redis() -> Any:
    """A redis-server of this run's own (its connections are only this run's)."""
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server is not installed (apt-get install redis-server)")
    port = _free_port()
    process = subprocess.Popen(  # noqa: S603 - the system's redis-server
        [binary, "--port", str(port), "--save", "", "--appendonly", "no", "--maxclients", "10000"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    sys.exit("the private redis-server did not start")
                time.sleep(0.05)
        yield port
    finally:
        process.terminate()
        process.wait(timeout=10)


# -- the worker's processes, as /proc shows them ----------------------------------------------
def process_tree(root: int) -> list[int]:
    """``root`` and its descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def process_trees(roots: list[int]) -> list[int]:
    """Each of ``roots`` and its descendants."""
    return [pid for root in roots for pid in process_tree(root)]


def rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def cpu_seconds(pids: list[int]) -> float:
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / ticks
        except OSError:
            pass
    return total


def tcp_connections_to(port: int, pids: list[int]) -> int:
    """Established TCP connections from ``pids`` to 127.0.0.1:``port``."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as lines:
                next(lines)
                for line in lines:
                    fields = line.split()
                    remote_port = int(fields[2].rsplit(":", 1)[1], 16)
                    if remote_port == port and fields[3] == "01":  # ESTABLISHED
                        inodes.add(fields[9])
        except OSError:
            pass
    count = 0
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    count += 1
        except OSError:
            pass
    return count


# -- one run -------------------------------------------------------------------------------
def run(
    pool: str,
    concurrency: int,
    chats: int,
    latency: float,
    db_pool_size: int,
    database_url: str,
    redis_events: bool = True,
    celery_defaults: bool = False,
    floor: bool = True,
    broker: str = "redis",
    processes: int = 1,
) -> dict[str, Any]:
    from bench.fake_openai import FakeOpenAI
    from bench.workers import DEFAULT_AMQP_URL, setup, workers

    with private_redis() as redis_port, FakeOpenAI(latency) as fake:
        redis_url = f"redis://127.0.0.1:{redis_port}/0"
        application = f"bench-inflight-{uuid.uuid4().hex[:8]}"
        provider = {
            "class": "agentloop.providers.openai.OpenAIProvider", "base_url": fake.url,
            "api_key": "x", "max_connections": max(concurrency, 10),  # httpx allows 100
        }  # fmt: skip
        agentloop: dict[str, Any] = {"PROVIDERS": {"openai": provider}}
        if redis_events:  # live events and cancel notices through Redis (else the database)
            agentloop["REDIS_URL"] = redis_url
        broker_url = DEFAULT_AMQP_URL if broker == "amqp" else f"redis://127.0.0.1:{redis_port}/1"
        setup(database_url, redis_url, agentloop, broker_url=broker_url)
        from django.db import connection

        from agentloop.models import Chat, Usage

        Usage.objects.all().delete()
        Chat.objects.all().delete()
        env = {
            "BENCH_DB_APPLICATION": application,
            "BENCH_CELERY": json.dumps({} if celery_defaults else WORKER_CELERY),
        }
        if db_pool_size:
            pool_options = {"min_size": min(2, db_pool_size), "max_size": db_pool_size}
            env["BENCH_DB_POOL"] = json.dumps({**pool_options, "timeout": 120})
        started_workers: list[Any] = []
        with workers(
            concurrency, agentloop, env=env, pool=pool, started=started_workers.append,
            processes=processes,
        ):  # fmt: skip
            roots = [process.pid for process in started_workers]
            # A warm-up at no latency: imports, the pool's connections, prepared statements.
            fake.latency = 0
            _settle(_enqueue(Chat, min(concurrency * processes, 20 * processes), "warm"), Chat, 120)
            Usage.objects.all().delete()
            Chat.objects.all().delete()
            fake.latency = latency
            fake.requests = fake.peak = 0
            pids = process_trees(roots)
            cpu_before = cpu_seconds(pids)
            peaks = {"backends": 0, "redis": 0, "rss": 0}
            pks = _create(Chat, chats)
            started = time.monotonic()
            _publish(Chat, pks)
            ticks = 0
            deadline = started + max(
                120.0, 20 * math.ceil(chats / (concurrency * processes)) * 2 * latency
            )
            while True:
                pids = process_trees(roots)
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                        [application],
                    )
                    peaks["backends"] = max(peaks["backends"], cursor.fetchone()[0])
                    cursor.execute(
                        "SELECT count(*) FROM agentloop_chat WHERE id = ANY(%s) AND state = 'idle'"
                        " AND lease_token = ''",
                        [pks],
                    )
                    idle = cursor.fetchone()[0]
                if ticks % 10 == 0:  # reading every socket of the worker takes CPU too
                    peaks["redis"] = max(peaks["redis"], tcp_connections_to(redis_port, pids))
                ticks += 1
                peaks["rss"] = max(peaks["rss"], rss_bytes(pids))
                if idle == len(pks):
                    break
                if time.monotonic() > deadline:
                    sys.exit(f"{len(pks) - idle} chats unfinished at the deadline")
                time.sleep(TICK)
            wall = time.monotonic() - started
            cpu = cpu_seconds(process_trees(roots)) - cpu_before
            worker_processes = len(process_trees(roots))
            exact = _check(Chat, pks)  # before the libraries' floor adds rows to these chats
            model_calls, peak_calls = fake.requests, fake.peak  # and calls to the server
            measured = _floor(chats, latency, roots, max(120.0, 4 * wall)) if floor else None
            library = _library_floor(pks, roots, max(120.0, 4 * wall)) if floor else None
    ideal = math.ceil(chats / (concurrency * processes)) * 2 * latency
    floor_figures: dict[str, Any] = {}
    if floor:
        floor_figures = {
            **_floor_figures("floor", measured, wall, ideal, 3 * chats),
            **_floor_figures("library_floor", library, wall, ideal, 3 * chats),
        }
    return {
        "pool": pool,
        "broker": broker,
        "concurrency": concurrency,
        "workers": processes,
        "chats": chats,
        "latency_s": latency,
        "db_pool_size": db_pool_size,
        "redis_events": redis_events,
        "worker_celery": {} if celery_defaults else WORKER_CELERY,
        "wall_s": round(wall, 2),
        "ideal_s": ideal,
        "ratio": round(wall / ideal, 2),
        "answered_exactly": exact,
        "model_calls": model_calls,
        "peak_model_calls_at_once": peak_calls,
        "peak_pg_backends": peaks["backends"],
        "peak_redis_connections": peaks["redis"],  # all the workers' together
        "redis_connections_per_worker": round(peaks["redis"] / processes, 1),
        "worker_processes": worker_processes,
        "peak_rss_mib": round(peaks["rss"] / 2**20, 1),
        "cpu_ms_per_step": round(1000 * cpu / (3 * chats), 2),
        **floor_figures,
    }


def _floor_figures(
    name: str, measured: tuple[float, float] | None, wall: float, ideal: float, jobs: int
) -> dict[str, Any]:
    """A floor's figures beside agentloop's run, under keys named after it."""
    floor_wall, floor_cpu = measured or (None, None)
    return {
        f"{name}_wall_s": round(floor_wall, 2) if floor_wall else "unfinished",
        f"{name}_ratio": round(floor_wall / ideal, 2) if floor_wall else None,
        f"{name}_cpu_ms_per_job": round(1000 * floor_cpu / jobs, 2) if floor_cpu else None,
        f"wall_over_{name}": round(wall / floor_wall, 2) if floor_wall else None,
    }


def _timed_chains(
    name: str, start: Callable[[str], int], roots: list[int], timeout: float
) -> tuple[float, float] | None:
    """Wall seconds from ``start(finish_dir)`` (which publishes the chains and says how
    many) to the last chain's file in ``finish_dir``, and the worker's CPU seconds
    meanwhile; None if it took over ``timeout``."""
    with tempfile.TemporaryDirectory() as finish_dir:
        cpu_before = cpu_seconds(process_trees(roots))
        started = time.monotonic()
        chains = start(finish_dir)
        while len(os.listdir(finish_dir)) < chains:
            if time.monotonic() - started > timeout:
                print(f"the {name} did not finish in {timeout:.0f} s", file=sys.stderr)
                return None
            time.sleep(TICK)
        wall = time.monotonic() - started
        return wall, cpu_seconds(process_trees(roots)) - cpu_before


def _floor(
    chats: int, latency: float, roots: list[int], timeout: float
) -> tuple[float, float] | None:
    """The Celery floor in the same worker, after agentloop's run: ``chats`` chains of
    ``bench.paced_hop`` (a chat's three jobs, two of them waiting ``latency``, nothing of
    agentloop's), all published at once; timed by :func:`_timed_chains`."""
    from bench.celery_app import paced_hop

    def start(finish_dir: str) -> int:
        for chain in range(chats):
            paced_hop.apply_async((finish_dir, chain, 3, latency))
        return chats

    return _timed_chains("Celery floor", start, roots, timeout)


def _library_floor(pks: list[int], roots: list[int], timeout: float) -> tuple[float, float] | None:
    """The libraries' floor in the same worker, after the Celery floor: a chain of
    ``bench.library_hop`` per chat of agentloop's run (bench/library_floor.py: the SQL, the
    two streamed model calls, an event to Redis and the next job, per job, with nothing of
    agentloop's), all published at once; timed as :func:`_floor`. Exits unless each job
    wrote its message."""
    from agentloop.models import Message
    from bench.celery_app import library_hop

    def start(finish_dir: str) -> int:
        for pk in pks:
            args = (finish_dir, pk, 3)
            library_hop.apply_async(args, argsrepr=repr(args), kwargsrepr="{}")
        return len(pks)

    rows_before = Message.objects.filter(chat_id__in=pks).count()
    measured = _timed_chains("libraries' floor", start, roots, timeout)
    written = Message.objects.filter(chat_id__in=pks).count() - rows_before
    if measured and written != 3 * len(pks):
        sys.exit(f"the libraries' floor wrote {written} messages, not {3 * len(pks)}")
    return measured


def _create(chat_model: Any, count: int, label: str = "q") -> list[int]:
    # By its module's name, not __main__'s: the worker loads it by that path.
    from bench.in_flight import lookup

    pks = []
    for index in range(count):
        chat = chat_model.objects.create(model="openai:fake")
        chat.with_tools(lookup)
        chat.ask_later(f"{label}{index}")
        pks.append(chat.pk)
    return pks


def _publish(chat_model: Any, pks: list[int]) -> None:
    for chat in chat_model.objects.filter(pk__in=pks):
        chat.complete_later()


def _enqueue(chat_model: Any, count: int, label: str) -> list[int]:
    pks = _create(chat_model, count, label)
    _publish(chat_model, pks)
    return pks


def _settle(pks: list[int], chat_model: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while chat_model.objects.filter(pk__in=pks, state="idle", lease_token="").count() < len(pks):
        if time.monotonic() > deadline:
            sys.exit("the warm-up did not finish")
        time.sleep(TICK)


def _check(chat_model: Any, pks: list[int]) -> bool:
    """Every chat: user, the tool call, its result, the answer; two usage rows."""
    for chat in chat_model.objects.filter(pk__in=pks).prefetch_related("messages"):
        messages = sorted(chat.messages.all(), key=lambda message: message.pk)
        question = messages[0].content if messages else ""
        shape = [(m.role, m.content) for m in messages]
        expected = [
            ("user", question),
            ("assistant", ""),
            ("tool", f"value of {question}"),
            ("assistant", f"answer: value of {question}"),
        ]
        if shape != expected or chat.usage_records.filter(status="succeeded").count() != 2:
            print(f"chat {chat.pk}: {shape}", file=sys.stderr)
            return False
    return True


# -- what giving a connection back costs ------------------------------------------------------
def reconnect_cost(database_url: str, samples: int) -> dict[str, float]:
    """Median microseconds of close() + the next SELECT 1, against SELECT 1 on a kept
    connection, without and with Django's pool, with and without its check at check-out
    (a subprocess each: settings differ)."""
    import psycopg
    from psycopg import sql

    parts = database_url.rsplit("/", 1)
    with psycopg.connect(f"{parts[0]}/postgres", autocommit=True) as maintenance:
        if not maintenance.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", [parts[1]]
        ).fetchone():
            maintenance.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(parts[1])))
    pool = json.dumps({"min_size": 1, "max_size": 2})
    variants = (("no pool", "", "1"), ("pool", pool, "1"), ("pool, no check", pool, "0"))
    return _probes("--reconnect-probe", database_url, samples, variants)


def _probes(
    probe: str, database_url: str, samples: int, variants: tuple[tuple[str, str, str], ...]
) -> dict[str, Any]:
    """Run this script's ``probe`` once per (name, pool options, checks) in a process of its
    own (Django's pool is set up at start): each one's last printed line, as JSON, by name."""
    results = {}
    for name, pool_options, checks in variants:
        env = {**os.environ, "BENCH_DB_POOL": pool_options, "BENCH_DATABASE_URL": database_url}
        env["BENCH_DB_POOL_CHECKS"] = checks
        env["DJANGO_SETTINGS_MODULE"] = "bench.settings"
        env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
        output = subprocess.run(  # noqa: S603 - our own interpreter and script
            [sys.executable, __file__, probe, str(samples)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        results[name] = json.loads(output.strip().splitlines()[-1])
    return results


def _reconnect_probe(samples: int) -> None:
    import statistics

    import django

    django.setup()
    from django.db import connection

    def select() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")

    kept, again = [], []
    select()
    for _ in range(samples):
        start = time.perf_counter()
        select()
        kept.append(time.perf_counter() - start)
        start = time.perf_counter()
        connection.close()
        select()
        again.append(time.perf_counter() - start)
    print(
        json.dumps(
            {
                "kept_us": round(statistics.median(kept) * 1e6),
                "closed_and_taken_again_us": round(statistics.median(again) * 1e6),
            }
        )
    )


def release_cost(database_url: str, samples: int) -> dict[str, Any]:
    """A zero-latency chat's three jobs (``run_step``: model, tool, model) with
    ``RELEASE_CONNECTIONS`` True and False in turn, in one process, under Django's pool (with
    and without its check at check-out) and without one (a subprocess each): median
    milliseconds per job, and the ratio."""
    pool = json.dumps({"min_size": 2, "max_size": 4})
    variants = (("pool", pool, "1"), ("pool, no check", pool, "0"), ("no pool", "", "1"))
    return _probes("--release-probe", database_url, samples, variants)


def _release_probe(samples: int) -> None:
    import statistics

    import django

    django.setup()
    from django.core.management import call_command
    from django.test import override_settings

    from agentloop import providers
    from agentloop.messages import ModelResponse, ToolCall
    from agentloop.models import Chat, Usage
    from agentloop.runners import run_step
    from agentloop.testing import FunctionProvider
    from bench.in_flight import lookup

    call_command("migrate", verbosity=0)
    Usage.objects.all().delete()
    Chat.objects.all().delete()

    def answer(request: Any) -> Any:
        if request.messages[-1].role == "tool":
            return "done"
        call = ToolCall(id="c1", name="lookup", arguments={"key": "k"})
        return ModelResponse(content="", tool_calls=[call])

    providers.register("zero", FunctionProvider(answer))
    per_job: dict[bool, list[float]] = {True: [], False: []}
    for sample in range(samples + 10):
        order = (True, False) if sample % 2 else (False, True)
        for release in order:
            chat = Chat.objects.create(model="zero:m")
            chat.with_tools(lookup)
            chat.ask_later("hi")
            with override_settings(AGENTLOOP={"RELEASE_CONNECTIONS": release}):
                start = time.perf_counter()
                for _ in range(3):
                    run_step(chat.pk)
                elapsed = (time.perf_counter() - start) / 3
            if sample >= 10:  # the first ten: warm-up
                per_job[release].append(elapsed)
    on = statistics.median(per_job[True]) * 1e3
    off = statistics.median(per_job[False]) * 1e3
    result = {"released_ms": round(on, 3), "kept_ms": round(off, 3), "ratio": round(on / off, 3)}
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pool", default="threads", choices=["prefork", "threads", "gevent"])
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--chats", type=int, default=300)
    parser.add_argument(
        "--workers", type=int, default=1,
        help="worker processes on one queue, each of --concurrency (one per core: the host)",
    )  # fmt: skip
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--db-pool-size", type=int, default=10, help="per worker process")
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    parser.add_argument("--matrix", action="store_true", help="the issue's shapes, one by one")
    parser.add_argument(
        "--no-redis-events",
        action="store_true",
        help="no AGENTLOOP REDIS_URL in the worker: no live events, cancel notices by polling",
    )
    parser.add_argument(
        "--celery-defaults",
        action="store_true",
        help="the worker without WORKER_CELERY (Celery's broker pool of 10, remote control, a "
        "result backend per thread)",
    )
    parser.add_argument(
        "--broker", default="redis", choices=["redis", "amqp"],
        help="Celery's broker: the private redis-server, or RabbitMQ on localhost",
    )  # fmt: skip
    parser.add_argument(
        "--no-floor",
        action="store_true",
        help="skip the floors after agentloop's run (bench.paced_hop, bench.library_hop)",
    )
    parser.add_argument("--reconnect-cost", action="store_true")
    parser.add_argument("--reconnect-probe", type=int, help=argparse.SUPPRESS)
    parser.add_argument(
        "--release-cost", type=int, metavar="SAMPLES", help="zero-latency jobs, release on/off"
    )
    parser.add_argument("--release-probe", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.reconnect_probe:
        _reconnect_probe(args.reconnect_probe)
        return
    if args.release_probe:
        _release_probe(args.release_probe)
        return
    if args.release_cost:
        print(json.dumps(release_cost(args.database_url, args.release_cost), indent=2))
        return
    if args.reconnect_cost:
        print(json.dumps(reconnect_cost(args.database_url, 300), indent=2))
        return
    shapes = MATRIX if args.matrix else ((args.pool, args.concurrency, args.chats),)
    rows = []
    for pool, concurrency, chats in shapes:
        if args.matrix:
            # One subprocess per shape: a fresh Django, Redis and server each.
            with tempfile.NamedTemporaryFile(suffix=".json") as out:
                command = [
                    sys.executable, __file__, "--pool", pool, "--concurrency", str(concurrency),
                    "--chats", str(chats), "--latency", str(args.latency),
                    "--db-pool-size", str(args.db_pool_size),
                    "--database-url", args.database_url, "--json", out.name,
                ] + (["--no-redis-events"] if args.no_redis_events else []) + (
                    ["--celery-defaults"] if args.celery_defaults else []
                ) + (["--no-floor"] if args.no_floor else []) + [
                    "--broker", args.broker, "--workers", str(args.workers),
                ]  # fmt: skip
                subprocess.run(command, check=True)  # noqa: S603 - our own script
                rows.extend(json.loads(Path(out.name).read_text()))
            continue
        rows.append(
            run(
                pool,
                concurrency,
                chats,
                args.latency,
                args.db_pool_size,
                args.database_url,
                not args.no_redis_events,
                args.celery_defaults,
                not args.no_floor,
                args.broker,
                args.workers,
            )
        )
        print(json.dumps(rows[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    if args.matrix:
        keys = list(rows[0])
        print("| " + " | ".join(keys) + " |")
        print("|" + "---|" * len(keys))
        for row in rows:
            print("| " + " | ".join(str(row[key]) for key in keys) + " |")


if __name__ == "__main__":
    main()

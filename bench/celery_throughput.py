"""Steps per second through Celery worker processes, against a Celery floor and in-process runs.

    python bench/celery_throughput.py [--workers 2] [--broker redis|amqp] [--json out.json]
    python bench/celery_throughput.py --matrix [--json out.json]

Every chat asks ``tools:add|add|...`` (``--rounds`` rounds) of a zero-latency provider
(tests/worker_provider.py): 2 x rounds + 1 steps each (the model asks for the ``add`` tool, the
tool runs, ..., the model answers), on PostgreSQL. Measured, after a warm-up, on fresh chats:

* in-process: this process runs each step with ``agentloop.runners.run_step`` (a job's body:
  take the lease, one ``step()``, release), chat after chat; no broker;
* in-process, no lease: ``chat.complete()`` on each chat (what a view would do);
* celery: ``complete_later()`` on ``--chats`` chats (20: all in flight at once) in one
  transaction; ``--workers`` pool processes of one ``celery worker`` run the steps, one job
  per step, each job enqueueing the next; timed from the commit to the last chat settled
  (polled every 10 ms);
* celery, connections kept: the same with ``CELERY_DB_REUSE_MAX`` = 1000 (Celery's Django
  fixup otherwise closes the database connection around every task, so each job connects);
* celery floor: the same worker (same broker, pool and options) runs ``bench.hop``, an empty
  task that re-enqueues itself: ``--chats`` chains in flight, ``--hops`` tasks each; timed from
  the first publish to the last chain's end. The ratio is agentloop's steps/s to its tasks/s.

Each agentloop variant is checked: every chat ends idle with all its messages and usage rows.
``--matrix`` runs the in-process variants once, then celery and its floor with 1, 2 and 4 pool
processes on Redis and on RabbitMQ (one subprocess per cell), and prints one table.
See bench/README.md for recorded figures.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.workers import (  # noqa: E402
    DEFAULT_AMQP_URL,
    DEFAULT_DATABASE_URL,
    DEFAULT_REDIS_URL,
    empty_tables,
    machine,
    setup,
    workers,
)

BROKERS = {"redis": DEFAULT_REDIS_URL, "amqp": DEFAULT_AMQP_URL}
MATRIX_WORKERS = (1, 2, 4)
TARGET_RATIO = 0.5  # of the floor's tasks/s, with 2 pool processes
REUSE = "1000"  # CELERY_DB_REUSE_MAX of the "connections kept" variant


def question(rounds: int) -> str:
    return "tools:" + "|".join(["add"] * rounds)


def steps_per_chat(rounds: int) -> int:
    return 2 * rounds + 1


def make_chats(count: int, rounds: int) -> list[int]:
    from agentloop.models import Chat
    from tests.tools import add

    ids = []
    for _ in range(count):
        chat = Chat.objects.create(model="rules:bench")
        chat.with_tools(add).ask_later(question(rounds))
        ids.append(chat.pk)
    return ids


def check(ids: list[int], rounds: int) -> None:
    """Every chat finished exactly once: idle, all its messages, one usage row per call."""
    from agentloop.models import Chat, Message, Usage

    chats = Chat.objects.filter(pk__in=ids)
    problems = []
    if chats.exclude(state="idle").exists():
        problems.append(f"{chats.exclude(state='idle').count()} chats not idle")
    if Message.objects.filter(chat__in=ids).count() != (2 + 2 * rounds) * len(ids):
        problems.append("a message is missing or duplicated")
    answers = Message.objects.filter(chat__in=ids, role="assistant", content="done: 5")
    if answers.count() != len(ids):
        problems.append("a final answer is missing")
    calls = Usage.objects.filter(chat__in=ids, status="succeeded").count()
    if calls != (rounds + 1) * len(ids):
        problems.append("model calls are missing or duplicated")
    if problems:
        sys.exit("Check failed: " + "; ".join(problems))


def in_process(count: int, rounds: int) -> float:
    """Seconds to run every step of ``count`` chats with run_step, one after another."""
    from agentloop.runners import run_step

    ids = make_chats(count, rounds)
    started = time.perf_counter()
    for chat_id in ids:
        while run_step(chat_id).action == "again":
            pass
    elapsed = time.perf_counter() - started
    check(ids, rounds)
    return elapsed


def in_process_without_lease(count: int, rounds: int) -> float:
    from agentloop.models import Chat

    ids = make_chats(count, rounds)
    chats = [Chat.objects.get(pk=pk) for pk in ids]
    started = time.perf_counter()
    for chat in chats:
        chat.complete()
    elapsed = time.perf_counter() - started
    Chat.objects.filter(pk__in=ids).update(state="idle")  # complete() leaves the state alone
    check(ids, rounds)
    return elapsed


def through_celery(count: int, rounds: int, timeout: float = 300) -> float:
    from django.db import transaction

    from agentloop.models import Chat

    ids = make_chats(count, rounds)
    chats = list(Chat.objects.filter(pk__in=ids))
    started = time.perf_counter()
    with transaction.atomic():
        for chat in chats:
            chat.complete_later()  # published when this transaction commits
    unsettled = Chat.objects.filter(pk__in=ids, state__in=["queued", "running"])
    while unsettled.exists():
        if time.perf_counter() - started > timeout:
            sys.exit(f"Celery run timed out; {unsettled.count()} chats unsettled")
        time.sleep(0.01)
    elapsed = time.perf_counter() - started
    check(ids, rounds)
    return elapsed


def celery_floor(chains: int, hops: int, timeout: float = 300) -> float:
    """Seconds for ``chains`` self-re-enqueueing empty tasks of ``hops`` hops each to end."""
    from bench.celery_app import hop  # local: the Celery app reads the Django settings

    with tempfile.TemporaryDirectory() as finish_dir:
        started = time.perf_counter()
        for chain in range(chains):
            hop.apply_async((finish_dir, chain, hops))
        finished = Path(finish_dir)
        while len(list(finished.iterdir())) < chains:
            if time.perf_counter() - started > timeout:
                sys.exit(f"Celery floor timed out; {len(list(finished.iterdir()))} chains ended")
            time.sleep(0.005)
        return time.perf_counter() - started


def figures(name: str, steps: int, seconds: float, unit: str = "steps") -> dict[str, Any]:
    row = {
        "variant": name,
        "steps": steps,
        "seconds": round(seconds, 3),
        "per_second": round(steps / seconds, 1),
        "ms_each": round(seconds / steps * 1000, 2),
    }
    print(
        f"{name:<52} {steps:>5} {unit} in {seconds:6.2f} s: {row['per_second']:7.1f} "
        f"{unit}/s ({row['ms_each']:.2f} ms each)",
        flush=True,
    )
    return row


def run(options: argparse.Namespace) -> dict[str, Any]:
    """The variants ``options.variants`` names, on one broker and one worker size."""
    broker = options.redis_url if options.broker == "redis" else options.broker
    setup(options.database_url, options.redis_url, broker_url=BROKERS.get(broker, broker))
    empty_tables()
    rounds, chats = options.rounds, options.chats
    steps = chats * steps_per_chat(rounds)
    rows: dict[str, Any] = {}
    if "in-process" in options.variants:
        in_process(options.warmup, 1)
        rows["run_step"] = figures("in-process run_step", steps, in_process(chats, rounds))
        in_process_without_lease(options.warmup, 1)
        seconds = in_process_without_lease(chats, rounds)
        rows["complete"] = figures("in-process complete()", steps, seconds)
    if "celery" in options.variants:
        label = f"{options.workers} processes, {options.broker.split(':')[0]} broker"
        background = {"BACKGROUND": "celery"}
        with workers(options.workers, background, env={"BENCH_DB_REUSE_MAX": "0"}):
            celery_floor(chats, 5)
            seconds = celery_floor(chats, options.hops)
            rows["floor"] = figures(
                f"celery floor, {label}", chats * options.hops, seconds, "tasks"
            )
            through_celery(options.warmup, 1)
            rows["celery"] = figures(f"celery, {label}", steps, through_celery(chats, rounds))
        with workers(options.workers, background, env={"BENCH_DB_REUSE_MAX": REUSE}):
            through_celery(options.warmup, 1)
            seconds = through_celery(chats, rounds)
            rows["celery_reuse"] = figures(f"celery, connections kept, {label}", steps, seconds)
        floor = rows["floor"]["per_second"]
        rows["ratio"] = round(rows["celery"]["per_second"] / floor, 3)
        rows["ratio_reuse"] = round(rows["celery_reuse"]["per_second"] / floor, 3)
        print(
            f"agentloop steps/s to the floor's tasks/s: {rows['ratio']:.2f}; "
            f"with connections kept {rows['ratio_reuse']:.2f}",
            flush=True,
        )
    empty_tables()
    return {
        "machine": machine(),
        "broker": options.broker,
        "workers": options.workers,
        "chats_in_flight": chats,
        "steps_per_chat": steps_per_chat(rounds),
        "hops_per_chain": options.hops,
        "results": rows,
    }


def matrix(options: argparse.Namespace) -> dict[str, Any]:
    """Each cell in a subprocess of its own (a fresh Celery app per broker), then one table."""
    load_before = machine()["load_average"]
    common = [
        f"--database-url={options.database_url}",
        f"--redis-url={options.redis_url}",
        f"--chats={options.chats}",
        f"--rounds={options.rounds}",
        f"--hops={options.hops}",
        f"--warmup={options.warmup}",
    ]
    cells: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        plan = [("in-process", "redis", 2)] + [
            ("celery", broker, count) for broker in BROKERS for count in MATRIX_WORKERS
        ]
        for index, (variant, broker, count) in enumerate(plan):
            out = Path(tmp) / f"{index}.json"
            print(f"-- {variant}, broker {broker}, {count} processes", flush=True)
            command = [sys.executable, __file__, *common, f"--variants={variant}"]
            command += [f"--broker={broker}", f"--workers={count}", f"--json={out}"]
            subprocess.run(command, check=True)  # noqa: S603
            cells.append(json.loads(out.read_text()))
    result = {"load_average_before": load_before, "machine": machine(), "cells": cells}
    print_matrix(result)
    return result


def print_matrix(result: dict[str, Any]) -> None:
    cells = result["cells"]
    first = cells[0]
    print()
    print(
        f"Celery throughput: {first['chats_in_flight']} chats in flight, "
        f"{first['steps_per_chat']} steps each; floor: {first['chats_in_flight']} chains of "
        f"{first['hops_per_chain']} empty tasks. Load average before "
        f"{result['load_average_before']}, after {result['machine']['load_average']}"
    )
    local = first["results"]
    print(
        f"in-process, no broker: run_step {local['run_step']['per_second']} steps/s, "
        f"complete() {local['complete']['per_second']} steps/s"
    )
    print("agentloop steps/s: Celery's default (a new database connection per job), and with")
    print(f"CELERY_DB_REUSE_MAX = {REUSE} (connections kept); ratio = steps/s / floor tasks/s")
    print(f"{'broker':<8}{'processes':>10}{'floor tasks/s':>15}{'steps/s':>9}{'ratio':>7}"
          f"{'kept: steps/s':>15}{'ratio':>7}  target")  # fmt: skip
    for cell in cells[1:]:
        rows = cell["results"]
        target = f">= {TARGET_RATIO}" if cell["workers"] == 2 else ""
        print(
            f"{cell['broker']:<8}{cell['workers']:>10}{rows['floor']['per_second']:>15.1f}"
            f"{rows['celery']['per_second']:>9.1f}{rows['ratio']:>7.2f}"
            f"{rows['celery_reuse']['per_second']:>15.1f}{rows['ratio_reuse']:>7.2f}  {target}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument(
        "--broker", default="redis", help="redis, amqp, or a broker URL (default: --redis-url)"
    )
    parser.add_argument("--chats", type=int, default=20, help="chats (and floor chains) in flight")
    parser.add_argument("--rounds", type=int, default=9, help="tool rounds per chat")
    parser.add_argument("--hops", type=int, default=100, help="empty tasks per floor chain")
    parser.add_argument("--workers", type=int, default=2, help="worker pool processes")
    parser.add_argument("--warmup", type=int, default=4, help="chats (one round) to warm up")
    parser.add_argument(
        "--variants", default="in-process,celery", help="comma-separated: in-process, celery"
    )
    parser.add_argument("--matrix", action="store_true", help="1, 2, 4 processes x both brokers")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    options = parser.parse_args()
    if min(options.chats, options.rounds, options.hops, options.workers) < 1:
        parser.error("--chats, --rounds, --hops and --workers must be at least 1")
    options.variants = {name.strip() for name in options.variants.split(",")}
    result = matrix(options) if options.matrix else run(options)
    if options.json:
        options.json.write_text(json.dumps(result, indent=2) + "\n")
    if not options.matrix:
        print(json.dumps(result["machine"]))


if __name__ == "__main__":
    main()

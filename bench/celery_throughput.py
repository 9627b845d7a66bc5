"""Steps per second through Celery worker processes, against the same steps in one process.

    python bench/celery_throughput.py [--chats 200] [--workers 2] [--json out.json]

Every chat asks ``tools:add`` of a zero-latency provider (tests/worker_provider.py): three
steps each (the model asks for the ``add`` tool; the tool runs; the model answers), on
PostgreSQL, with Redis as the broker. Measured, after a warm-up, on fresh chats each time:

* in-process: this process runs each step with ``agentloop._runner.run_step`` (a job's body:
  take the lease, one ``step()``, release), chat after chat; no broker;
* in-process, no lease: ``chat.complete()`` on each chat (what a view would do);
* celery: ``complete_later()`` on every chat in one transaction, then ``--workers`` pool
  processes of one ``celery worker`` run the steps, one job per step, each job enqueueing
  the next; timed from the commit to the last chat settled (polled every 10 ms).

Each variant is checked: every chat ends idle with its four messages and two usage rows.
See bench/README.md for recorded figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.workers import (  # noqa: E402
    DEFAULT_DATABASE_URL,
    DEFAULT_REDIS_URL,
    empty_tables,
    machine,
    setup,
    workers,
)

STEPS_PER_CHAT = 3
QUESTION = "tools:add"


def make_chats(count: int) -> list[int]:
    from agentloop.models import Chat
    from tests.tools import add

    ids = []
    for _ in range(count):
        chat = Chat.objects.create(model="rules:bench")
        chat.with_tools(add).ask_later(QUESTION)
        ids.append(chat.pk)
    return ids


def check(ids: list[int]) -> None:
    """Every chat finished exactly once: idle, four messages, two model calls."""
    from agentloop.models import Chat, Message, Usage

    chats = Chat.objects.filter(pk__in=ids)
    problems = []
    if chats.exclude(state="idle").exists():
        problems.append(f"{chats.exclude(state='idle').count()} chats not idle")
    if Message.objects.filter(chat__in=ids).count() != 4 * len(ids):
        problems.append("a message is missing or duplicated")
    if Message.objects.filter(chat__in=ids, role="assistant", content="done: 5").count() != len(
        ids
    ):
        problems.append("a final answer is missing")
    if Usage.objects.filter(chat__in=ids, status="succeeded").count() != 2 * len(ids):
        problems.append("model calls are missing or duplicated")
    if problems:
        sys.exit("Check failed: " + "; ".join(problems))


def in_process(count: int) -> float:
    """Seconds to run every step of ``count`` chats with run_step, one after another."""
    from agentloop._runner import run_step

    ids = make_chats(count)
    started = time.perf_counter()
    for chat_id in ids:
        while run_step(chat_id).action == "again":
            pass
    elapsed = time.perf_counter() - started
    check(ids)
    return elapsed


def in_process_without_lease(count: int) -> float:
    from agentloop.models import Chat

    ids = make_chats(count)
    chats = [Chat.objects.get(pk=pk) for pk in ids]
    started = time.perf_counter()
    for chat in chats:
        chat.complete()
    elapsed = time.perf_counter() - started
    Chat.objects.filter(pk__in=ids).update(state="idle")  # complete() leaves the state alone
    check(ids)
    return elapsed


def through_celery(count: int, timeout: float = 300) -> float:
    from django.db import transaction

    from agentloop.models import Chat

    ids = make_chats(count)
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
    check(ids)
    return elapsed


def figures(name: str, chats: int, seconds: float) -> dict[str, Any]:
    steps = chats * STEPS_PER_CHAT
    row = {
        "variant": name,
        "chats": chats,
        "steps": steps,
        "seconds": round(seconds, 3),
        "steps_per_second": round(steps / seconds, 1),
        "ms_per_step": round(seconds / steps * 1000, 2),
    }
    print(
        f"{name:<28} {steps:>5} steps in {seconds:6.2f} s: {row['steps_per_second']:7.1f} "
        f"steps/s ({row['ms_per_step']:.2f} ms/step)",
        flush=True,
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--chats", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2, help="worker pool processes")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    options = parser.parse_args()

    setup(options.database_url, options.redis_url)
    empty_tables()
    rows = []
    in_process(options.warmup)
    rows.append(figures("in-process run_step", options.chats, in_process(options.chats)))
    in_process_without_lease(options.warmup)
    rows.append(
        figures(
            "in-process complete()",
            options.chats,
            in_process_without_lease(options.chats),
        )
    )
    with workers(options.workers, {"BACKGROUND": "celery"}):
        through_celery(options.warmup)
        name = f"celery, {options.workers} processes"
        rows.append(figures(name, options.chats, through_celery(options.chats)))
    empty_tables()
    result = {"machine": machine(), "results": rows}
    if options.json:
        options.json.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["machine"]))


if __name__ == "__main__":
    main()

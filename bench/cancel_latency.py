"""How long a streaming answer runs on after ``cancel()``: p50 and p95, in and across processes.

    python bench/cancel_latency.py [--samples 40] [--json out.json]

A persisted chat streams a long answer (tests/worker_provider.py ``stream:1000:0.02``: a chunk
every 20 ms, about a model's pace) on PostgreSQL; once it is streaming, after a random 0-500 ms
(so the cancel lands anywhere between chunks and polls), this process calls ``cancel()`` on
another instance of the chat. Measured: from just before ``cancel()`` to the run stopping
(``CancelledError`` raised, the cancellation recorded). Variants:

* in-process, notice: the run is a thread of this process (the cancel wakes it at once);
* in-process, flag only: the flag is set with a plain UPDATE, as a process without Redis
  would; the run finds it at its throttled read (``CANCEL_POLL_INTERVAL``, default 0.2 s);
* worker, Redis notice: the run is a Celery job in a worker process; ``REDIS_URL`` is set on
  both sides, so the cancel is also published and the worker reads the flag at once;
* worker, polling only: no ``REDIS_URL``: the worker finds the flag at its throttled read.

The worker reports when it stopped through the ``chat_cancelled`` signal (bench/celery_app.py);
both processes read CLOCK_MONOTONIC. Target (docs/design.md §4): p95 under 250 ms.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.workers import (  # noqa: E402
    DEFAULT_DATABASE_URL,
    DEFAULT_REDIS_URL,
    empty_tables,
    machine,
    percentile,
    setup,
    workers,
)

QUESTION = "stream:1000:0.02"
TARGET_P95_MS = 250.0
DEADLINE = 30.0


def wait_for(condition: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + DEADLINE
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            sys.exit(f"timed out waiting for {what}")
        time.sleep(0.002)


def new_chat() -> Any:
    from agentloop.models import Chat

    return Chat.objects.create(model="rules:bench").ask_later(QUESTION)


def random_pause() -> None:
    # Longer than a poll interval: the cancel lands at a uniformly random point of the cycle.
    time.sleep(random.uniform(0, 0.5))  # noqa: S311


def in_process_sample(*, notice: bool) -> float:
    """One cancel of a run streaming on a thread of this process; seconds to stop."""
    from django.db import connections
    from django.utils import timezone

    from agentloop import CancelledError
    from agentloop.models import Chat

    chat = new_chat()
    streaming = threading.Event()
    stopped: list[float] = []

    def run() -> None:
        try:
            chat.complete(stream=lambda chunk: streaming.set())
        except CancelledError:
            stopped.append(time.monotonic())
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    if not streaming.wait(DEADLINE):
        faulthandler.dump_traceback(all_threads=True)  # where the run is stuck
        sys.exit("the answer never started streaming")
    random_pause()
    started = time.monotonic()
    if notice:
        Chat.objects.get(pk=chat.pk).cancel()
    else:
        Chat.objects.filter(pk=chat.pk).update(cancel_requested_at=timezone.now())
    thread.join(DEADLINE)
    if not stopped:
        sys.exit("the run was not cancelled")
    return stopped[0] - started


def worker_sample(log: Path) -> float:
    """One cancel of a run streaming in the worker; seconds until the worker stopped."""
    from agentloop.models import Chat

    chat = new_chat()
    chat.complete_later()
    wait_for(
        lambda: chat.messages.filter(role="assistant", status="partial").exists(),
        "the worker to stream",
    )
    random_pause()
    started = time.monotonic()
    Chat.objects.get(pk=chat.pk).cancel()

    def stopped_at() -> float | None:
        for line in log.read_text().splitlines() if log.exists() else []:
            pk, _, when = line.partition(" ")
            if int(pk) == chat.pk:
                return float(when)
        return None

    stopped = wait_for(stopped_at, "the worker to stop")
    wait_for(lambda: Chat.objects.filter(pk=chat.pk, state="idle").exists(), "the job to end")
    return stopped - started


def summarize(name: str, seconds: list[float]) -> dict[str, Any]:
    ms = [value * 1000 for value in seconds]
    row = {
        "variant": name,
        "samples": len(ms),
        "p50_ms": round(statistics.median(ms), 1),
        "p95_ms": round(percentile(ms, 0.95), 1),
        "max_ms": round(max(ms), 1),
    }
    verdict = "ok" if row["p95_ms"] < TARGET_P95_MS else f"over {TARGET_P95_MS:.0f} ms"
    print(
        f"{name:<34} p50 {row['p50_ms']:6.1f} ms   p95 {row['p95_ms']:6.1f} ms   "
        f"max {row['max_ms']:6.1f} ms   ({verdict})",
        flush=True,
    )
    return row


def main() -> None:
    from django.test import override_settings

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    options = parser.parse_args()
    samples = range(options.samples)

    setup(options.database_url, options.redis_url)
    from django.conf import settings

    empty_tables()
    # The worker saves partials often, so this process sees quickly that it streams.
    common = {**settings.AGENTLOOP, "PARTIAL_SAVE_INTERVAL": 0.05}
    rows = []
    with override_settings(AGENTLOOP=common):
        rows.append(
            summarize("in-process, notice", [in_process_sample(notice=True) for _ in samples])
        )
        rows.append(
            summarize(
                "in-process, flag only (poll 0.2 s)",
                [in_process_sample(notice=False) for _ in samples],
            )
        )
    for name, redis_url in (
        ("worker, Redis notice", options.redis_url),
        ("worker, polling only (0.2 s)", None),
    ):
        agentloop = {**common, "REDIS_URL": redis_url}
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "cancelled.log"
            with (
                override_settings(AGENTLOOP=agentloop),
                workers(1, agentloop, env={"BENCH_CANCEL_LOG": str(log)}),
            ):
                worker_sample(log)  # warm-up
                rows.append(summarize(name, [worker_sample(log) for _ in samples]))
    empty_tables()
    result = {"machine": machine(), "target_p95_ms": TARGET_P95_MS, "results": rows}
    if options.json:
        options.json.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["machine"]))


if __name__ == "__main__":
    main()

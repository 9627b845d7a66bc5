"""What an async step (``await chat.astep()``) costs next to a sync one, on the same floor.

    python bench/async_step.py [--database-url URL] [--samples N] [--json out.json]

The chats, the zero-latency provider, the trivial tool and the raw-SQL floor are those of
bench/step_overhead.py (a generate step: one model call and its persistence; a tools step:
``run_tools`` of two calls), on PostgreSQL, at L = 10 and 200 history messages. Three things
are timed per sample, their order rotated every sample, after a warm-up:

* ``chat.step()`` and the floor, on the thread that owns the database connection;
* ``await chat.astep()`` from a coroutine on an event loop, as an async view awaits it: its
  database phases hop to that same thread (``sync_to_async``, thread-sensitive) and back.

Everything runs under one ``async_to_sync`` call, so all three use one connection. Medians;
the ratios are median / median of the floor, and async / sync. Before timing, one step of
each kind runs with its SQL captured: both send the same statements. See bench/README.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a checkout that is not pip-installed
    sys.path.insert(0, str(ROOT))

from bench.step_overhead import (  # noqa: E402  (after the path fix above)
    DEFAULT_DATABASE_URL,
    LENGTHS,
    Bench,
    PoolChat,
    ensure_database,
    finish,
    setup_django,
    summary,
)

KINDS = ("sync", "async", "floor")


class AsyncBench(Bench):
    """bench/step_overhead.py's chats and floor, with ``astep`` timed beside ``step``."""

    def timed_sync_step(self, entry: PoolChat) -> float:
        return self.timed_step(entry)

    async def timed_async_step(self, entry: PoolChat) -> float:
        # Local: asgiref is Django's; imported once Django is set up, as the rest of the bench.
        from asgiref.sync import sync_to_async

        started = time.perf_counter()
        await entry.chat.astep()
        elapsed = time.perf_counter() - started
        await sync_to_async(self.undo)(entry)
        return elapsed

    async def same_sql(self, entry: PoolChat) -> tuple[int, int]:
        """One step of each kind with its SQL captured: the statements must be the same."""
        from asgiref.sync import sync_to_async  # local: see timed_async_step
        from django.test.utils import CaptureQueriesContext

        def sync_sql() -> list[str]:
            with CaptureQueriesContext(self.connection) as queries:
                entry.chat.step()
            self.undo(entry)
            return [q["sql"].split()[0] for q in queries.captured_queries]

        captured = CaptureQueriesContext(self.connection)
        await sync_to_async(captured.__enter__)()
        await entry.chat.astep()
        await sync_to_async(captured.__exit__)(None, None, None)
        # Read on the connection's own thread (``connection`` is a per-thread proxy).
        queries = await sync_to_async(lambda: list(captured.captured_queries))()
        await sync_to_async(self.undo)(entry)
        async_sql = [q["sql"].split()[0] for q in queries]
        expected = await sync_to_async(sync_sql)()
        assert async_sql == expected, (async_sql, expected)
        return len(expected), len(async_sql)

    async def abc(self, entries: list[PoolChat]) -> dict[str, list[float]]:
        from asgiref.sync import sync_to_async  # local: see timed_async_step

        timed = {
            "sync": sync_to_async(self.timed_sync_step),
            "floor": sync_to_async(self.timed_floor),
            "async": self.timed_async_step,
        }
        seconds: dict[str, list[float]] = {kind: [] for kind in KINDS}
        for index in range(self.warmup + self.samples):
            entry = entries[index % len(entries)]
            shift = index % len(KINDS)
            for kind in KINDS[shift:] + KINDS[:shift]:
                elapsed = await timed[kind](entry)
                if index >= self.warmup:
                    seconds[kind].append(elapsed)
        return seconds

    async def variant(self, name: str, *, tool_round: bool) -> dict[str, Any]:  # type: ignore[override]
        from asgiref.sync import sync_to_async  # local: see timed_async_step

        result: dict[str, Any] = {}
        for length in LENGTHS:
            entries = await sync_to_async(self.pool)(length, tool_round=tool_round)
            statements, _ = await self.same_sql(entries[0])
            seconds = await self.abc(entries)
            medians = {kind: summary(values) for kind, values in seconds.items()}
            floor = medians["floor"]["median_ms"]
            row = {
                **medians,
                "sync_ratio": medians["sync"]["median_ms"] / floor,
                "async_ratio": medians["async"]["median_ms"] / floor,
                "async_over_sync": medians["async"]["median_ms"] / medians["sync"]["median_ms"],
                "paired_async_over_sync": statistics.median(
                    a / s for a, s in zip(seconds["async"], seconds["sync"], strict=True)
                ),
                "statements_per_step": statements,
            }
            result[str(length)] = row
            print(
                f"  {name:<9} L={length:<4} sync {medians['sync']['median_ms']:7.3f} ms  "
                f"async {medians['async']['median_ms']:7.3f} ms  floor {floor:7.3f} ms",
                flush=True,
            )
        return result


def report(results: dict[str, Any]) -> None:
    env = results["environment"]
    print()
    print(
        f"agentloop async step — {env['date']}, {env['cpus']} CPUs, Python {env['python']}, "
        f"Django {env['django']}, PostgreSQL {env['postgres']}, {env['samples']} samples"
    )
    print(
        f"load average at start {env['load_average_at_start']}, at end {env['load_average_at_end']}"
    )
    print(f"{'variant':<10}{'L':>5}{'sync med':>11}{'async med':>11}{'floor med':>11}"
          f"{'sync/fl':>9}{'async/fl':>10}{'async/sync':>12}{'paired':>8}{'SQL':>5}")  # fmt: skip
    for name in ("generate", "tools"):
        for length, row in results[name].items():
            print(
                f"{name:<10}{length:>5}{row['sync']['median_ms']:>9.3f}ms"
                f"{row['async']['median_ms']:>9.3f}ms{row['floor']['median_ms']:>9.3f}ms"
                f"{row['sync_ratio']:>8.2f}x{row['async_ratio']:>9.2f}x"
                f"{row['async_over_sync']:>11.2f}x{row['paired_async_over_sync']:>7.2f}x"
                f"{row['statements_per_step']:>5}"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DATABASE_URL)
    )
    parser.add_argument("--samples", type=int, default=300, help="timed samples per case")
    parser.add_argument("--warmup", type=int, default=30, help="untimed samples first")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    ensure_database(args.database_url)
    setup_django(args.database_url)
    from asgiref.sync import async_to_sync  # local: Django (and asgiref) set up just above

    bench = AsyncBench(args.samples, args.warmup)
    bench.reset_tables()
    results: dict[str, Any] = {"environment": bench.environment()}

    async def measure() -> None:
        print("timing (sync / async / floor rotated, medians):", flush=True)
        results["generate"] = await bench.variant("generate", tool_round=False)
        results["tools"] = await bench.variant("tools", tool_round=True)

    async_to_sync(measure)()
    return finish(results, started, report, args.json)


if __name__ == "__main__":
    # Run the importable copy, so the tool of bench.step_overhead keeps its import path.
    from bench.async_step import main as importable_main

    sys.exit(importable_main())

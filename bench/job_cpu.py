"""The client CPU of the job path, counted rather than timed: repeatable on a loaded machine.

    python bench/job_cpu.py [--length 10] [--turns 20] [--variant ask_run_step] [--profile out]
    valgrind --tool=callgrind --collect-atstart=no python bench/job_cpu.py --callgrind ...

Runs ``--turns`` turns of one of ``bench/job_path.py``'s variants (default (d), the turn as users
drive it: ``ask_later(...).complete_later()``, then ``run_step(pk)`` until done) on chats
of ``--length`` messages, after ``--warmup`` untimed turns, with the same zero-latency model,
tool and database as that benchmark (PostgreSQL; the default database is
``agentloop_bench_cpu``, emptied). Only the turns are measured, not the clean-up between them:

* ``--profile FILE``: cProfile over the turns (``python -m pstats FILE``); the total number
  of Python function calls per step is printed (deterministic for the same code);
* ``--callgrind``: under ``valgrind --tool=callgrind --collect-atstart=no``, collection is
  switched on for the turns only (a client request from a small C helper built with the
  machine's compiler), so ``callgrind_annotate`` totals the instructions the turns cost
  (the server's work is in another process and not counted);
* always: the process's CPU time per step (``time.process_time()``, the kernel's part
  included: noisy under load; the counts above are not).
"""

from __future__ import annotations

import argparse
import cProfile
import ctypes
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a checkout that is not pip-installed
    sys.path.insert(0, str(ROOT))

from bench.step_overhead import ensure_database, setup_django  # noqa: E402

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/agentloop_bench_cpu"
STEPS = 5

_HELPER = r"""
#include <valgrind/callgrind.h>
void agentloop_collect(void) { CALLGRIND_TOGGLE_COLLECT; }
"""


def collector() -> Any:
    """A function that toggles callgrind's collection (a no-op outside valgrind)."""
    folder = Path(tempfile.mkdtemp(prefix="agentloop-cpu-"))
    source, library = folder / "collect.c", folder / "collect.so"
    source.write_text(_HELPER)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(library), str(source)], check=True)
    return ctypes.CDLL(str(library)).agentloop_collect


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    parser.add_argument("--length", type=int, default=10, help="messages of history")
    parser.add_argument("--turns", type=int, default=20, help="measured turns (5 steps each)")
    parser.add_argument("--warmup", type=int, default=6)
    parser.add_argument(
        "--variant",
        default="ask_run_step",
        choices=("run_step", "get_step", "complete", "ask_run_step"),
    )
    parser.add_argument("--profile", type=Path, help="write cProfile stats of the turns here")
    parser.add_argument("--callgrind", action="store_true", help="toggle callgrind collection")
    args = parser.parse_args(argv)

    ensure_database(args.database_url)
    setup_django(args.database_url)
    from bench.job_path import ASKS, JobPath

    toggle = collector() if args.callgrind else None
    bench = JobPath(args.database_url, args.turns, args.warmup)
    bench.reset_tables()
    entries = bench.pool(args.length, asks=args.variant in ASKS)
    turn, _, state = bench.variants()[args.variant]
    for entry in entries:
        bench.undo(entry, state)
    for index in range(args.warmup):
        entry = entries[index % len(entries)]
        turn(entry.pk)
        bench.undo(entry, state)

    # The thread's CPU clock: time spent waiting on the database isn't counted as a function's.
    profile = cProfile.Profile(time.thread_time) if args.profile else None
    cpu = 0.0
    for index in range(args.turns):
        entry = entries[index % len(entries)]
        started = time.process_time()
        if toggle is not None:
            toggle()
        if profile is not None:
            profile.enable()
        turn(entry.pk)
        if profile is not None:
            profile.disable()
        if toggle is not None:
            toggle()
        cpu += time.process_time() - started
        bench.undo(entry, state)
    bench.reset_tables()

    steps = args.turns * STEPS
    print(f"{args.variant} L={args.length}: {steps} steps, {cpu / steps * 1e6:.0f} us CPU per step")
    if profile is not None:
        profile.dump_stats(args.profile)
        stats = pstats.Stats(profile)
        total = stats.total_calls  # type: ignore[attr-defined]
        print(f"python calls: {total} ({total / steps:.1f} per step)")
    return 0


if __name__ == "__main__":
    # The importable copy, so the benchmark's tool has an import path (see job_path.py).
    from bench.job_cpu import main as importable_main

    sys.exit(importable_main())

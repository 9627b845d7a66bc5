"""Recovery time per fault kind: the fault suite (tests/faults/) run several times.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/agentloop \\
        python bench/faults.py [--runs 5] [-k EXPRESSION] [--json out.json]

Each run is one ``pytest tests/faults`` (``-k`` selects scenarios); every scenario that
recovers appends ``{"fault": ..., "seconds": ...}`` to ``$AGENTLOOP_FAULT_TIMES`` (the time
from the fault's end, or from the cut for a partition, to every chat complete; see
``tests.faults.parts.record_recovery``). Prints per fault kind the median, min and max over
the runs, and the wall time of each suite run (what the suite adds to CI). Scenarios that are
still expected failures (xfail: waiting for another branch's fix) record nothing.
See docs/operations.md for the recorded figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("-k", dest="select", default="", help="pytest -k expression")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    options = parser.parse_args()
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        sys.exit("set DATABASE_URL to a PostgreSQL server: the fault suite runs there")

    times: dict[str, list[float]] = defaultdict(list)
    walls = []
    with tempfile.TemporaryDirectory() as scratch:
        record = Path(scratch) / "times.jsonl"
        for run in range(options.runs):
            command = [
                sys.executable,
                "-m",
                "pytest",
                "tests/faults",
                "-q",
                "-p",
                "no:cacheprovider",
            ]
            if options.select:
                command += ["-k", options.select]
            started = time.monotonic()
            done = subprocess.run(  # noqa: S603 - our own interpreter and tests
                command,
                cwd=ROOT,
                env={**os.environ, "AGENTLOOP_FAULT_TIMES": str(record)},
                capture_output=True,
                text=True,
                check=False,
            )
            walls.append(time.monotonic() - started)
            tail = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
            print(f"run {run + 1}: {walls[-1]:.1f} s, {tail}", flush=True)
            if done.returncode:
                print(done.stdout[-3000:], done.stderr[-2000:], sep="\n")
        for line in record.read_text().splitlines() if record.exists() else []:
            entry = json.loads(line)
            times[entry["fault"]].append(entry["seconds"])

    figures = {
        fault: {
            "runs": len(values),
            "median": statistics.median(values),
            "min": min(values),
            "max": max(values),
        }
        for fault, values in sorted(times.items())
    }
    print(f"\n{'fault':<50} {'runs':>4} {'median':>8} {'min':>7} {'max':>7}")
    for fault, figure in figures.items():
        print(
            f"{fault:<50} {figure['runs']:>4} {figure['median']:>7.2f}s "
            f"{figure['min']:>6.2f}s {figure['max']:>6.2f}s"
        )
    print(f"suite wall time per run: median {statistics.median(walls):.1f} s "
          f"(min {min(walls):.1f}, max {max(walls):.1f})")  # fmt: skip
    if options.json:
        options.json.write_text(json.dumps({"recovery": figures, "wall": walls}, indent=2))


if __name__ == "__main__":
    main()

"""The stalled-chat sweeper at scale: ``resume_stalled()`` over 100,000 chats.

    python bench/sweeper.py [--database-url URL] [--chats 100000] [--repeats 30] [--json out.json]

Fills a database of its own (emptied first) with ``--chats`` chats by COPY: most idle (updated
over the last 30 days), a few waiting, failed, stopped, running under a live lease or queued a
moment ago, and 1% stalled (half running with a lease that expired ten minutes ago, half
queued an hour ago, with no lease). After ``VACUUM ANALYZE`` it times, medians over
``--repeats`` runs each:

* the sweeper's query: ``agentloop.runners.sweeper.stalled_chats()``, its primary keys fetched, as
  ``resume_stalled()`` reads them;
* ``agentloop.runners.sweeper.resume_stalled()`` whole, with the enqueue replaced by a counter (no
  broker: the publishing is the broker's cost, not the query's);

checks that exactly the stalled chats are found, and prints ``EXPLAIN (ANALYZE, BUFFERS)`` of
the query, saying whether it uses an index. Target: under 50 ms per sweep at 100,000 chats.
See bench/README.md for a recorded run.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a checkout that is not pip-installed
    sys.path.insert(0, str(ROOT))

from bench.step_overhead import ensure_database, load_average, setup_django, summary  # noqa: E402

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/agentloop_bench_sweeper"
TARGET_MS = 50.0
#: state -> share of the chats (the rest are idle); "stalled-*" are what the sweeper must find.
MIX = {
    "stalled-running": 0.005,
    "stalled-queued": 0.005,
    "running": 0.002,  # a live lease
    "queued": 0.005,  # queued a moment ago: its job is on its way
    "waiting": 0.005,
    "failed": 0.005,
    "stopped": 0.003,
}


def kinds(count: int, seed: int = 11) -> list[str]:
    """What each of ``count`` chats is, shuffled so stalled rows spread over the table."""
    planned = [kind for kind, share in MIX.items() for _ in range(round(count * share))]
    planned += ["idle"] * (count - len(planned))
    random.Random(seed).shuffle(planned)
    return planned


def chat_fields(kind: str, now: datetime, rng: random.Random) -> dict[str, Any]:
    """State, lease and times of one chat of ``kind``."""
    long_ago = now - timedelta(days=30 * rng.random(), seconds=600)
    if kind == "stalled-running":
        return {
            "state": "running",
            "lease_token": f"{rng.getrandbits(128):032x}",
            "lease_expires_at": now - timedelta(minutes=10),
            "updated_at": now - timedelta(minutes=11),
        }
    if kind == "stalled-queued":
        return {"state": "queued", "updated_at": now - timedelta(hours=1)}
    if kind == "running":
        return {
            "state": "running",
            "lease_token": f"{rng.getrandbits(128):032x}",
            "lease_expires_at": now + timedelta(hours=1),  # outlives the run
            "updated_at": now,
        }
    if kind == "queued":
        return {"state": "queued", "updated_at": now + timedelta(hours=1)}  # fresh all run long
    return {"state": kind, "updated_at": long_ago}


def fill(count: int) -> int:
    """COPY ``count`` chats into the emptied table; returns how many are stalled."""
    # Django is set up at run time (setup_django), after this module is imported.
    from django.db import connection, transaction

    from agentloop.models import Chat

    fields = [f for f in Chat._meta.concrete_fields if not f.primary_key]
    columns = ", ".join(f'"{f.column}"' for f in fields)
    table = Chat._meta.db_table
    now = datetime.now(UTC)
    rng = random.Random(7)
    planned = kinds(count)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f'TRUNCATE "{table}" RESTART IDENTITY CASCADE')
        with cursor.cursor.copy(f'COPY "{table}" ({columns}) FROM STDIN') as copy:
            for index, kind in enumerate(planned):
                chat = Chat(
                    model="bench:zero-latency",
                    title=f"chat {index}",
                    created_at=now - timedelta(days=60),
                    **chat_fields(kind, now, rng),
                )
                copy.write_row(
                    [f.get_db_prep_save(getattr(chat, f.attname), connection) for f in fields]
                )
    with connection.cursor() as cursor:
        cursor.execute(f'VACUUM ANALYZE "{table}"')
    return sum(1 for kind in planned if kind.startswith("stalled-"))


@contextmanager
def enqueues_counted() -> Iterator[list[Any]]:
    """Replace the sweeper's enqueue with a counter (and the backend's send, as a backstop)."""
    from agentloop.runners import enqueueing, sweeper  # local: they import Django models

    sent: list[Any] = []

    def record(chat_id: Any, *args: Any, **kwargs: Any) -> None:
        sent.append(chat_id)

    patched = [
        (module, name, getattr(module, name))
        for module, name in ((sweeper, "enqueue"), (enqueueing, "send"))
        if hasattr(module, name)
    ]
    for module, name, _ in patched:
        setattr(module, name, record)
    try:
        yield sent
    finally:
        for module, name, original in patched:
            setattr(module, name, original)


def timings(repeats: int, stalled: int) -> dict[str, Any]:
    from agentloop.runners.sweeper import resume_stalled, stalled_chats  # local: Django models

    query: list[float] = []
    sweep: list[float] = []
    for _ in range(repeats):
        started = time.perf_counter()
        found = list(stalled_chats().values_list("pk", flat=True))
        query.append(time.perf_counter() - started)
        if len(found) != stalled:
            sys.exit(f"stalled_chats() found {len(found)} chats; {stalled} are stalled")
        with enqueues_counted() as sent:
            started = time.perf_counter()
            resumed = resume_stalled()
            sweep.append(time.perf_counter() - started)
        if len(resumed) != stalled or len(sent) != stalled:
            sys.exit(
                f"resume_stalled() returned {len(resumed)} and enqueued {len(sent)}; "
                f"{stalled} are stalled (has the enqueue path changed? see enqueues_counted)"
            )
    return {"query": summary(query), "resume_stalled": summary(sweep)}


def explain() -> tuple[str, bool]:
    """EXPLAIN (ANALYZE, BUFFERS) of the sweeper's query, and whether it reads an index."""
    # Django is set up at run time (setup_django), after this module is imported.
    from django.db import connection

    from agentloop.runners.sweeper import stalled_chats

    sql, params = stalled_chats().values_list("pk", flat=True).query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    return plan, "Index" in plan and "Seq Scan" not in plan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url", default=DEFAULT_DATABASE_URL, help="a database of its own: emptied"
    )
    parser.add_argument("--chats", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=30, help="timed sweeps")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    if args.chats < 100 or args.repeats < 1:
        parser.error("--chats must be at least 100 and --repeats at least 1")

    ensure_database(args.database_url)
    setup_django(args.database_url)
    load_before = load_average()
    started = time.perf_counter()
    stalled = fill(args.chats)
    filled = time.perf_counter() - started
    print(f"{args.chats} chats ({stalled} stalled) written in {filled:.1f} s", flush=True)
    results: dict[str, Any] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "chats": args.chats,
        "stalled": stalled,
        "fill_seconds": round(filled, 2),
        **timings(args.repeats, stalled),
    }
    plan, indexed = explain()
    results.update(plan=plan, uses_index=indexed, load_average_before=load_before)
    results["load_average_after"] = load_average()
    print()
    print(
        f"sweeper over {args.chats} chats, {stalled} stalled; {args.repeats} sweeps; load average "
        f"before {load_before}, after {results['load_average_after']}"
    )
    for name in ("query", "resume_stalled"):
        row = results[name]
        verdict = "met" if row["median_ms"] < TARGET_MS else "MISSED"
        print(
            f"  {name:<15} median {row['median_ms']:7.2f} ms  p90 {row['p90_ms']:7.2f} ms  "
            f"min {row['min_ms']:7.2f} ms  (target < {TARGET_MS:.0f} ms: {verdict})"
        )
    print(f"EXPLAIN (ANALYZE, BUFFERS), {'uses an index' if indexed else 'NO index used'}:")
    print(plan)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

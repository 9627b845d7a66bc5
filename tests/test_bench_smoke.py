"""The job-path, sweeper, tracing and memory benchmarks still run (tiny samples; nothing is
timed here).

They need PostgreSQL: skipped unless ``DATABASE_URL`` names one. Each script gets a database
of its own, named after this process (the scripts empty their tables), dropped afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from bench.job_path import LABELS, LENGTHS, STEPS

REPO_ROOT = Path(__file__).resolve().parent.parent
DATABASE_URL = os.environ.get("DATABASE_URL", "")

pytestmark = [
    pytest.mark.subprocess,
    pytest.mark.skipif(
        not DATABASE_URL.startswith(("postgres://", "postgresql://")),
        reason="the benchmarks need PostgreSQL (set DATABASE_URL)",
    ),
]


@pytest.fixture
def bench_database(request: pytest.FixtureRequest) -> Iterator[str]:
    """The URL of a database for one script, dropped after the test."""
    # Local: psycopg is installed with the postgres extra, which the SQLite run may lack.
    import psycopg
    from psycopg import sql

    parts = urlsplit(DATABASE_URL)
    # The pid first: a long test name cut at 63 characters must not drop it (parallel runs).
    name = f"agentloop_bench_{os.getpid()}_{request.node.name[5:]}"[:63]
    yield urlunsplit(parts._replace(path=f"/{name}"))
    maintenance = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(maintenance, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def run(script: str, *args: str) -> str:
    done = subprocess.run(  # noqa: S603 - our own interpreter and script
        [sys.executable, f"bench/{script}", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_job_path_prints_every_cell_and_counts_statements(
    bench_database: str, tmp_path: Path
) -> None:
    out = tmp_path / "job_path.json"
    printed = run(
        "job_path.py", "--samples=2", "--warmup=0", f"--database-url={bench_database}",
        f"--json={out}",
    )  # fmt: skip

    assert "statements per job" in printed
    for label in LABELS.values():
        rows = [line for line in printed.splitlines() if line.startswith(label)]
        assert [row.split()[len(label.split())] for row in rows] == [str(n) for n in LENGTHS]
    cells = json.loads(out.read_text())["cells"]
    for name in LABELS:
        for length in LENGTHS:
            cell = cells[name][str(length)]
            assert cell["agentloop"]["samples"] == cell["floor"]["samples"] == 2
            assert cell["ratio"] > 0
            statements = cell["statements"]
            assert len(statements["per_job"]) == (1 if name == "complete" else STEPS)
            assert all(count > 0 for count in statements["per_job"])
    # The floor's own statements: BEGIN, SELECT, INSERT, UPDATE, COMMIT per step; in loop
    # mode one SELECT, then BEGIN, INSERT, UPDATE, COMMIT per step.
    assert cells["get_step"]["10"]["statements"]["floor_per_turn"] == 5 * STEPS
    assert cells["complete"]["10"]["statements"]["floor_per_turn"] == 1 + 4 * STEPS
    # As users drive it: the question's own write first (BEGIN, INSERT, UPDATE, COMMIT).
    assert cells["ask_run_step"]["10"]["statements"]["floor_per_turn"] == 4 + 5 * STEPS
    assert cells["ask_run_step"]["10"]["statements"]["asking"] > 0


def test_sweeper_finds_exactly_the_stalled_chats_and_explains_its_query(
    bench_database: str, tmp_path: Path
) -> None:
    out = tmp_path / "sweeper.json"
    printed = run(
        "sweeper.py", "--chats=2000", "--repeats=2", f"--database-url={bench_database}",
        f"--json={out}",
    )  # fmt: skip

    assert "EXPLAIN (ANALYZE, BUFFERS)" in printed
    results = json.loads(out.read_text())
    assert results["chats"] == 2000
    assert results["stalled"] == 20  # 1%, and the script exits if it finds more or fewer
    assert "agentloop_chat" in results["plan"]


def test_tracing_bench_times_each_variant_and_checks_its_spans(
    bench_database: str, tmp_path: Path
) -> None:
    out = tmp_path / "tracing.json"
    # The script exits non-zero unless off made no span and on made the turn's four.
    run(
        "tracing.py", "--samples=3", "--db-samples=2", "--warmup=0",
        f"--database-url={bench_database}", f"--json={out}",
    )  # fmt: skip

    results = json.loads(out.read_text())
    assert results["memory"]["on"]["spans_per_turn"] == 4
    assert results["persisted"]["off"]["spans_per_turn"] == 0
    assert results["persisted"]["content"]["samples"] == 2


def test_async_step_prints_its_table_and_sends_the_sync_steps_statements(
    bench_database: str, tmp_path: Path
) -> None:
    out = tmp_path / "async_step.json"
    printed = run(
        "async_step.py", "--samples=3", "--warmup=0", f"--database-url={bench_database}",
        f"--json={out}",
    )  # fmt: skip

    assert "async/sync" in printed
    results = json.loads(out.read_text())
    for name in ("generate", "tools"):
        for length in ("10", "200"):
            row = results[name][length]
            assert row["sync"]["samples"] == row["async"]["samples"] == row["floor"]["samples"] == 3
            assert row["async_over_sync"] > 0
            assert row["statements_per_step"] > 0  # the same statements (checked by the script)


def test_in_flight_answers_every_chat_within_the_workers_pool(
    bench_database: str, tmp_path: Path
) -> None:
    out = tmp_path / "in_flight.json"
    run(
        "in_flight.py", "--pool=threads", "--concurrency=4", "--chats=6", "--latency=0.3",
        "--db-pool-size=2", f"--database-url={bench_database}", f"--json={out}",
    )  # fmt: skip

    [row] = json.loads(out.read_text())
    assert row["answered_exactly"] is True
    assert row["model_calls"] == 12
    assert 0 < row["peak_pg_backends"] <= 2
    assert row["peak_rss_mib"] > 0
    assert row["cpu_ms_per_step"] > 0
    # Both floors ran in the same worker (the libraries' one checks it wrote 3 rows a chat).
    assert row["floor_ratio"] > 0 and row["floor_cpu_ms_per_job"] > 0
    assert row["library_floor_ratio"] > 0 and row["library_floor_cpu_ms_per_job"] > 0


def test_in_flight_runs_several_worker_processes_on_one_queue(
    bench_database: str, tmp_path: Path
) -> None:
    out = tmp_path / "in_flight_workers.json"
    run(
        "in_flight.py", "--pool=threads", "--concurrency=2", "--workers=2", "--chats=6",
        "--latency=0.3", "--db-pool-size=2", "--no-floor", f"--database-url={bench_database}",
        f"--json={out}",
    )  # fmt: skip

    [row] = json.loads(out.read_text())
    assert row["answered_exactly"] is True
    assert row["workers"] == row["worker_processes"] == 2
    assert row["ideal_s"] == 2 * 0.6  # 6 chats over 2 x 2 in flight: two rounds
    assert row["model_calls"] == 12
    assert 0 < row["peak_pg_backends"] <= 4  # a pool of 2 in each


def test_bulk_control_runs_every_verb_in_batches(bench_database: str, tmp_path: Path) -> None:
    out = tmp_path / "bulk_control.json"
    run(
        "bulk_control.py", "--chats=400", "--waiting=5", "--batch-size=100",
        f"--database-url={bench_database}", f"--json={out}",
    )  # fmt: skip

    rows = {row["verb"]: row for row in json.loads(out.read_text())["results"]}
    # 400 chats: 15% queued and 10% running are in flight; 5% stopped; 405 in all.
    assert rows["halt (all 405 chats)"]["changed"] == 100
    # A count, an UPDATE of the 100 (a full batch), one that finds none, the check that
    # nothing is left.
    assert rows["halt (all 405 chats)"]["statements"] == 4
    assert rows["cancel (5 waiting for a person)"]["changed"] == 5
    assert rows["resume, jobs dropped"]["changed"] == 20
    assert rows["complete_later, jobs dropped"]["changed"] == 365  # all but the 40 running


def test_eval_throughput_times_turns_and_eval_cases_alike(
    bench_database: str, tmp_path: Path
) -> None:
    out = tmp_path / "eval_throughput.json"
    run(
        "eval_throughput.py", "--cases=10", "--warmup=2", f"--database-url={bench_database}",
        f"--json={out}",
    )  # fmt: skip

    row = json.loads(out.read_text())
    assert row["cases"] == 10  # every chat answered once, every case passed (checked)
    assert row["turns_s"] > 0 and row["eval_s"] > 0
    assert row["ratio"] == pytest.approx(row["eval_s"] / row["turns_s"], rel=0.01)


def test_memory_bench_times_hnsw_and_exact_search_and_counts_recall(
    bench_database: str, tmp_path: Path
) -> None:
    out = tmp_path / "memory.json"
    printed = run(
        "memory.py", "--sizes=300", "--queries=5", "--exact-queries=3", "--ef-search=40",
        "--insert-rows=20", f"--database-url={bench_database}", f"--json={out}",
    )  # fmt: skip

    assert "hnsw ef_search=40" in printed and "exact  p50" in printed
    (size,) = json.loads(out.read_text())["sizes"]
    assert size["size"] == 300 and size["build_seconds"] > 0
    assert size["exact"]["samples"] == 3
    hnsw = size["hnsw"]["40"]
    # A plan without the index (300 rows: the planner may scan) is timed on as few queries
    # as the exact search.
    assert hnsw["samples"] == (5 if hnsw["uses_index"] else 3)
    assert 0.8 <= hnsw["recall_at_10"] <= 1.0
    assert size["insert"]["rows"] == 20 and size["insert"]["rows_per_second"] > 0

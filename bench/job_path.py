"""The job path against a raw psycopg floor: what one background step costs, per step of a turn.

    python bench/job_path.py [--database-url URL] [--samples N] [--warmup N] [--json out.json]

One turn is five steps (the model asks for a tool, the tool runs, the model asks for a tool,
the tool runs, the model answers), with a zero-latency in-process model
(``agentloop.testing.FunctionProvider`` deciding from the history) and a trivial tool, on
PostgreSQL, at L = 10 and 200 messages of history before the turn. Timed per turn, reported
per step (turn time / 5):

(a) ``agentloop.runners.run_step(pk)`` until it stops asking for another job: the body of the
    Celery task (lease, load, step, release), without the broker;
(b) ``Chat.objects.get(pk=pk).step()`` five times: a fresh chat object per step;
(c) ``Chat.objects.get(pk=pk).complete()`` once: loop mode, one process;
(d) the turn as users drive it: ``Chat.objects.get(pk=pk).ask_later(question)
    .complete_later()`` (the question is not in the history yet), then ``run_step(pk)`` until
    done, as (a); the job ``complete_later()`` sends is not published (no broker, as in (a));

each against a floor on a psycopg connection of its own (autocommit, an explicit
BEGIN/COMMIT, client-side binding; no Django): per step SELECT every column of the chat's
messages ordered by id, INSERT one message, UPDATE the chat row, in one transaction; for (c)
the floor's loop mode: one SELECT per turn, then BEGIN, INSERT, UPDATE, COMMIT per step; for
(d) the user's message first (BEGIN, INSERT, UPDATE, COMMIT), then the floor of (a).
Variant and floor turns alternate (the order swaps every sample) on the same chats; the rows a
turn added are deleted after it, outside the timing, so every turn sees L messages.

SQL statements per job are counted in a separate, untimed pass with Django's
``CaptureQueriesContext`` (Django logs each transaction's BEGIN and COMMIT among them), so
they compare with the floor's 5. See bench/README.md for recorded figures.
"""

from __future__ import annotations

import argparse
import inspect
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import django
import psycopg

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a checkout that is not pip-installed
    sys.path.insert(0, str(ROOT))

from agentloop import tool  # noqa: E402  (importing agentloop never needs Django settings)
from agentloop.testing import tool_call  # noqa: E402
from bench.sql_floor import Floor  # noqa: E402
from bench.step_overhead import (  # noqa: E402
    ensure_database,
    finish,
    load_average,
    setup_django,
    summary,
)

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/agentloop_bench_jobs"
LENGTHS = (10, 200)
STEPS = 5  # model, tool, model, tool, model
TOOL_ROUNDS = 2
POOL_SIZE = 4  # chats per length, used in turn
PROVIDER = "jobpath"
MODEL = f"{PROVIDER}:zero-latency"
TOOL_PATH = "bench.job_path.lookup"
QUESTION = "Where is order 31337, and when will it reach the customer in Lyon?"
ANSWER = "Order 31337 left Rotterdam yesterday and should reach Lyon on Thursday morning."
#: (target, must) ratio to the floor per variant; (c) is against the floor's loop mode.
TARGETS = {
    "run_step": (2.0, 2.5),
    "get_step": (1.7, 2.0),
    "complete": (1.5, 2.0),
    "ask_run_step": (2.0, 2.5),
}
#: statements per job: a model step, and a tool round (7 + 1 per tool call; one call here).
MODEL_STEP_STATEMENTS = 7
TOOL_ROUND_STATEMENTS = 7 + 1
#: role, content, model, finish_reason of the message each step of a turn writes.
TURN = [
    ("assistant", "", "zero-latency", "tool_calls"),
    ("tool", "value of k0", "", ""),
    ("assistant", "", "zero-latency", "tool_calls"),
    ("tool", "value of k1", "", ""),
    ("assistant", ANSWER, "zero-latency", "stop"),
]
LABELS = {
    "run_step": "(a) run_step(pk), per job",
    "get_step": "(b) Chat.objects.get(pk).step()",
    "complete": "(c) get(pk).complete(), /5",
    "ask_run_step": "(d) ask_later+complete_later, jobs",
}
#: the variants whose turn adds the user's question itself: their history ends before it.
ASKS = {"ask_run_step"}


@tool
def lookup(key: str) -> str:
    """Looks up a value by key (returns at once: the benchmark's trivial tool).

    Args:
        key: What to look up.
    """
    return f"value of {key}"


def decide(request: Any) -> Any:
    """Ask for ``lookup`` until two results follow the latest user message, then answer."""
    messages = list(request.messages)
    last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)
    results = sum(1 for m in messages[last_user + 1 :] if m.role == "tool")
    if results < TOOL_ROUNDS:
        return tool_call("lookup", {"key": f"k{results}"})
    return ANSWER


# -- counting statements, as the tests do ------------------------------------------------------


@contextmanager
def counted() -> Iterator[list[str]]:
    """The statements the block sent on Django's connection (not while timing: capturing
    costs time). Django logs BEGIN and COMMIT with them, so they compare with the floor's."""
    # Django is set up at run time (setup_django), after this module is imported.
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    found: list[str] = []
    with CaptureQueriesContext(connection) as queries:
        yield found
    found.extend(q["sql"] for q in queries.captured_queries)


# -- the benchmark ----------------------------------------------------------------------------


@dataclass
class Entry:
    pk: int
    last_id: int  # id of the last history message: rows above it are the turn's
    row: dict[str, Any]  # the chat row's columns before any turn, restored after each


class JobPath:
    def __init__(self, url: str, samples: int, warmup: int) -> None:
        # Django is set up at run time (setup_django), after this module is imported.
        from django.db import connection

        from agentloop import providers
        from agentloop.models import Chat, Message, ToolCall, Usage
        from agentloop.runners import run_step
        from agentloop.testing import FunctionProvider

        self.samples, self.warmup = samples, warmup
        self.connection = connection
        self.Chat, self.Message = Chat, Message
        self.run_step = run_step
        self.run_step_signature = str(inspect.signature(run_step))
        self.provider = FunctionProvider(decide)
        providers.register(PROVIDER, self.provider)
        self.tables = {
            "chat": Chat._meta.db_table,
            "message": Message._meta.db_table,
            "toolcall": ToolCall._meta.db_table,
            "usage": Usage._meta.db_table,
        }
        columns = [f.column for f in Message._meta.concrete_fields]
        self.floor = Floor(
            url, self.tables["message"], self.tables["chat"], columns, TURN, QUESTION
        )
        # (d)'s complete_later() sends its first job after the commit: not published here (no
        # broker, as in (a), whose next jobs aren't either); the bench runs the jobs itself.
        from agentloop.runners import enqueueing

        enqueueing.send = lambda job: None

    # -- data ---------------------------------------------------------------------------------
    def reset_tables(self) -> None:
        names = ", ".join(f'"{name}"' for name in self.tables.values())
        with self.connection.cursor() as cursor:
            cursor.execute(f"TRUNCATE {names} RESTART IDENTITY CASCADE")

    def history(self, chat_pk: int, length: int) -> list[Any]:
        """A system message, then user and assistant messages in turn, ending with the question."""
        rows = [self.Message(chat_id=chat_pk, role="system", content="You answer briefly.")]
        for index in range(1, length):
            if (length - 1 - index) % 2 == 0:
                content = QUESTION if index == length - 1 else f"Where is order {index:05d}?"
                rows.append(self.Message(chat_id=chat_pk, role="user", content=content))
            else:
                rows.append(
                    self.Message(
                        chat_id=chat_pk,
                        role="assistant",
                        content=f"Order {index:05d} left Rotterdam and reaches Lyon on Thursday.",
                        model="zero-latency",
                        finish_reason="stop",
                    )
                )
        return rows

    def pool(self, length: int, *, asks: bool = False) -> list[Entry]:
        """Chats with ``length`` messages of history up to the question; ``asks``: without the
        question (the turn adds it: the turn's first model call sees ``length`` messages)."""
        chats = self.Chat.objects.bulk_create(
            [self.Chat(model=MODEL, tools=[TOOL_PATH]) for _ in range(POOL_SIZE)]
        )
        cut = -1 if asks else None
        rows = [row for chat in chats for row in self.history(chat.pk, length)[:cut]]
        self.Message.objects.bulk_create(rows, batch_size=2000)
        last = {row.chat_id: row.pk for row in rows}
        fresh = self.Chat.objects.filter(pk__in=[chat.pk for chat in chats]).values()
        return [
            Entry(row["id"], last[row["id"]], {k: v for k, v in row.items() if k != "id"})
            for row in fresh
        ]

    def undo(self, entry: Entry, state: str) -> None:
        """Delete what a turn added and reset the chat row, so the next turn starts alike."""
        from django.db import transaction  # local: Django is set up at run time

        t = self.tables
        with transaction.atomic(), self.connection.cursor() as cursor:
            # One transaction: tool results and their calls reference each other.
            cursor.execute(f'DELETE FROM "{t["usage"]}" WHERE "chat_id" = %s', [entry.pk])
            cursor.execute(
                f'DELETE FROM "{t["message"]}" WHERE "chat_id" = %s AND "id" > %s',
                [entry.pk, entry.last_id],
            )
            cursor.execute(f'DELETE FROM "{t["toolcall"]}" WHERE "chat_id" = %s', [entry.pk])
            # Every column as it was (lease, cancel flag, any the job path adds later).
            self.Chat.objects.filter(pk=entry.pk).update(**{**entry.row, "state": state})
        self.provider.requests.clear()  # FunctionProvider records requests; keep memory flat

    # -- the variants: each runs one whole turn -------------------------------------------------
    def turn_run_step(self, pk: int) -> int:
        """Jobs until the runner stops asking for another (the task would re-enqueue)."""
        jobs = 0
        while True:
            outcome = self.run_step(pk)
            jobs += 1
            again = getattr(outcome, "enqueue_next", None)
            if again is None:  # the outcome's shape changed: fall back on its action
                again = getattr(outcome, "action", None) == "again"
            if not again or jobs > 2 * STEPS:
                return jobs

    def get_and_step(self, pk: int) -> Any:
        return self.Chat.objects.get(pk=pk).step()

    def turn_get_step(self, pk: int) -> int:
        for _ in range(STEPS):
            self.get_and_step(pk)
        return STEPS

    def turn_ask_run_step(self, pk: int) -> int:
        """The question added and the chat queued in-process (a view), then its jobs."""
        self.Chat.objects.get(pk=pk).ask_later(QUESTION).complete_later()
        return self.turn_run_step(pk)

    def turn_complete(self, pk: int) -> int:
        self.Chat.objects.get(pk=pk).complete()
        return 1

    def variants(self) -> dict[str, tuple[Callable[[int], int], Callable[[int], None], str]]:
        """name -> (the turn, its floor, the chat state a turn starts from)."""
        return {
            "run_step": (self.turn_run_step, self.floor.turn, "queued"),
            "get_step": (self.turn_get_step, self.floor.turn, "idle"),
            "complete": (self.turn_complete, self.floor.loop_turn, "idle"),
            "ask_run_step": (self.turn_ask_run_step, self.floor.ask_turn, "idle"),
        }

    # -- checks and statement counts (untimed) --------------------------------------------------
    def check_turn(self, entry: Entry, length: int, *, asks: bool = False) -> None:
        """The turn wrote exactly its five messages (after the question it added, ``asks``),
        the last one the answer."""
        rows = list(
            self.Message.objects.filter(chat_id=entry.pk, id__gt=entry.last_id).values_list(
                "role", "content"
            )
        )
        expected = [row[0] for row in TURN]
        if asks:
            expected = ["user", *expected]
        if [role for role, _ in rows] != expected or rows[-1][1] != ANSWER:
            sys.exit(f"The turn did not run as planned (L={length}): {rows}")

    def count(self, name: str, entry: Entry, length: int) -> dict[str, Any]:
        """Statements per job (per step for (b); per turn for (c)), outside any timing."""
        turn, floor, state = self.variants()[name]
        jobs: list[list[str]] = []
        asks = name in ASKS
        if asks:  # the view's part: the question added and the chat queued
            with counted() as found:
                self.Chat.objects.get(pk=entry.pk).ask_later(QUESTION).complete_later()
            asked = len(found)
        if name == "complete":
            with counted() as found:
                turn(entry.pk)
            jobs.append(found)
        else:
            one = self.run_step if name in ("run_step", "ask_run_step") else self.get_and_step
            for _ in range(STEPS + 1):  # the sixth must find the turn settled: adds nothing
                with counted() as found:
                    one(entry.pk)
                jobs.append(found)
            jobs.pop()
        self.check_turn(entry, length, asks=asks)
        settled = self.Chat.objects.filter(pk=entry.pk).values_list("state", "lease_token").get()
        if name in ("run_step", "ask_run_step") and settled != ("idle", ""):
            sys.exit(f"run_step: the chat ended {settled}, not idle and free (L={length})")
        self.undo(entry, state)
        before = self.floor.statements
        floor(entry.pk)
        floor_statements = self.floor.statements - before
        self.undo(entry, state)
        counts = [len(job) for job in jobs]
        result: dict[str, Any] = {
            "per_job": counts,
            "sql": jobs,
            "floor_per_turn": floor_statements,
        }
        if asks:
            result["asking"] = asked
        if name == "complete":
            result["per_step"] = counts[0] / STEPS
        else:
            result["model_step_max"] = max(counts[0::2])
            result["tool_round_max"] = max(counts[1::2])
        return result

    # -- timing ---------------------------------------------------------------------------------
    def timed(self, run: Callable[[int], Any], entry: Entry, state: str) -> float:
        started = time.perf_counter()
        run(entry.pk)
        elapsed = time.perf_counter() - started
        self.undo(entry, state)
        return elapsed / STEPS

    def cell(self, name: str, entries: list[Entry]) -> dict[str, Any]:
        turn, floor, state = self.variants()[name]
        ours: list[float] = []
        floors: list[float] = []
        for index in range(self.warmup + self.samples):
            entry = entries[index % len(entries)]
            if index % 2 == 0:
                a, b = self.timed(turn, entry, state), self.timed(floor, entry, state)
            else:
                b, a = self.timed(floor, entry, state), self.timed(turn, entry, state)
            if index >= self.warmup:
                ours.append(a)
                floors.append(b)
        mine, base = summary(ours), summary(floors)
        return {
            "agentloop": mine,
            "floor": base,
            "ratio": mine["median_ms"] / base["median_ms"],
            # A check on a shared machine: each pair ran back to back.
            "paired_ratio_median": statistics.median(
                x / y for x, y in zip(ours, floors, strict=True)
            ),
        }

    def run(self) -> dict[str, Any]:
        results: dict[str, Any] = {}
        for length in LENGTHS:
            pools = {False: self.pool(length), True: self.pool(length, asks=True)}
            for name, (_, _, state) in self.variants().items():
                entries = pools[name in ASKS]
                self.undo(entries[0], state)
                counts = self.count(name, entries[0], length)
                for entry in entries:
                    self.undo(entry, state)
                row = self.cell(name, entries)
                row["statements"] = counts
                results.setdefault(name, {})[str(length)] = row
                print(
                    f"  {name:<9} L={length:<4} {row['agentloop']['median_ms']:7.3f} ms/step  "
                    f"floor {row['floor']['median_ms']:6.3f} ms  ratio {row['ratio']:.2f}x",
                    flush=True,
                )
        return results

    def environment(self) -> dict[str, Any]:
        server = self.floor.connection.execute("SHOW server_version").fetchone()
        return {
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "django": django.get_version(),
            "psycopg": psycopg.__version__,
            "postgres": server[0] if server else "?",
            "run_step_signature": self.run_step_signature,
            "prepare_threshold": os.environ.get("BENCH_PREPARE_THRESHOLD") or None,
            "prepared_statements": os.environ.get("BENCH_PREPARED_STATEMENTS") != "0",
            "load_average_at_start": load_average(),
            "samples": self.samples,
            "warmup": self.warmup,
        }


# -- report -----------------------------------------------------------------------------------


def verdict(ratio: float, target: float, must: float) -> str:
    return "met" if ratio <= target else "must met" if ratio <= must else "MISSED"


def statements_cell(name: str, counts: dict[str, Any]) -> str:
    if name == "complete":
        return f"{counts['per_step']:.1f}/step ({counts['per_job'][0]}/turn)"
    jobs = f"model {counts['model_step_max']}, tool {counts['tool_round_max']}"
    if "asking" in counts:
        return f"asking {counts['asking']}; {jobs}"
    return jobs


def report(results: dict[str, Any]) -> None:
    env = results["environment"]
    print()
    print(
        f"agentloop job path, per step of a 5-step turn: {env['date']}, {env['cpus']} CPUs, "
        f"Python {env['python']}, Django {env['django']}, psycopg {env['psycopg']}, "
        f"PostgreSQL {env['postgres']}, {env['samples']} turns per cell"
    )
    print(
        f"load average at start {env['load_average_at_start']}, at end {env['load_average_at_end']}"
        f"; prepare_threshold {env['prepare_threshold']}"
        f"; PREPARED_STATEMENTS {env.get('prepared_statements', True)}"
    )
    header = (
        f"{'variant':<34}{'L':>4}{'median':>10}{'p90':>9}{'floor':>9}{'p90':>9}"
        f"{'ratio':>8}{'paired':>8}{'target (must)':>15}  {'':<8} statements per job"
    )
    print(header)
    for name, label in LABELS.items():
        target, must = TARGETS[name]
        for length, row in results["cells"][name].items():
            mine, floor = row["agentloop"], row["floor"]
            print(
                f"{label:<34}{length:>4}{mine['median_ms']:>8.3f}ms{mine['p90_ms']:>7.3f}ms"
                f"{floor['median_ms']:>7.3f}ms{floor['p90_ms']:>7.3f}ms{row['ratio']:>7.2f}x"
                f"{row['paired_ratio_median']:>7.2f}x{f'<={target}x ({must}x)':>15}  "
                f"{verdict(row['ratio'], target, must):<8} "
                f"{statements_cell(name, row['statements'])}"
            )
    floor_row = results["cells"]["get_step"][str(LENGTHS[0])]["statements"]["floor_per_turn"]
    loop_row = results["cells"]["complete"][str(LENGTHS[0])]["statements"]["floor_per_turn"]
    print(
        f"floor statements: {floor_row // STEPS} per step; loop mode {loop_row} per turn "
        f"({loop_row / STEPS:.1f} per step)"
    )
    print(
        f"statement targets: <= {MODEL_STEP_STATEMENTS} per model step, <= {TOOL_ROUND_STATEMENTS} "
        "per tool round of one call (7 + 1 per call), the same at both lengths"
    )
    for name in ("run_step", "get_step"):
        rows = results["cells"][name]
        models = {row["statements"]["model_step_max"] for row in rows.values()}
        tools = {row["statements"]["tool_round_max"] for row in rows.values()}
        same = len(models) == 1 and len(tools) == 1
        fits = max(models) <= MODEL_STEP_STATEMENTS and max(tools) <= TOOL_ROUND_STATEMENTS
        print(
            f"  {LABELS[name]}: model step {sorted(models)}, tool round {sorted(tools)}: "
            f"{'met' if fits else 'MISSED'}; {'same' if same else 'NOT the same'} at both lengths"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url", default=DEFAULT_DATABASE_URL, help="a database of its own: emptied"
    )
    parser.add_argument("--samples", type=int, default=100, help="timed turns per cell")
    parser.add_argument("--warmup", type=int, default=6, help="untimed turns first, per cell")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument(
        "--prepare-threshold",
        type=int,
        help="the database's OPTIONS prepare_threshold: psycopg prepares agentloop's per-step "
        "statements after this many runs (default: Django's, never)",
    )
    parser.add_argument(
        "--unprepared",
        action="store_true",
        help="AGENTLOOP['PREPARED_STATEMENTS'] = False: agentloop's per-step statements are "
        "parsed and planned on every run, as behind a pooler that can't keep them",
    )
    args = parser.parse_args(argv)
    if args.samples < 1 or args.warmup < 0:
        parser.error("--samples must be at least 1 and --warmup at least 0")

    started = time.perf_counter()
    if args.prepare_threshold is not None:
        os.environ["BENCH_PREPARE_THRESHOLD"] = str(args.prepare_threshold)  # bench/settings.py
    if args.unprepared:
        os.environ["BENCH_PREPARED_STATEMENTS"] = "0"  # bench/settings.py
    ensure_database(args.database_url)
    setup_django(args.database_url)
    bench = JobPath(args.database_url, args.samples, args.warmup)
    bench.reset_tables()
    results: dict[str, Any] = {"environment": bench.environment()}
    print("timing (A/B alternating, medians per step):", flush=True)
    results["cells"] = bench.run()
    bench.reset_tables()
    return finish(results, started, report, args.json)


if __name__ == "__main__":
    # Run the importable copy (bench.job_path), so the tool has an import path a chat can
    # store; this file's __main__ copy has none.
    from bench.job_path import main as importable_main

    sys.exit(importable_main())

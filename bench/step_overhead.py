"""What a persisted step costs on top of the SQL it cannot avoid.

    python bench/step_overhead.py [--database-url URL] [--samples N] [--json out.json]

Measures, in one process and one run, on PostgreSQL:

* the wall time of ``chat.step()`` on an already-loaded ``Chat`` whose history is exactly
  L messages (L = 10 and 200) ending with a user message, with a zero-latency provider
  (``agentloop.testing.FunctionProvider`` answering a short text), so the step is one model
  call plus its persistence;
* a raw-SQL floor on the same connection and the same chat: in one transaction, SELECT every
  column of the transcript rows ordered by id (fetchall), INSERT one message row, UPDATE the
  chat row's ``updated_at``; commit;
* the same for a tool step (``run_tools`` of two calls of a trivial tool), reported apart;
* bytes stored per message, and RSS over 1000 chats stepped once each in this process.

Step and floor samples alternate (A/B, order swapped every sample) on the same chats, after a
warm-up, so drift hits both alike; the figures are medians and the ratio is
median(step) / median(floor). After each sample the rows it added are deleted (outside the
timing), so every sample sees the same history. See bench/README.md for a recorded run.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import os
import platform
import pstats
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a checkout that is not pip-installed
    sys.path.insert(0, str(ROOT))

from agentloop import tool  # noqa: E402  (importing agentloop never needs Django settings)

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/agentloop_bench"
LENGTHS = (10, 200)
POOL_SIZE = 8  # chats per (variant, length), used in turn
MODEL = "bench:zero-latency"
ANSWER = "Done: the order shipped on Monday and should arrive by Thursday."
TOOL_PATH = "bench.step_overhead.lookup"
RSS_CHATS = 1000
RSS_MARKS = (0.1, 0.25, 0.5, 0.75, 1.0)  # fractions of the chats: 100, 250, 500, 750, 1000
PROFILE_STEPS = 200
TARGET, AIM = 2.0, 1.5


@tool
def lookup(key: str) -> str:
    """Looks up a value by key (returns at once: the benchmark's trivial tool).

    Args:
        key: What to look up.
    """
    return f"value of {key}"


def text_answer(request: Any) -> str:
    return ANSWER


# -- setup -----------------------------------------------------------------------------------


def ensure_database(url: str) -> None:
    """Create the benchmark database if it is missing; exit clearly if Postgres is down."""
    import psycopg
    from psycopg import sql

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    maintenance = urlunsplit(parts._replace(path="/postgres"))
    try:
        with psycopg.connect(maintenance, autocommit=True, connect_timeout=3) as conn:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
            if found is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    except psycopg.OperationalError as exc:
        where = f"{parts.hostname or 'localhost'}:{parts.port or 5432}"
        sys.exit(
            f"PostgreSQL is not reachable at {where}: {str(exc).strip()}\n"
            "The benchmark needs it: start it with `bash scripts/services.sh start`, "
            "or pass --database-url."
        )


def setup_django(url: str) -> None:
    os.environ["BENCH_DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0, interactive=False)
    if not schema_matches_models():
        # A migration edited in place (early development) leaves an applied-but-stale schema.
        # These tables only ever hold benchmark rows (each run empties them): rebuild them.
        print("agentloop tables don't match the models: recreating them", file=sys.stderr)
        drop_agentloop_tables()
        call_command("migrate", verbosity=0, interactive=False)


def schema_matches_models() -> bool:
    from django.apps import apps
    from django.db import DatabaseError, connection

    for model in apps.get_app_config("agentloop").get_models():
        columns = ", ".join(f'"{field.column}"' for field in model._meta.concrete_fields)
        try:
            with connection.cursor() as cursor:
                cursor.execute(f'SELECT {columns} FROM "{model._meta.db_table}" LIMIT 0')
        except DatabaseError:
            return False
    return True


def drop_agentloop_tables() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        for table in connection.introspection.table_names(cursor):
            if table.startswith("agentloop_"):
                cursor.execute(f'DROP TABLE IF EXISTS "{table}" CASCADE')
        cursor.execute("DELETE FROM django_migrations WHERE app = 'agentloop'")


# -- helpers ---------------------------------------------------------------------------------


def rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def load_average() -> str:
    """The 1/5/15-minute load averages: other work on the machine skews the figures."""
    with open("/proc/loadavg") as loadavg:
        return " ".join(loadavg.read().split()[:3])


def finish(results: dict[str, Any], started: float, report: Any, json_path: Any) -> int:
    """End a run: its time and the load at its end recorded, the table printed, the figures
    written to ``json_path`` when given. The script's exit status."""
    results["seconds"] = time.perf_counter() - started
    results["environment"]["load_average_at_end"] = load_average()
    report(results)
    print(f"(run took {results['seconds']:.0f} s)")
    if json_path:
        json_path.write_text(json.dumps(results, indent=2, default=str) + "\n")
        print(f"results written to {json_path}")
    return 0


def summary(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    p90 = ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))]
    return {
        "median_ms": statistics.median(ordered) * 1000,
        "p90_ms": p90 * 1000,
        "min_ms": ordered[0] * 1000,
        "samples": len(ordered),
    }


@dataclass
class PoolChat:
    chat: Any  # a loaded Chat whose Conversation is already built
    pk: int
    last_id: int  # id of the last history message: rows above it are the sample's


class Bench:
    def __init__(self, samples: int, warmup: int) -> None:
        from django.db import connection

        from agentloop import providers
        from agentloop.models import Chat, Message, ToolCall, Usage
        from agentloop.testing import FunctionProvider

        self.samples = samples
        self.warmup = warmup
        self.connection = connection
        self.Chat, self.Message, self.ToolCall, self.Usage = Chat, Message, ToolCall, Usage
        self.provider = FunctionProvider(text_answer)
        providers.register("bench", self.provider)
        self.tables = {
            "chat": Chat._meta.db_table,
            "message": Message._meta.db_table,
            "toolcall": ToolCall._meta.db_table,
            "usage": Usage._meta.db_table,
        }
        columns = ", ".join(f'"{f.column}"' for f in Message._meta.concrete_fields)
        message, chat = self.tables["message"], self.tables["chat"]
        self.floor_select = f'SELECT {columns} FROM "{message}" WHERE "chat_id" = %s ORDER BY "id"'
        self.floor_insert = (
            f'INSERT INTO "{message}" ("chat_id", "role", "content", "status", "is_error", '
            '"parsed", "model", "finish_reason", "thinking", "provider_data", "attachments", '
            '"created_at") '
            "VALUES (%s, 'assistant', %s, 'complete', false, NULL, 'zero-latency', 'stop', '', "
            "'{}'::jsonb, '[]'::jsonb, %s) RETURNING \"id\""
        )
        self.floor_update = f'UPDATE "{chat}" SET "updated_at" = %s WHERE "id" = %s'

    # -- data ---------------------------------------------------------------------------------
    def reset_tables(self) -> None:
        names = ", ".join(f'"{name}"' for name in self.tables.values())
        with self.connection.cursor() as cursor:
            cursor.execute(f"TRUNCATE {names} RESTART IDENTITY CASCADE")

    def history(self, chat_pk: int, length: int, *, ends_with: str) -> list[Any]:
        """A system message, then alternating user/assistant turns ending with ``ends_with``."""
        instructions = "You are a helpful shop assistant. Answer briefly."
        rows = [self.Message(chat_id=chat_pk, role="system", content=instructions)]
        for index in range(1, length):
            from_end = length - 1 - index
            other = "assistant" if ends_with == "user" else "user"
            role = ends_with if from_end % 2 == 0 else other
            if role == "user":
                content = (
                    f"Question {index}: where is order {index:05d}, and when will it reach "
                    "the customer in Lyon?"
                )
                rows.append(self.Message(chat_id=chat_pk, role="user", content=content))
            else:
                content = (
                    f"Order {index:05d} left the warehouse in Rotterdam yesterday evening. "
                    "The carrier scanned it at the Paris hub this morning and expects to "
                    "deliver it to Lyon on Thursday between 9:00 and 12:00. I can send "
                    "you the tracking link or ask the carrier to hold it at a pickup "
                    "point if nobody is home."
                )
                rows.append(
                    self.Message(
                        chat_id=chat_pk,
                        role="assistant",
                        content=content,
                        model="zero-latency",
                        # The final answer of a tool-round history asks for tools (see below).
                        finish_reason="tool_calls" if from_end == 0 else "stop",
                    )
                )
        return rows

    def make_chats(self, count: int, length: int, *, tool_round: bool = False) -> list[int]:
        """``count`` chats with exactly ``length`` messages; bulk inserted, in chunks."""
        pks: list[int] = []
        tools = [TOOL_PATH] if tool_round else []
        for start in range(0, count, 100):
            chats = self.Chat.objects.bulk_create(
                [self.Chat(model=MODEL, tools=tools) for _ in range(min(100, count - start))]
            )
            ends_with = "assistant" if tool_round else "user"
            rows = [
                row for chat in chats for row in self.history(chat.pk, length, ends_with=ends_with)
            ]
            self.Message.objects.bulk_create(rows, batch_size=2000)
            if tool_round:
                last = {row.chat_id: row for row in rows}  # each chat's final (assistant) row
                calls = [
                    self.ToolCall(
                        chat_id=chat.pk,
                        message=last[chat.pk],
                        call_id=f"call_{chat.pk}_{key}",
                        name="lookup",
                        arguments={"key": key},
                    )
                    for chat in chats
                    for key in ("a", "b")
                ]
                self.ToolCall.objects.bulk_create(calls)
            pks.extend(chat.pk for chat in chats)
            del chats, rows
        return pks

    def pool(self, length: int, *, tool_round: bool) -> list[PoolChat]:
        entries = []
        for pk in self.make_chats(POOL_SIZE, length, tool_round=tool_round):
            chat = self.Chat.objects.get(pk=pk)
            chat.conversation  # noqa: B018  (built once, as a worker holding the chat would)
            ids = (
                self.Message.objects.filter(chat_id=pk).order_by("-id").values_list("id", flat=True)
            )
            entries.append(PoolChat(chat, pk, ids[0]))
        return entries

    def undo(self, entry: PoolChat) -> None:
        """Delete what a sample added, so the next sample sees the same history."""
        t = self.tables
        with self.connection.cursor() as cursor:
            cursor.execute(f'DELETE FROM "{t["usage"]}" WHERE "chat_id" = %s', [entry.pk])
            cursor.execute(
                f'DELETE FROM "{t["message"]}" WHERE "chat_id" = %s AND "id" > %s',
                [entry.pk, entry.last_id],
            )
            cursor.execute(
                f'UPDATE "{t["toolcall"]}" SET "state" = \'pending\', "error" = \'\', '
                '"started_at" = NULL, "finished_at" = NULL WHERE "chat_id" = %s',
                [entry.pk],
            )
        self.provider.requests.clear()  # FunctionProvider records requests; keep memory flat

    # -- the two things compared -------------------------------------------------------------
    def timed_step(self, entry: PoolChat) -> float:
        started = time.perf_counter()
        entry.chat.step()
        elapsed = time.perf_counter() - started
        self.undo(entry)
        return elapsed

    def floor(self, chat_pk: int) -> None:
        from django.db import transaction
        from django.utils import timezone

        with transaction.atomic(), self.connection.cursor() as cursor:
            cursor.execute(self.floor_select, [chat_pk])
            cursor.fetchall()
            now = timezone.now()
            cursor.execute(self.floor_insert, [chat_pk, ANSWER, now])
            cursor.fetchone()
            cursor.execute(self.floor_update, [now, chat_pk])

    def timed_floor(self, entry: PoolChat) -> float:
        started = time.perf_counter()
        self.floor(entry.pk)
        elapsed = time.perf_counter() - started
        self.undo(entry)
        return elapsed

    # -- measurements -------------------------------------------------------------------------
    def check_step(self, entry: PoolChat, *, tool_round: bool, length: int) -> list[str]:
        """Run one step outside timing: it does what it should, and the SQL it sends."""
        from django.test.utils import CaptureQueriesContext

        with CaptureQueriesContext(self.connection) as queries:
            added = entry.chat.step()
        if tool_round:
            rows = list(self.Message.objects.filter(chat_id=entry.pk, id__gt=entry.last_id))
            assert [r.role for r in rows] == ["tool", "tool"], rows
            assert [r.content for r in rows] == ["value of a", "value of b"], rows
        else:
            assert added.role == "assistant" and added.content == ANSWER, added
        self.undo(entry)
        count = self.Message.objects.filter(chat_id=entry.pk).count()
        assert count == length, f"undo left {count} messages, expected {length}"
        return [q["sql"] for q in queries.captured_queries]

    def ab(self, entries: list[PoolChat]) -> tuple[list[float], list[float]]:
        steps: list[float] = []
        floors: list[float] = []
        for index in range(self.warmup + self.samples):
            entry = entries[index % len(entries)]
            if index % 2 == 0:
                step, floor = self.timed_step(entry), self.timed_floor(entry)
            else:
                floor, step = self.timed_floor(entry), self.timed_step(entry)
            if index >= self.warmup:
                steps.append(step)
                floors.append(floor)
        return steps, floors

    def variant(self, name: str, *, tool_round: bool) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for length in LENGTHS:
            entries = self.pool(length, tool_round=tool_round)
            queries = self.check_step(entries[0], tool_round=tool_round, length=length)
            steps, floors = self.ab(entries)
            step, floor = summary(steps), summary(floors)
            result[str(length)] = {
                "step": step,
                "floor": floor,
                "ratio": step["median_ms"] / floor["median_ms"],
                # Robustness check on a shared machine: each A/B pair ran back to back.
                "paired_ratio_median": statistics.median(
                    a / b for a, b in zip(steps, floors, strict=True)
                ),
                "queries_per_step": len(queries),
                "step_sql": queries,
            }
            print(
                f"  {name:<9} L={length:<4} step {step['median_ms']:7.3f} ms  "
                f"floor {floor['median_ms']:7.3f} ms  ratio {result[str(length)]['ratio']:.2f}x",
                flush=True,
            )
        return result

    def profile(self, length: int = 200, steps: int = PROFILE_STEPS) -> str:
        length = int(os.environ.get("AGENTLOOP_BENCH_PROFILE_LENGTH", length))
        entries = self.pool(length, tool_round=False)
        profiler = cProfile.Profile()
        for index in range(steps):
            entry = entries[index % len(entries)]
            profiler.enable()
            entry.chat.step()
            profiler.disable()
            self.undo(entry)
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out)
        stats.strip_dirs().sort_stats("cumulative").print_stats(15)
        stats.sort_stats("tottime").print_stats(15)
        return out.getvalue()

    def rss(self, chats: int = RSS_CHATS) -> dict[str, Any]:
        marks = sorted({max(1, round(chats * fraction)) for fraction in RSS_MARKS})
        first, last = marks[1], marks[-1]  # growth is measured from the 25% mark to the end
        pks = self.make_chats(chats, 10)
        gc.collect()
        baseline = rss_kib()
        series: list[tuple[int, int]] = []
        objects: list[tuple[int, int]] = []  # finer than RSS: a few KiB per chat would show here
        started = time.perf_counter()
        for done, pk in enumerate(pks, start=1):
            self.Chat.objects.get(pk=pk).step()  # what a worker does: load the chat, one step
            self.provider.requests.clear()
            if done in marks:
                gc.collect()
                series.append((done, rss_kib()))
                objects.append((done, len(gc.get_objects())))
        elapsed = time.perf_counter() - started
        answers = self.Message.objects.filter(chat_id__in=pks, role="assistant", content=ANSWER)
        assert answers.count() == chats, "every chat should have got its answer"
        at, objs = dict(series), dict(objects)
        return {
            "chats": chats,
            "history": 10,
            "baseline_kib": baseline,
            "series_kib": series,
            "growth_from": first,
            "growth_kib": at[last] - at[first],
            "growth_pct": 100.0 * (at[last] - at[first]) / at[first],
            "gc_objects": objects,
            "gc_objects_growth_per_chat": (objs[last] - objs[first]) / (last - first),
            "seconds": elapsed,
        }

    def storage(self) -> dict[str, Any]:
        t = self.tables
        with self.connection.cursor() as cursor:
            for name in ("message", "toolcall", "usage", "chat"):
                cursor.execute(f'VACUUM (FULL, ANALYZE) "{t[name]}"')
            cursor.execute(
                f'SELECT count(*), avg(pg_column_size(m.*)), avg(octet_length(m."content")), '
                f"pg_relation_size(%s), pg_indexes_size(%s), pg_total_relation_size(%s) "
                f'FROM "{t["message"]}" m',
                [t["message"]] * 3,
            )
            rows, row_avg, content_avg, heap, indexes, total = cursor.fetchone()
            # Rows the engine wrote (answers, each with a usage row), vs the bulk-made history.
            cursor.execute(
                f'SELECT count(*), avg(pg_column_size(m.*)), avg(octet_length(m."content")) '
                f'FROM "{t["message"]}" m WHERE m."id" IN (SELECT "message_id" FROM "{t["usage"]}")'
            )
            answers, answer_avg, answer_content = cursor.fetchone()
            cursor.execute(
                f"SELECT count(*), avg(pg_column_size(u.*)), pg_total_relation_size(%s) "
                f'FROM "{t["usage"]}" u',
                [t["usage"]],
            )
            usage_rows, usage_avg, usage_total = cursor.fetchone()
        return {
            "message_rows": rows,
            "message_row_avg_bytes": float(row_avg),
            "message_content_avg_bytes": float(content_avg),
            "message_heap_per_row_bytes": heap / rows,
            "message_indexes_per_row_bytes": indexes / rows,
            "message_total_per_row_bytes": total / rows,
            "engine_answer_rows": answers,
            "engine_answer_row_avg_bytes": float(answer_avg or 0),
            "engine_answer_content_avg_bytes": float(answer_content or 0),
            "usage_rows": usage_rows,
            "usage_row_avg_bytes": float(usage_avg or 0),
            "usage_total_per_row_bytes": usage_total / usage_rows if usage_rows else 0.0,
        }

    def environment(self) -> dict[str, Any]:
        import django
        import psycopg

        with self.connection.cursor() as cursor:
            cursor.execute("SHOW server_version")
            server = cursor.fetchone()[0]
            cursor.execute("SHOW synchronous_commit")
            sync = cursor.fetchone()[0]
        return {
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "django": django.get_version(),
            "psycopg": psycopg.__version__,
            "postgres": server,
            "synchronous_commit": sync,
            "load_average_at_start": load_average(),
            "samples": self.samples,
            "warmup": self.warmup,
        }


def report(results: dict[str, Any]) -> None:
    env = results["environment"]
    print()
    print(
        f"agentloop step overhead — {env['date']}, {env['cpus']} CPUs, Python {env['python']}, "
        f"Django {env['django']}, PostgreSQL {env['postgres']}, {env['samples']} samples"
    )
    print(
        f"load average at start {env['load_average_at_start']}, at end {env['load_average_at_end']}"
    )
    print(f"{'variant':<10}{'L':>5}{'step med':>11}{'p90':>9}{'floor med':>11}{'p90':>9}"
          f"{'ratio':>8}{'paired':>8}{'SQL':>5}")  # fmt: skip
    for name in ("generate", "tools"):
        for length, row in results[name].items():
            print(
                f"{name:<10}{length:>5}{row['step']['median_ms']:>9.3f}ms"
                f"{row['step']['p90_ms']:>7.3f}ms{row['floor']['median_ms']:>9.3f}ms"
                f"{row['floor']['p90_ms']:>7.3f}ms{row['ratio']:>7.2f}x"
                f"{row['paired_ratio_median']:>7.2f}x{row['queries_per_step']:>5}"
            )
    verdict = all(row["ratio"] <= TARGET for row in results["generate"].values())
    print(
        f"generate step within {TARGET}x of the floor at both lengths: {'yes' if verdict else 'NO'}"
    )
    s = results["storage"]
    print(
        f"bytes per message: row {s['message_row_avg_bytes']:.0f} B "
        f"(content {s['message_content_avg_bytes']:.0f} B); with page overhead, TOAST and indexes "
        f"{s['message_total_per_row_bytes']:.0f} B (heap {s['message_heap_per_row_bytes']:.0f}, "
        f"indexes {s['message_indexes_per_row_bytes']:.0f}); over {s['message_rows']} rows"
    )
    print(
        f"per engine-written answer: message row {s['engine_answer_row_avg_bytes']:.0f} B "
        f"(content {s['engine_answer_content_avg_bytes']:.0f} B) + usage row "
        f"{s['usage_row_avg_bytes']:.0f} B ({s['usage_total_per_row_bytes']:.0f} B with indexes)"
    )
    r = results["rss"]
    series = ", ".join(f"{n}: {kib / 1024:.1f}" for n, kib in r["series_kib"])
    print(
        f"RSS (MiB) after N of {r['chats']} chats, one step each "
        f"(baseline {r['baseline_kib'] / 1024:.1f}): {series}"
    )
    print(
        f"  growth {r['growth_from']}→{r['chats']} chats: {r['growth_kib']:+d} KiB "
        f"({r['growth_pct']:+.2f}%); gc-tracked objects "
        f"{r['gc_objects_growth_per_chat']:+.2f} per chat"
    )
    if results.get("profile"):
        print()
        print(f"cProfile of {PROFILE_STEPS} generate steps at L=200:")
        print(results["profile"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DATABASE_URL)
    )
    parser.add_argument("--samples", type=int, default=400, help="timed samples per case")
    parser.add_argument("--warmup", type=int, default=40, help="untimed samples first")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--profile", action="store_true", help="profile even when under 1.5x")
    parser.add_argument("--rss-chats", type=int, default=RSS_CHATS, help="chats in the RSS run")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    ensure_database(args.database_url)
    setup_django(args.database_url)
    bench = Bench(args.samples, args.warmup)
    bench.reset_tables()
    results: dict[str, Any] = {"environment": bench.environment()}
    print("timing (A/B alternating, medians):", flush=True)
    results["generate"] = bench.variant("generate", tool_round=False)
    results["tools"] = bench.variant("tools", tool_round=True)
    worst = max(row["ratio"] for row in results["generate"].values())
    if args.profile or worst > AIM:
        results["profile"] = bench.profile()
    print(f"RSS over {args.rss_chats} chats...", flush=True)
    results["rss"] = bench.rss(args.rss_chats)
    results["storage"] = bench.storage()
    return finish(results, started, report, args.json)


if __name__ == "__main__":
    # Run the importable copy (bench.step_overhead), so the tool has an import path a chat can
    # store; this file's __main__ copy has none.
    from bench.step_overhead import main as importable_main

    sys.exit(importable_main())

"""How long the set-based verbs take on 100,000 chats: ``Chat.objects.filter(...).halt()``,
``.cancel()``, ``.with_model()``, ``.complete_later()``, ``.resume()``, and their dry runs.

    python bench/bulk_control.py [--chats 100000] [--waiting 1000] [--batch-size 1000]
                                 [--json out.json]

PostgreSQL (a database of its own, emptied at the start) and Redis (the cancel notices, one
message per batch; the Celery broker the jobs of ``complete_later`` and ``resume`` go to, on
a queue of their own that no worker consumes and that is deleted afterwards). The chats: 70%
idle, 15% queued, 10% running (leased by a run of another process), 5% stopped by a halt;
half on ``anthropic:claude-sonnet-4``, half on ``openai:gpt-4.1``; plus ``--waiting`` more
chats held by a call waiting for approval, which a cancel answers one chat at a time (result
rows, events, the parent released), as ``chat.cancel()`` does.

Each figure is one run of the verb (wall time, ``time.perf_counter``) with the statements it
sent (counted by an execute wrapper); the rows it changed are put back between runs, outside
the timing. ``complete_later`` and ``resume`` run twice: sending their jobs to Celery, and
with a runner that drops them (``bench/dropping_runner.py``), which leaves the statements' own time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.workers import DEFAULT_REDIS_URL, machine, setup  # noqa: E402

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/agentloop_bench_bulk"
MODELS = ("anthropic:claude-sonnet-4", "openai:gpt-4.1")


def populate(total: int, waiting: int) -> None:
    """``total`` chats in the states above, and ``waiting`` chats held for an approval."""
    from django.db import connection
    from django.utils import timezone

    from agentloop.models import Chat, Message, ToolCall

    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE agentloop_usage, agentloop_toolcall, agentloop_message, agentloop_chat "
            "RESTART IDENTITY CASCADE"
        )
    lease_until = timezone.now() + timedelta(hours=1)
    rows = []
    for number in range(total):
        share = number % 20
        fields: dict[str, Any] = {"model": MODELS[number % 2]}
        if share < 3:
            fields["state"] = "queued"
        elif share < 5:
            fields.update(
                state="running", lease_token=f"run-{number}", lease_expires_at=lease_until
            )
        elif share < 6:
            fields.update(state="stopped", stop_reason="halted: earlier")
        rows.append(Chat(**fields))
        if len(rows) == 10_000:
            Chat.objects.bulk_create(rows)
            rows = []
    Chat.objects.bulk_create(rows)
    held = Chat.objects.bulk_create(
        [
            Chat(model=MODELS[0], state="waiting", tools=["tests.tools.transfer"])
            for _ in range(waiting)
        ]
    )
    messages = Message.objects.bulk_create(
        [Message(chat=chat, role="assistant", content="") for chat in held]
    )
    ToolCall.objects.bulk_create(
        [
            ToolCall(
                chat=chat,
                message=message,
                call_id=f"c{chat.pk}",
                name="transfer",
                arguments={"amount": 5, "to": "bob"},
                state="waiting",
                wait_reason="approval",
                waiting_since=timezone.now(),
            )
            for chat, message in zip(held, messages, strict=True)
        ]  # fmt: skip
    )
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE agentloop_chat")


class Counter:
    """Counts the statements sent through Django's connection."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ):
        self.count += 1
        return execute(sql, params, many, context)


def timed(label: str, run: Callable[[], Any], results: list[dict[str, Any]]) -> Any:
    from django.db import connection

    counter = Counter()
    with connection.execute_wrapper(counter):
        started = time.perf_counter()
        outcome = run()
        seconds = time.perf_counter() - started
    row = {
        "verb": label,
        "seconds": round(seconds, 3),
        "statements": counter.count,
        "matched": getattr(outcome, "matched", None),
        "changed": getattr(outcome, "changed", None),
    }
    results.append(row)
    print(
        f"{label:<46} {seconds:8.3f} s  {counter.count:6d} statements  "
        f"matched {row['matched']}, changed {row['changed']}",
        flush=True,
    )
    return outcome


def reset() -> None:
    """Put back what the last verb changed (not timed)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE agentloop_chat SET halt_reason = '', cancel_requested_at = NULL "
            "WHERE halt_reason <> '' OR cancel_requested_at IS NOT NULL"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chats", type=int, default=100_000)
    parser.add_argument("--waiting", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--json", type=Path)
    options = parser.parse_args()
    setup(options.database_url, options.redis_url, {"REDIS_URL": options.redis_url})

    from agentloop.models import Chat
    from bench.celery_app import app
    from bench.workers import use_queue

    queue = f"agentloop-bench-bulk-{uuid.uuid4().hex[:8]}"
    use_queue(queue)  # no worker: the jobs are only sent, then the queue is deleted
    total = options.chats + options.waiting
    print(f"{options.chats} chats + {options.waiting} waiting for approval; populating...")
    populate(options.chats, options.waiting)
    size = {"batch_size": options.batch_size}
    results: list[dict[str, Any]] = []
    from django.conf import settings

    stopped = list(Chat.objects.filter(state="stopped").values_list("pk", flat=True))
    every = Chat.objects.all()
    anthropic = Chat.objects.on_model("anthropic:*")
    not_held = Chat.objects.exclude(state="waiting")
    try:
        timed("halt, dry run (all chats)", lambda: every.halt("outage", dry_run=True), results)
        timed("halt (anthropic:*)", lambda: anthropic.halt("provider outage", **size), results)
        reset()
        timed(f"halt (all {total} chats)", lambda: every.halt("provider outage", **size), results)
        reset()
        timed("cancel (all but the waiting ones)", lambda: not_held.cancel(**size), results)
        reset()
        timed(
            f"cancel ({options.waiting} waiting for a person)",
            lambda: Chat.objects.filter(state="waiting").cancel(**size),
            results,
        )
        reset()
        timed("with_model (anthropic:* -> openai)", lambda: anthropic.with_model(
            "openai:gpt-4.1-mini", **size), results)  # fmt: skip
        timed("resume (the stopped ones)", lambda: every.resume(**size), results)
        timed(f"complete_later (all {total} chats)", lambda: every.complete_later(**size), results)
        from django.test import override_settings

        from agentloop.conf import agentloop_settings

        dropping = {**settings.AGENTLOOP, "RUNNER": "bench.dropping_runner.DroppingRunner"}
        with override_settings(AGENTLOOP=dropping):
            agentloop_settings.reload()
            Chat.objects.filter(pk__in=stopped).update(state="stopped")
            timed("resume, jobs dropped", lambda: every.resume(**size), results)
            timed("complete_later, jobs dropped", lambda: every.complete_later(**size), results)
    finally:
        with app.connection_for_write() as connection:
            connection.default_channel.queue_delete(queue)
    summary = {"machine": machine(), "chats": total, "batch_size": options.batch_size,
               "results": results}  # fmt: skip
    if options.json:
        options.json.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()

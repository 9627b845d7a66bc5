"""Eval cases per second through Celery, against as many plain ``complete_later()`` turns.

    python bench/eval_throughput.py [--cases 1000] [--workers 2] [--json out.json]

Both variants run on the same ``celery worker`` (``--workers`` pool processes), PostgreSQL
and Redis, with a zero-latency model (tests/worker_provider.py's ``rules``: it echoes):

* turns: ``--cases`` chats, each with one user message, sent with ``complete_later()`` in
  one transaction; one job per chat (one model call, the answer written, the lease released);
  timed from the commit to the last chat settled;
* eval: a set of ``--cases`` stored chats (each one turn, answered before the timing) and a
  run over it, started in one transaction (``start_run``: the cases made and one job per
  case sent); each job claims its case, reads the chat, replays the turn in memory, scores
  it and writes it; timed from the commit to the last case finished.

The ratio is eval seconds over turn seconds (the issue's target: at most 1.5). Each variant
is checked: every chat answered once, every case passed. See bench/README.md for figures.
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

TARGET_RATIO = 1.5


def make_chats(count: int, label: str, *, answered: bool) -> list[Any]:
    from agentloop.models import Chat

    chats = []
    for number in range(count):
        chat = Chat.objects.create(model="rules:bench")
        chat.ask_later(f"hello {label} {number}")
        if answered:
            chat.complete()
        chats.append(chat)
    return chats


def turns(count: int, timeout: float) -> float:
    """Seconds for ``count`` one-step turns sent with ``complete_later()`` to settle."""
    from django.db import transaction

    from agentloop.models import Chat, Message

    chats = make_chats(count, "turn", answered=False)
    ids = [chat.pk for chat in chats]
    started = time.perf_counter()
    with transaction.atomic():
        for chat in chats:
            chat.complete_later()
    unsettled = Chat.objects.filter(pk__in=ids, state__in=["queued", "running"])
    while unsettled.exists():
        if time.perf_counter() - started > timeout:
            sys.exit(f"The turns timed out; {unsettled.count()} chats unsettled")
        time.sleep(0.01)
    elapsed = time.perf_counter() - started
    answers = Message.objects.filter(chat__in=ids, role="assistant").count()
    if answers != count:
        sys.exit(f"Check failed: {answers} answers for {count} chats")
    return elapsed


def eval_run(count: int, timeout: float) -> float:
    """Seconds for a run of ``count`` cases to finish, from the commit that sends it."""
    from django.db import transaction

    from agentloop.evals.running import start_run
    from agentloop.evals.sets import set_from_chats
    from agentloop.models import EvalCase, EvalCaseState, EvalSet

    chats = make_chats(count, "eval", answered=True)
    eval_set = set_from_chats(f"bench {time.time()}", chats)
    started = time.perf_counter()
    with transaction.atomic():
        run = start_run(eval_set, "rules:bench")
    unfinished = EvalCase.objects.filter(run=run).unfinished()
    while unfinished.exists():
        if time.perf_counter() - started > timeout:
            sys.exit(f"The eval run timed out; {unfinished.count()} cases unfinished")
        time.sleep(0.01)
    elapsed = time.perf_counter() - started
    passed = run.cases.filter(state=EvalCaseState.PASSED).count()
    if passed != count:
        sys.exit(f"Check failed: {passed} of {count} cases passed")
    EvalSet.objects.filter(pk=eval_set.pk).delete()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2, help="pool processes of the worker")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    options = parser.parse_args()
    setup(options.database_url, options.redis_url)
    empty_tables()
    with workers(options.workers, {"BACKGROUND": "celery"}):
        turns(options.warmup, options.timeout)
        eval_run(options.warmup, options.timeout)
        turn_seconds = turns(options.cases, options.timeout)
        eval_seconds = eval_run(options.cases, options.timeout)
    ratio = eval_seconds / turn_seconds
    row = {
        "cases": options.cases,
        "workers": options.workers,
        "turns_s": round(turn_seconds, 3),
        "eval_s": round(eval_seconds, 3),
        "turns_per_s": round(options.cases / turn_seconds, 1),
        "cases_per_s": round(options.cases / eval_seconds, 1),
        "ratio": round(ratio, 3),
        "target_ratio": TARGET_RATIO,
        "machine": machine(),
    }
    print(
        f"{options.cases} turns (complete_later): {turn_seconds:6.2f} s "
        f"({row['turns_per_s']}/s)\n{options.cases} eval cases:               "
        f"{eval_seconds:6.2f} s ({row['cases_per_s']}/s)\nratio {ratio:.2f} "
        f"(target <= {TARGET_RATIO})",
        flush=True,
    )
    if options.json:
        options.json.write_text(json.dumps(row, indent=2))


if __name__ == "__main__":
    main()

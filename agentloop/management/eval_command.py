"""``manage.py agentloop eval set | run | compare | show``: evals from the command line (and CI).

    manage.py agentloop eval set NAME (--jsonl FILE | --chat ID ... | --latest N) [--turns all]
    manage.py agentloop eval run SET --model M [--judge MODEL] [--fail-under 0.9] [--batch] ...
    manage.py agentloop eval compare RUN_A RUN_B
    manage.py agentloop eval show RUN

``run`` exits with status 1 when the run's pass rate is under ``--fail-under``: a CI step
fails. The subcommand of the ``agentloop`` command that calls ``agentloop.evals``.
"""

from __future__ import annotations

import json
import time
from decimal import Decimal, InvalidOperation
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ..conf import get_chat_model
from ..evals.batch_rounds import poll as poll_eval_runs
from ..evals.batch_rounds import send_round
from ..evals.reports import compare, summarize
from ..evals.running import run_here, send_cases, start_run
from ..evals.sets import set_from_chats, set_from_jsonl
from ..exceptions import ConfigurationError
from ..models import EvalCaseState, EvalRun, EvalSet

__all__ = ["add_eval_parser", "handle_eval"]

#: seconds between two looks at a background run's progress.
POLL_SECONDS = 0.5


def add_eval_parser(subcommands: Any) -> None:
    """Add ``eval`` (with ``set``, ``run``, ``compare``, ``show``) to the command's parser."""
    parser = subcommands.add_parser(
        "eval",
        help="Evals: replay stored chats against a candidate, score, compare (docs: Evals).",
    )
    actions = parser.add_subparsers(dest="action", metavar="action", required=True)
    made = actions.add_parser("set", help="Save a set of chats' turns (or a JSONL file).")
    made.add_argument("name", help="The set's name (unique).")
    source = made.add_mutually_exclusive_group(required=True)
    source.add_argument("--jsonl", metavar="FILE", help="Conversations, one JSON per line.")
    source.add_argument(
        "--chat", dest="chats", action="append", type=int, metavar="ID", help="A chat; repeat."
    )
    source.add_argument("--latest", type=int, metavar="N", help="The N latest chats.")
    made.add_argument(
        "--turns",
        choices=["last", "all"],
        default="last",
        help="Each chat's last user turn (default), or every user turn.",
    )
    run = actions.add_parser("run", help="Run a candidate over a set; exit 1 under --fail-under.")
    run.add_argument("set", metavar="SET", help="The set's name or primary key.")
    run.add_argument("--model", required=True, help="'provider:model' of the candidate.")
    run.add_argument("--provider", help="A provider name, when the model names none.")
    run.add_argument("--name", default="", help="The run's name (shown by compare).")
    run.add_argument("--instructions", help="Instructions replacing the recorded ones.")
    run.add_argument(
        "--tool", dest="tools", action="append", default=[], metavar="PATH",
        help="A tool's import path (default: each chat's own tools); repeat.",
    )  # fmt: skip
    run.add_argument("--agent", default="", metavar="PATH", help="An agent's import path.")
    run.add_argument(
        "--live-tool", dest="live_tools", action="append", default=[], metavar="NAME",
        help="Run this tool for real (default: every tool answers from the recording).",
    )  # fmt: skip
    run.add_argument(
        "--scorer", dest="scorers", action="append", default=[], metavar="JSON",
        help='A scorer as JSON, e.g. \'{"kind": "contains", "value": "refund"}\'; repeat '
        "(default: exact, against the recorded answer).",
    )  # fmt: skip
    run.add_argument("--judge", metavar="MODEL", help="Add an LLM judge on this model.")
    run.add_argument("--rubric", help="The judge's rubric.")
    run.add_argument(
        "--fail-under", type=float, metavar="RATE", help="Exit 1 under this pass rate (0 to 1)."
    )
    run.add_argument("--max-cost", metavar="DOLLARS", help="No case starts past this cost.")
    run.add_argument("--baseline", type=int, metavar="RUN", help="The run to compare with.")
    run.add_argument(
        "--background",
        action="store_true",
        help="One Celery job per case (the workers run them); wait, showing progress.",
    )
    run.add_argument(
        "--batch",
        action="store_true",
        help="Through the provider's batch API, at the batch price: each round of model calls "
        "is one batch, polled until every case has its outcome (a batch may take hours).",
    )
    run.add_argument(
        "--no-wait",
        action="store_true",
        help="With --batch: send the first round and return; the poll_batches task moves the "
        "run on ('eval show RUN' shows where it is).",
    )
    run.add_argument(
        "--poll-seconds", type=float, default=60.0, metavar="S",
        help="With --batch: seconds between two polls of the run's batches (default 60).",
    )  # fmt: skip
    both = actions.add_parser("compare", help="Two runs side by side, and the cases that changed.")
    both.add_argument("run_a", type=int, metavar="RUN_A")
    both.add_argument("run_b", type=int, metavar="RUN_B")
    show = actions.add_parser("show", help="A run's progress and figures.")
    show.add_argument("run", type=int, metavar="RUN")


def handle_eval(command: BaseCommand, options: dict[str, Any]) -> None:
    """Run the ``eval`` action ``options`` name, writing to ``command``'s output."""
    try:
        {"set": _set, "run": _run, "compare": _compare, "show": _show}[options["action"]](
            command, options
        )
    except ConfigurationError as exc:
        raise CommandError(str(exc)) from None


def _set(command: BaseCommand, options: dict[str, Any]) -> None:
    name = options["name"]
    if EvalSet.objects.filter(name=name).exists():
        raise CommandError(f"An eval set named {name!r} exists already.")
    if options["jsonl"]:
        try:
            eval_set = set_from_jsonl(name, options["jsonl"])
        except OSError as exc:
            raise CommandError(f"Can't read {options['jsonl']}: {exc.strerror}.") from None
    else:
        chats = get_chat_model()._default_manager.all()
        if options["chats"]:
            chats = chats.filter(pk__in=options["chats"]).order_by("pk")
            missing = set(options["chats"]) - set(chats.values_list("pk", flat=True))
            if missing:
                raise CommandError(f"No chat with the primary key {sorted(missing)[0]}.")
        else:
            chats = chats.order_by("-created_at")[: options["latest"]]
        eval_set = set_from_chats(name, chats, turns=options["turns"])
    command.stdout.write(
        f"Eval set {eval_set.name!r} (pk {eval_set.pk}): {len(eval_set.items)} cases."
    )


def _eval_set(value: str) -> EvalSet:
    found = EvalSet.objects.filter(name=value).first()
    if found is None and value.isdigit():
        found = EvalSet.objects.filter(pk=int(value)).first()
    if found is None:
        raise CommandError(f"No eval set named {value!r}.")
    return found


def _run_of(pk: int) -> EvalRun:
    found = EvalRun.objects.filter(pk=pk).select_related("eval_set").first()
    if found is None:
        raise CommandError(f"No eval run with the primary key {pk}.")
    return found


def _scorers(options: dict[str, Any]) -> list[dict[str, Any]] | None:
    scorers = []
    for raw in options["scorers"]:
        try:
            scorers.append(json.loads(raw))
        except ValueError as exc:
            raise CommandError(f"--scorer {raw!r} is not JSON: {exc}") from None
    if options["judge"]:
        judge = {"kind": "judge", "model": options["judge"]}
        if options["rubric"]:
            judge["rubric"] = options["rubric"]
        scorers.append(judge)
    return scorers or None


def _run(command: BaseCommand, options: dict[str, Any]) -> None:
    eval_set = _eval_set(options["set"])
    max_cost = options["max_cost"]
    if max_cost is not None:
        try:
            Decimal(max_cost)
        except InvalidOperation:
            raise CommandError(
                f"--max-cost must be a number of dollars, not {max_cost!r}"
            ) from None
    baseline = _run_of(options["baseline"]) if options["baseline"] else None
    if options["batch"] and options["background"]:
        raise CommandError("--batch and --background are two ways to run: choose one.")
    if options["no_wait"] and not options["batch"]:
        raise CommandError("--no-wait goes with --batch.")
    run = start_run(
        eval_set, options["model"], provider=options["provider"], name=options["name"],
        instructions=options["instructions"], tools=options["tools"],
        agent_path=options["agent"], live_tools=options["live_tools"],
        scorers=_scorers(options), fail_under=options["fail_under"], max_cost=max_cost,
        baseline=baseline, batch=options["batch"], send=False,
    )  # fmt: skip
    total = run.cases.count()
    command.stdout.write(f"Eval run {run.pk}: {total} cases of {eval_set.name!r} on {run.model}.")
    if options["batch"]:
        send_round(run)
        if options["no_wait"]:
            command.stdout.write(_progress(run, total))
            command.stdout.write(
                f"Sent. The poll_batches task moves it on; 'eval show {run.pk}' shows where it is."
            )
            return
        _wait(command, run, total, poll=options["poll_seconds"])
    elif options["background"]:
        send_cases(run)
        _wait(command, run, total)
    else:
        run_here(run)
    _report(command, run)


def _progress(run: EvalRun, total: int) -> str:
    """One line: cases done and by outcome, and a batched run's open batches."""
    progress = run.progress()
    done = total - progress["pending"] - progress["running"]
    line = (
        f"  {done}/{total} done ({progress['passed']} passed, {progress['failed']} "
        f"failed, {progress['error']} errors, {progress['running']} running)"
    )
    if run.batched:
        batches = run.batches.filter(collected_at__isnull=True).order_by("pk")
        shown = ", ".join(f"#{b.pk} {b.status}" for b in batches)
        line += f"; open batches: {shown or 'none'}"
    return line


def _wait(command: BaseCommand, run: EvalRun, total: int, poll: float | None = None) -> None:
    """Print the progress of a background run until every case has its outcome; a batched
    run's batches are polled here every ``poll`` seconds."""
    shown = ""
    while True:
        if poll is not None:
            poll_eval_runs(run)
        line = _progress(run, total)
        if line != shown:
            command.stdout.write(line)
            shown = line
        if not run.cases.unfinished().exists():
            return
        time.sleep(POLL_SECONDS if poll is None else poll)


def _report(command: BaseCommand, run: EvalRun) -> None:
    summary = summarize(run)
    for case in run.cases.exclude(state=EvalCaseState.PASSED).order_by("position")[:20]:
        reasons = (
            "; ".join(f"{s['name']}: {s['reason']}" for s in case.scores if not s["passed"])
            or case.error
        )
        command.stdout.write(f"  case {case.position} {case.state}: {reasons[:300]}")
    mean = "-" if summary.mean_score is None else f"{summary.mean_score:.3f}"
    command.stdout.write(
        f"Pass rate {summary.pass_rate:.1%} ({summary.passed}/{summary.finished}), mean score "
        f"{mean}, cost ${summary.cost:.4f}, p50 {summary.p50_ms} ms, p95 {summary.p95_ms} ms, "
        f"{summary.unmatched_calls} calls with no recording."
    )
    if run.fail_under is not None and summary.pass_rate < run.fail_under:
        raise CommandError(
            f"Eval run {run.pk} failed: pass rate {summary.pass_rate:.1%} is under "
            f"{run.fail_under:.1%}."
        )


def _compare(command: BaseCommand, options: dict[str, Any]) -> None:
    run_a, run_b = _run_of(options["run_a"]), _run_of(options["run_b"])
    if run_a.eval_set_id != run_b.eval_set_id:
        raise CommandError(f"Runs {run_a.pk} and {run_b.pk} are of different eval sets.")
    comparison = compare(run_a, run_b)
    command.stdout.write(
        comparison.table(run_a.name or f"run {run_a.pk}", run_b.name or f"run {run_b.pk}")
    )


def _show(command: BaseCommand, options: dict[str, Any]) -> None:
    run = _run_of(options["run"])
    progress = run.progress()
    command.stdout.write(
        f"Eval run {run.pk} of {run.eval_set.name!r} on {run.model}: "
        + ", ".join(f"{progress[state]} {state}" for state in EvalCaseState.values)
    )
    if run.batched:
        command.stdout.write(_progress(run, progress["total"]))
    _report(command, run)

"""``manage.py agentloop chats [FILTERS] ACTION``: control many chats at once from a shell.

    manage.py agentloop chats --model 'anthropic:*' --state running halt 'provider outage'
    manage.py agentloop chats --state stopped --dry-run resume
    manage.py agentloop chats --owner ada --older-than 7d cancel
    manage.py agentloop chats --model 'anthropic:*' with-model openai:gpt-4.1-mini
    manage.py agentloop chats --state failed list

The filters select chats (all of them combine); the action is the set-based verb of
``ChatQuerySet`` (``agentloop.models.bulk``), run in batches, and the counts are printed.
``--dry-run`` prints what the action would change and changes nothing.
"""

from __future__ import annotations

import argparse
import re
from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db.models import Q
from django.db.models.functions import Now
from django.utils.timesince import timesince

from ..conf import get_chat_model
from ..exceptions import AgentloopError
from ..models import ChatState
from ..models.bulk import BulkResult, model_matches
from ..runners import runner_name, wait_for_embedded_jobs
from ..terminal import visible

__all__ = ["add_chats_parser", "handle_chats", "parse_duration"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")

#: why each action skips a chat, for the summary line.
_SKIPPED = {
    "cancel": "no run to cancel",
    "halt": "no run to halt",
    "complete_later": "running",
    "resume": "not stopped or failed, or running",
    "with_model": "running",
}


def parse_duration(text: str) -> timedelta:
    """``"90s"``, ``"30m"``, ``"2h"``, ``"7d"``, ``"1w"`` as a timedelta."""
    found = _DURATION.match(text)
    if found is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration: write a number and a unit, e.g. 90s, 30m, 2h, 7d, 1w"
        )
    return timedelta(seconds=float(found.group(1)) * _UNITS[found.group(2)])


def _state(text: str) -> list[str]:
    states = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [state for state in states if state not in ChatState.values]
    if unknown or not states:
        raise argparse.ArgumentTypeError(
            f"unknown state {', '.join(unknown) or repr(text)}: choose from "
            f"{', '.join(ChatState.values)}"
        )
    return states


def _batch_size(text: str) -> int:
    try:
        size = int(text)
    except ValueError:
        size = 0
    if size < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of chats")
    return size


def add_chats_parser(subcommands: Any) -> None:
    """The ``chats`` subcommand: its filters, then one action."""
    chats = subcommands.add_parser(
        "chats",
        help="Control many chats at once: cancel, halt, resume, complete-later, with-model.",
        description=(
            "Selects chats with the filters (all of them apply) and runs one action on them, "
            "in batches (one UPDATE per batch, never over a running step). Prints the counts: "
            "matched, changed, skipped. --dry-run changes nothing."
        ),
    )
    chats.add_argument(
        "--model",
        metavar="GLOB",
        help="The chat's model, '*' and '?' as wildcards: 'anthropic:*', '*-mini'.",
    )
    chats.add_argument(
        "--state",
        type=_state,
        action="extend",
        metavar="STATE[,STATE]",
        help=f"The chat's state ({', '.join(ChatState.values)}); repeat or comma-separate.",
    )
    chats.add_argument("--owner", metavar="USERNAME", help="The chats of this user.")
    chats.add_argument(
        "--older-than",
        type=parse_duration,
        metavar="DURATION",
        help="Created more than DURATION ago (90s, 30m, 2h, 7d, 1w).",
    )
    chats.add_argument(
        "--inactive-for",
        type=parse_duration,
        metavar="DURATION",
        help="Last changed more than DURATION ago.",
    )
    chats.add_argument(
        "--id", dest="ids", action="append", metavar="ID", help="This chat; repeat for more."
    )
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: given before the action, the flag is not reset by the action's parser.
    common.add_argument(
        "--dry-run",
        action="store_true",
        default=argparse.SUPPRESS,
        help="Print what would change; change nothing.",
    )
    common.add_argument(
        "--batch-size",
        type=_batch_size,
        default=argparse.SUPPRESS,
        metavar="N",
        help="Chats per statement (default 1000).",
    )
    chats.add_argument("--dry-run", action="store_true", help="Print what would change.")
    chats.add_argument("--batch-size", type=_batch_size, metavar="N", help="Chats per statement.")
    actions = chats.add_subparsers(dest="action", metavar="action", title="actions", required=True)
    actions.add_parser(
        "cancel", parents=[common], help="Cancel their runs (those with one in progress)."
    )
    halt = actions.add_parser(
        "halt", parents=[common], help="Halt their runs before the next model call."
    )
    halt.add_argument("reason", help="Why (the chat's stop reason: 'halted: REASON').")
    actions.add_parser(
        "resume", parents=[common], help="Send the stopped and failed ones on in the background."
    )
    actions.add_parser(
        "complete-later", parents=[common], help="Run them in the background (not running ones)."
    )
    switch = actions.add_parser(
        "with-model", parents=[common], help="Switch them to MODEL (not running ones)."
    )
    switch.add_argument("new_model", metavar="MODEL", help="'provider:model'.")
    switch.add_argument("--provider", help="The provider, when MODEL names none.")
    listing = actions.add_parser("list", help="List them (newest first).")
    listing.add_argument("--limit", type=_batch_size, default=20, help="At most N (default 20).")


def _selected(options: dict[str, Any]) -> Any:
    """The chats the filters select."""
    chats = get_chat_model()._default_manager.all()
    if options.get("model"):
        chats = chats.filter(model_matches(options["model"]))
    if options.get("state"):
        chats = chats.filter(state__in=options["state"])
    if options.get("owner"):
        user_model = get_user_model()
        try:
            owner = user_model._default_manager.get_by_natural_key(options["owner"])
        except user_model.DoesNotExist as exc:
            raise CommandError(f"No user {options['owner']!r}.") from exc
        chats = chats.filter(owner=owner)
    if options.get("older_than") is not None:
        chats = chats.filter(created_at__lt=Now() - options["older_than"])
    if options.get("inactive_for") is not None:
        chats = chats.filter(updated_at__lt=Now() - options["inactive_for"])
    if options.get("ids"):
        pk = chats.model._meta.pk
        try:
            keys = [pk.to_python(value) for value in options["ids"]]
        except Exception as exc:
            raise CommandError(f"--id: {exc}") from exc
        chats = chats.filter(Q(pk__in=keys))
    return chats


def handle_chats(command: BaseCommand, options: dict[str, Any]) -> None:
    """Run the chosen action on the chats the filters select, and print the counts."""
    chats = _selected(options)
    action = options["action"]
    if action == "list":
        _list(command, chats, options["limit"])
        return
    settings = {"dry_run": bool(options.get("dry_run")), "batch_size": options.get("batch_size")}
    try:
        if action == "halt":
            result = chats.halt(options["reason"], **settings)
        elif action == "with-model":
            result = chats.with_model(options["new_model"], options.get("provider"), **settings)
        else:
            result = getattr(chats, action.replace("-", "_"))(**settings)
    except AgentloopError as exc:
        raise CommandError(f"Nothing changed: {exc}") from exc
    command.stdout.write(_summary(result))
    if result.changed and not result.dry_run and action in ("resume", "complete-later"):
        if runner_name() == "embedded":
            # No broker: the steps run in this process, so wait for them before exiting.
            wait_for_embedded_jobs()


def _summary(result: BulkResult) -> str:
    reason = _SKIPPED[result.verb]
    if result.dry_run:
        return (
            f"Dry run: {result.verb} would change {result.changed} of {result.matched} "
            f"matching chat(s); {result.skipped} skipped ({reason}). Nothing changed."
        )
    details = "".join(
        f"; {value} {name.replace('_', ' ')}" for name, value in result.details.items()
    )
    return (
        f"{result.verb}: {result.matched} matched, {result.changed} changed, "
        f"{result.skipped} skipped ({reason}){details}."
    )


def _list(command: BaseCommand, chats: Any, limit: int) -> None:
    total = chats.count()
    rows = chats.select_related("owner").order_by("-created_at")[:limit]
    command.stdout.write(f"{total} matching chat(s)" + (":" if total else "."))
    for chat in rows:
        owner = visible(chat.owner.get_username()) if chat.owner_id else "-"
        model = visible(chat.model) if chat.model else "(default model)"
        command.stdout.write(
            f"  #{chat.pk} {chat.state} {model} owner={owner} "
            f"updated {timesince(chat.updated_at)} ago: {visible(chat)}"
        )
    if total > limit:
        command.stdout.write(f"  ... and {total - limit} more (--limit)")

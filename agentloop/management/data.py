"""``manage.py agentloop export | erase | retention``: an owner's data, and retention.

    manage.py agentloop export --owner 42 [--output FILE] [--attachments include|reference]
    manage.py agentloop erase --owner 42 [--delete-usage] [--wait SECONDS] [--yes]
    manage.py agentloop retention [--days N] [--dry-run]

The subcommands of the ``agentloop`` command (management/commands/agentloop.py) that call
``agentloop.data``; kept here, apart from the others.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from ..conf import agentloop_settings
from ..data import delete_idle_chats, erase_owner, expired_memories, idle_chats, write_export

__all__ = ["add_data_subcommands", "data_handlers"]


def add_data_subcommands(subcommands: Any) -> None:
    """Add ``export``, ``erase`` and ``retention`` to the ``agentloop`` command's parser."""
    export = subcommands.add_parser(
        "export",
        help="Write everything agentloop keeps about one owner as one JSON document.",
        description=(
            "Chats (subagent chats included), messages, tool calls with their decisions, "
            "usage, and the decisions the owner made on other chats, as one JSON document "
            "(docs: Data retention and erasure)."
        ),
    )
    _owner_argument(export)
    export.add_argument(
        "--output", "-o", metavar="FILE", help="Write to FILE (default: standard output)."
    )
    export.add_argument(
        "--attachments",
        choices=["include", "reference"],
        default="include",
        help="include: attachment data as stored (base64); reference: only their kind, "
        "media type, name, size and SHA-256 (default: include).",
    )
    erase = subcommands.add_parser(
        "erase",
        help="Delete everything agentloop keeps about one owner (usage kept, anonymised).",
        description=(
            "Cancels the owner's running chats, waits for them to stop, then deletes their "
            "chats, subagent chats, messages, tool calls, live event streams and trace "
            "context. Usage rows stay for accounting with no owner, chat or error text, "
            "unless --delete-usage."
        ),
    )
    _owner_argument(erase)
    erase.add_argument(
        "--delete-usage", action="store_true", help="Delete the usage rows too (no accounting)."
    )
    erase.add_argument(
        "--wait",
        type=float,
        metavar="SECONDS",
        help="How long running chats get to stop after the cancel before they are deleted "
        "under their run (default: AGENTLOOP['LEASE_SECONDS']).",
    )
    erase.add_argument("--yes", action="store_true", help="Don't ask for confirmation.")
    retention = subcommands.add_parser(
        "retention",
        help="Delete chats idle for more than AGENTLOOP['RETENTION_DAYS'] days.",
        description=(
            "Deletes whole conversations (with their subagent chats) whose latest activity "
            "is older than the retention period, and memories past their expires_at; usage "
            "rows are kept. The periodic task "
            "agentloop.delete_idle_chats does the same."
        ),
    )
    retention.add_argument(
        "--days", type=int, help="Idle days (default: AGENTLOOP['RETENTION_DAYS'])."
    )
    retention.add_argument(
        "--dry-run", action="store_true", help="Count the idle chats; delete nothing."
    )


def data_handlers(command: BaseCommand) -> dict[str, Callable[..., None]]:
    """The handlers of the subcommands above, writing to ``command``'s output."""
    return {
        "export": lambda **options: _export(command, **options),
        "erase": lambda **options: _erase(command, **options),
        "retention": lambda **options: _retention(command, **options),
    }


def _owner_argument(parser: Any) -> None:
    parser.add_argument(
        "--owner",
        required=True,
        metavar="USER",
        help="The owner: a user's primary key, or else their username.",
    )


def _owner(value: str) -> Any:
    """The user named by ``--owner`` (primary key first, then username)."""
    users = get_user_model()._default_manager
    if value.isdigit():
        found = users.filter(pk=int(value)).first()
        if found is not None:
            return found
    found = users.filter(**{get_user_model().USERNAME_FIELD: value}).first()
    if found is None:
        raise CommandError(f"No user with the primary key or username {value!r}.")
    return found


def _export(
    command: BaseCommand, *, owner: str, output: str | None, attachments: str, **_: Any
) -> None:
    user = _owner(owner)
    if output is None:
        write_export(user, _Unended(command.stdout), attachments=attachments)
        return
    try:
        with open(output, "w", encoding="utf-8") as out:
            write_export(user, out, attachments=attachments)
    except OSError as exc:
        raise CommandError(f"Can't write {output}: {exc.strerror}.") from None
    command.stderr.write(f"Wrote the data of {user.get_username()} (pk {user.pk}) to {output}.")


def _erase(
    command: BaseCommand,
    *,
    owner: str,
    delete_usage: bool,
    wait: float | None,
    yes: bool,
    **_: Any,
) -> None:
    user = _owner(owner)
    if wait is not None and wait < 0:
        raise CommandError("--wait must be a number of seconds of at least 0.")
    if not yes:
        if not sys.stdin.isatty():
            raise CommandError("Erasing can't be undone: add --yes to erase without a prompt.")
        usage = "deleted" if delete_usage else "kept, anonymised"
        answer = input(
            f"Erase every chat of {user.get_username()} (pk {user.pk})? Usage rows: {usage}. "
            "Type 'yes': "
        )
        if answer.strip().lower() != "yes":
            raise CommandError("Nothing erased.")
    report = erase_owner(user, keep_usage=not delete_usage, wait=wait)
    command.stdout.write(str(report))


class _Unended:
    """A command's output written as is (its ``write`` ends each piece with a newline)."""

    def __init__(self, output: Any) -> None:
        self.output = output

    def write(self, text: str) -> None:
        self.output.write(text, ending="")


def _retention(command: BaseCommand, *, days: int | None, dry_run: bool, **_: Any) -> None:
    if days is not None and days < 1:
        raise CommandError("--days must be a whole number of days of at least 1.")
    if dry_run:
        chosen = days if days is not None else agentloop_settings.RETENTION_DAYS
        if chosen is None:
            raise CommandError(
                "No retention period: give --days or set AGENTLOOP['RETENTION_DAYS']."
            )
        count = idle_chats(chosen).count()
        expired = expired_memories().count()
        command.stdout.write(
            f"{count} chats are idle for more than {chosen} days and {expired} memories are "
            "past their expiry (none deleted)."
        )
        return
    command.stdout.write(str(delete_idle_chats(days)))

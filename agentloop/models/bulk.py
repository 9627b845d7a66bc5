"""Control of many chats at once: the set-based verbs behind ``ChatQuerySet.cancel()``,
``.halt(reason)``, ``.complete_later()``, ``.resume()`` and ``.with_model(model)``.

Each verb is the per-chat verb's conditional UPDATE applied to a batch of chats at a time
(``agentloop.django_store.bulk_updates``: one statement per ``batch_size`` chats, RETURNING
the chats it changed), then what the per-chat verb does next for those chats: a cancel or a
halt wakes their runs (one Redis message per batch), ``complete_later`` and ``resume`` send a
job each (one broker connection per batch). A running step is never written over: a cancel
or a halt only leaves a request that the run applies at its next checkpoint, and the verbs
that change what a run reads (``with_model``, ``complete_later``, ``resume``) skip chats a
run holds. The store never enqueues; this module, above the runners, does.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict, Unpack

from django.db import transaction
from django.db.models import Exists, OuterRef, Q, QuerySet, Value
from django.db.models.functions import Coalesce, Now
from django.utils import timezone

from .. import providers
from ..agents import subagents
from ..conf import agentloop_settings
from ..django_store.bulk_updates import (
    DEFAULT_BATCH_SIZE,
    batch_chats,
    count_chats,
    database,
    update_returning,
)
from ..engine._loop import halt_text
from ..process.cancel_notices import notify_many
from ..runners import enqueue_many

__all__ = [
    "BulkOptions",
    "BulkResult",
    "cancel",
    "complete_later",
    "halt",
    "model_matches",
    "resume",
    "with_model",
]

#: called with the primary keys a batch changed, once its statement ran (the admin logs them).
OnBatch = Callable[[list[Any]], None]


class BulkOptions(TypedDict, total=False):
    """What every set-based verb takes besides its own arguments."""

    #: count what would change, change nothing.
    dry_run: bool
    #: chats per statement (default ``DEFAULT_BATCH_SIZE``).
    batch_size: int | None
    on_batch: OnBatch | None


@dataclass(frozen=True)
class BulkResult:
    """What a set-based verb did: of the ``matched`` chats the queryset selected, ``changed``
    were acted on (with ``dry_run``: would be) and ``skipped`` were not (nothing to cancel or
    halt, running, not stopped...); ``details`` counts what came with it (a cancel's
    ``subagents_flagged``, and ``waiting_chats_cancelled``: the chats waiting for a person
    whose held calls it cancelled at once)."""

    verb: str
    matched: int
    changed: int
    dry_run: bool = False
    details: Mapping[str, int] = field(default_factory=dict)

    @property
    def skipped(self) -> int:
        """The matched chats the verb left alone (its condition didn't hold for them)."""
        return max(self.matched - self.changed, 0)

    def __str__(self) -> str:
        done = "would change" if self.dry_run else "changed"
        extra = "".join(
            f", {value} {name.replace('_', ' ')}" for name, value in self.details.items()
        )
        return (
            f"{self.verb}: {self.matched} matched, {self.changed} {done}, "
            f"{self.skipped} skipped{extra}"
        )


def _glob_regex(glob: str) -> str:
    """``glob`` (``*``, ``?``) as a regular expression both PostgreSQL and SQLite read."""
    parts = [".*" if char == "*" else "." if char == "?" else re.escape(char) for char in glob]
    return "^" + "".join(parts) + "$"


def model_matches(glob: str) -> Q:
    """The chats whose model matches ``glob`` (``"anthropic:*"``, ``"*mini"``): the model as
    stored, or ``provider:model`` for a chat that stores its provider apart; a chat with no
    model of its own matches when ``AGENTLOOP["DEFAULT_MODEL"]`` does."""
    if not glob:
        raise ValueError("A model glob can't be empty.")
    pattern = _glob_regex(glob)
    matches = Q(model__regex=pattern)
    provider, colon, rest = glob.partition(":")
    if colon and "*" not in provider and "?" not in provider:
        matches |= Q(provider=provider, model__regex=_glob_regex(rest))
    if fnmatch.fnmatchcase(str(agentloop_settings.DEFAULT_MODEL), glob):
        matches |= Q(model="")
    return matches


def _held_by_a_run() -> Q:
    """A run holds the chat now (judged by the database's clock, as every lease is)."""
    return Q(lease_token__gt="", lease_expires_at__gt=Now())


def _run(
    verb: str,
    queryset: QuerySet[Any],
    condition: Q,
    values: dict[str, Any],
    *,
    dry_run: bool = False,
    batch_size: int | None = None,
    after: Callable[[list[tuple[Any, ...]]], None] | None = None,
    returning: tuple[str, ...] = (),
    on_batch: OnBatch | None = None,
    details: dict[str, int] | None = None,
) -> BulkResult:
    matched = count_chats(queryset)
    if dry_run:
        return BulkResult(verb, matched, count_chats(queryset, condition), dry_run=True)

    def each_batch(rows: list[tuple[Any, ...]]) -> None:
        if after is not None:
            after(rows)
        if on_batch is not None:
            on_batch([row[0] for row in rows])

    changed = batch_chats(
        queryset,
        condition,
        values,
        returning=returning,
        batch_size=DEFAULT_BATCH_SIZE if batch_size is None else batch_size,
        on_batch=each_batch,
    )
    return BulkResult(verb, matched, changed, details=dict(details or {}))


def _after_commit(queryset: QuerySet[Any], action: Callable[[], None]) -> None:
    """Wake runs only once what they are to read is committed (at once outside a transaction)."""
    transaction.on_commit(action, using=database(queryset))


# -- cancel -----------------------------------------------------------------------------------
def cancel(
    queryset: QuerySet[Any],
    **options: Unpack[BulkOptions],
) -> BulkResult:
    """``chat.cancel()`` for every chat of ``queryset`` with a run to cancel (in progress,
    queued, or waiting for a person): the flag is set (an earlier request's time kept), each
    run stops at its next checkpoint (woken at once by a notice), their running subagents are
    flagged too, and the chats waiting for a person that no run holds have their held calls
    cancelled now. The others are skipped: nothing is set, so no later message inherits it."""
    model = queryset.model
    tool_calls = model._meta.get_field("tool_calls").related_model._default_manager
    active = (
        _held_by_a_run()
        | Q(state__in=["queued", "running", "waiting"])
        | Q(Exists(tool_calls.filter(chat=OuterRef("pk"), state="waiting")))
    )
    if any(each.name == "batch_items" for each in model._meta.get_fields()):
        batch_items = model._meta.get_field("batch_items").related_model._default_manager
        pending = batch_items.filter(chat=OuterRef("pk"), status="pending", cancelled_at=None)
        active |= Q(Exists(pending))
    now = timezone.now()
    details = {"subagents_flagged": 0, "waiting_chats_cancelled": 0}
    manager = model._default_manager.db_manager(database(queryset))

    def after(rows: list[tuple[Any, ...]]) -> None:
        pks = [row[0] for row in rows]
        woken = pks
        if subagents.has_children(model):
            running = Q(state__in=["queued", "running"]) | Q(parent_tool_call__state="running")
            children = update_returning(
                manager.filter(running, parent_id__in=pks),
                {"cancel_requested_at": Coalesce("cancel_requested_at", Value(now))},
            )
            details["subagents_flagged"] += len(children)
            woken = pks + [row[0] for row in children]
        _after_commit(queryset, lambda: notify_many(model, woken))
        # No run will come back to a chat that waits for a person while none holds it: its
        # held calls are cancelled now, chat by chat (each gets its result rows and its
        # events; its "cancelled" event releases its parent and cancels the subagents it
        # waits for), as chat.cancel() does.
        unheld = [
            pk for pk, state, token in rows if state not in ("queued", "running") and not token
        ]
        for chat in manager.filter(pk__in=unheld).order_by("pk") if unheld else ():
            if chat.conversation.cancel_waiting():
                details["waiting_chats_cancelled"] += 1

    values = {"cancel_requested_at": Coalesce("cancel_requested_at", Value(now))}
    return _run(
        "cancel", queryset, active, values, after=after, returning=("state", "lease_token"),
        details=details, **options,
    )  # fmt: skip


# -- halt -------------------------------------------------------------------------------------
def halt(
    queryset: QuerySet[Any],
    reason: str,
    **options: Unpack[BulkOptions],
) -> BulkResult:
    """``chat.halt(reason)`` for every chat of ``queryset`` a run is in progress or queued
    for: each run finishes its tool round and stops before its next model call (``stopped``,
    "halted: <reason>"). Chats with no run are skipped (nothing is set)."""
    model, text = queryset.model, halt_text(reason)
    running = _held_by_a_run() | Q(state__in=["queued", "running"])

    def after(rows: list[tuple[Any, ...]]) -> None:
        pks = [row[0] for row in rows]
        _after_commit(queryset, lambda: notify_many(model, pks, halt=True))

    return _run("halt", queryset, running, {"halt_reason": text}, after=after, **options)


# -- complete_later, resume -------------------------------------------------------------------
def _queue(
    verb: str,
    queryset: QuerySet[Any],
    condition: Q,
    **options: Unpack[BulkOptions],
) -> BulkResult:
    model = queryset.model
    queued = {
        "state": "queued", "error": "", "attempts": 0, "retry_at": None, "updated_at": Now(),
    }  # fmt: skip

    def after(rows: list[tuple[Any, ...]]) -> None:
        enqueue_many([row[0] for row in rows], model._meta.label, using=database(queryset))

    # Never a chat a run holds: that run goes on by itself (and would find a job busy).
    free = condition & ~Q(state="running") & ~_held_by_a_run()
    return _run(verb, queryset, free, queued, after=after, **options)


def complete_later(
    queryset: QuerySet[Any],
    **options: Unpack[BulkOptions],
) -> BulkResult:
    """``chat.complete_later()`` for every chat of ``queryset`` no run holds: queued (its
    error and attempts cleared), and a job sent for each once the batch commits. Running
    chats are skipped."""
    return _queue("complete_later", queryset, Q(), **options)


def resume(
    queryset: QuerySet[Any],
    **options: Unpack[BulkOptions],
) -> BulkResult:
    """The chats of ``queryset`` that a halt, a limit or a failure stopped (``stopped`` or
    ``failed``) go on in the background, as ``complete_later()`` would; every other chat is
    skipped (one that is idle, waiting or already on its way stays as it is)."""
    return _queue("resume", queryset, Q(state__in=["stopped", "failed"]), **options)


# -- with_model -------------------------------------------------------------------------------
def with_model(
    queryset: QuerySet[Any],
    model: str,
    provider: str | None = None,
    **options: Unpack[BulkOptions],
) -> BulkResult:
    """``chat.with_model(model, provider)`` for every chat of ``queryset`` that no run holds
    now (queued ones included: their next step uses the new model); running chats are
    skipped, so no step in flight changes model under its feet. A model no provider serves
    fails first (``ConfigurationError``, ``UnknownProviderError``), with nothing changed."""
    providers.resolve(model, provider)
    not_running = ~Q(state="running") & ~_held_by_a_run()
    values = {"model": model, "provider": provider or "", "updated_at": Now()}
    return _run("with_model", queryset, not_running, values, **options)

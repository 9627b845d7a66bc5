"""Erasing everything agentloop keeps about one owner: ``erase_owner(owner)``.

In order: the owner's runs are cancelled (``chat.cancel()``: the flag and a Redis notice,
so a streaming answer stops at its next checkpoint); erasure waits up to ``wait`` seconds
for every lease on the owner's chats to be given back; then the chats go, a batch at a
time, each batch in one transaction that locks its rows first (``rows.delete_chats``), so a
step still running (a tool that doesn't stop at a cancel) writes nothing more: its next
write finds no row. Usage rows are kept for accounting with the owner, chat, message and
error text removed, or deleted (``keep_usage=False``). Decisions the owner made on other
people's chats keep the decision but not who made it, nor their words: a denial's reason
and an answer to a question become :data:`ERASED`, in the rows and in those chats' live
event streams. The owner's ``Budget`` row (limits and spend) goes. Event streams of the
erased chats are replaced by tombstones. What stays outside the database (the traces a
tracing backend already received, the provider's own logs) is not agentloop's to erase.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Now

from ..conf import agentloop_settings
from ..django_store.transcript_reads import forget_kept_messages
from ..engine._tool_rounds import DENIED_RESULT
from ..live_events import forget_messages
from ..models.budgets import Budget
from ..models.evals import EvalCase, EvalSet
from ..models.memories import Memory, WorkingMemory
from ..process.redis_client import chat_name
from .deletion import ChatModels, Deleted, delete_chats, owner_pk, subagent_chats

__all__ = ["ERASED", "ErasureReport", "erase_owner"]

#: what stands where an erased owner's words were in other owners' chats.
ERASED = "[erased]"

#: chats deleted per transaction (each with its subagent chats).
BATCH = 100
#: seconds between two looks at whether the cancelled runs gave their leases back.
POLL = 0.05
#: states in which a chat has a run to cancel.
IN_FLIGHT = ("queued", "running", "waiting")


@dataclass
class ErasureReport:
    """What ``erase_owner`` did."""

    owner: Any
    #: runs cancelled first (in progress, queued, or waiting for a person).
    cancelled: int = 0
    #: chats whose run still held its lease when the wait was over: deleted under it, so
    #: that run's next write failed (nothing of it was saved).
    fenced: int = 0
    deleted: Deleted = field(default_factory=Deleted)
    #: usage rows without a chat (deleted earlier) that lost the owner too, or went.
    usage_without_chat: int = 0
    #: tool calls of other owners' chats this owner decided: ``decided_by`` cleared.
    decisions_unattributed: int = 0
    #: of those, the ones whose reason or answer (the owner's words) became ``ERASED``.
    words_erased: int = 0
    #: the owner's ``Budget`` rows deleted (with their reservations and places in flight).
    budgets_deleted: int = 0
    #: the owner's memories deleted (theirs by owner, or by their subject's key).
    memories_deleted: int = 0
    #: eval cases replayed from the owner's chats (their turn, answers and scores) deleted.
    eval_cases_deleted: int = 0
    #: items of eval sets taken from the owner's chats (their turn and its recorded answer)
    #: removed from their sets.
    eval_items_removed: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        gone = self.deleted
        usage = (
            f"{gone.usage_deleted + self.usage_without_chat} usage rows deleted"
            if gone.usage_deleted
            else f"{gone.usage_anonymised + self.usage_without_chat} usage rows anonymised"
        )
        return (
            f"Owner {self.owner}: {gone.chats} chats, {gone.messages} messages, "
            f"{gone.tool_calls} tool calls deleted; {usage}; {self.cancelled} runs cancelled "
            f"first ({self.fenced} still running, fenced); {self.decisions_unattributed} "
            f"decisions on other chats unattributed ({self.words_erased} with their words "
            f"erased); {self.budgets_deleted} budget rows, {self.memories_deleted} memories, "
            f"{self.eval_cases_deleted} eval cases deleted; {self.eval_items_removed} eval set "
            "items removed."
        )


def erase_owner(
    owner: Any,
    *,
    keep_usage: bool = True,
    wait: float | None = None,
    chat_model: Any = None,
    using: str = "default",
) -> ErasureReport:
    """Erase the chats of ``owner`` (a user or its primary key) with their subagent chats,
    messages, tool calls, decisions, live event streams and trace context.

    Running chats are cancelled first and given ``wait`` seconds (default
    ``LEASE_SECONDS``) to stop; one that hasn't is deleted under its run, which then
    writes nothing. Usage rows stay for accounting, anonymised (no owner, chat, message or
    error text), unless ``keep_usage=False`` deletes them. Safe to run again: a second run
    finds nothing, or what the owner made meanwhile. Call it outside a transaction: each
    batch commits on its own (inside one, the locks are held until that one commits).
    """
    pk = owner_pk(owner)
    models = ChatModels.of(chat_model)
    report = ErasureReport(owner=pk)
    owned = models.chat._default_manager.using(using).filter(owner_id=pk)
    family = list(owned.values_list("pk", flat=True))
    family += subagent_chats(models, family, using)
    report.cancelled = _cancel_runs(models, family, using)
    report.fenced = _wait_for_leases(models, family, using, wait)
    usage = "anonymise" if keep_usage else "delete"
    while True:
        batch = list(owned.order_by("pk").values_list("pk", flat=True)[:BATCH])
        if not batch:
            break
        deleted, _gone = delete_chats(models, batch, usage=usage, using=using)
        report.deleted.add(deleted)
    leftover = models.usage._default_manager.using(using).filter(owner_id=pk)
    if keep_usage:
        report.usage_without_chat = leftover.update(owner=None, message=None, error="")
    else:
        report.usage_without_chat = leftover.delete()[0]
    report.words_erased = _erase_words(models, pk, using)
    report.decisions_unattributed = (
        models.tool_call._default_manager.using(using)
        .filter(decided_by_id=pk)
        .update(decided_by=None)
    )
    subject = f"{get_user_model()._meta.label_lower}:{pk}"  # budgets.owner_subject's key
    _, gone = Budget._default_manager.using(using).filter(subject=subject).delete()
    report.budgets_deleted = gone.get(Budget._meta.label, 0)
    memories = Memory._default_manager.using(using).filter(Q(owner_id=pk) | Q(subject=subject))
    report.memories_deleted = memories.delete()[0]
    # A working memory counts as one more memory of the owner's.
    working = WorkingMemory._default_manager.using(using)
    report.memories_deleted += working.filter(Q(owner_id=pk) | Q(subject=subject)).delete()[0]
    report.eval_cases_deleted, report.eval_items_removed = _erase_evals(set(family), using)
    # This process's copies of transcripts it read (never served once their rows are gone)
    # are dropped too, so erased words don't stay in its memory.
    forget_kept_messages()
    return report


def _erase_evals(chats: set[Any], using: str) -> tuple[int, int]:
    """Delete the eval cases replayed from ``chats`` and remove the items taken from them
    from their sets: both copy the owner's words. Returns (cases deleted, items removed)."""
    cases = 0
    keys = sorted(chats)
    for start in range(0, len(keys), BATCH):
        batch = keys[start : start + BATCH]
        cases += EvalCase._default_manager.using(using).filter(source_chat_id__in=batch).delete()[0]
    removed = 0
    with transaction.atomic(using=using):
        for eval_set in EvalSet._default_manager.using(using).select_for_update():
            kept = [item for item in eval_set.items if item.get("chat") not in chats]
            if len(kept) != len(eval_set.items):
                removed += len(eval_set.items) - len(kept)
                eval_set.items = kept
                eval_set.save(update_fields=["items"])
    return cases, removed


def _erase_words(models: ChatModels, pk: Any, using: str) -> int:
    """Replace what the owner wrote on other owners' calls (a denial's reason, an answer)
    with :data:`ERASED`, in the call, in its result and in its chat's event stream; how many
    calls. The decision itself stays: the chat's history still reads as it ran."""
    calls = models.tool_call._default_manager.using(using).filter(decided_by_id=pk)
    denied = calls.filter(decision="denied").exclude(decision_reason="")
    answered = calls.filter(decision="answered")
    results = models.message._default_manager.using(using).filter(role="tool")
    with transaction.atomic(using=using):
        denials = list(denied.values_list("pk", "chat_id"))
        answers = list(answered.values_list("pk", "chat_id"))
        denied.filter(pk__in=[call for call, _ in denials]).update(decision_reason=ERASED)
        rewritten = list(
            results.filter(tool_call_id__in=[call for call, _ in denials + answers]).values_list(
                "pk", "chat_id"
            )
        )
        results.filter(tool_call_id__in=[call for call, _ in denials]).update(
            content=f"{DENIED_RESULT} Reason: {ERASED}"
        )
        results.filter(tool_call_id__in=[call for call, _ in answers]).update(content=ERASED)
    by_chat: dict[str, list[Any]] = {}
    for message, chat in rewritten:
        by_chat.setdefault(chat_name(models.chat, chat), []).append(message)
    forget_messages(by_chat)
    return len(denials) + len(answers) + _erase_server_answers(models, pk, using)


def _erase_server_answers(models: ChatModels, pk: Any, using: str) -> int:
    """The owner's answers to MCP servers' questions on other owners' calls (docs/mcp.md):
    the action stays, who answered and the content they gave go; how many calls."""
    calls = models.tool_call._default_manager.using(using)
    with transaction.atomic(using=using):
        asked = list(calls.select_for_update().filter(elicitation__response__by=pk))
        for call in asked:
            response = {**call.elicitation["response"], "by": None}
            if response.get("content") is not None:
                response["content"] = ERASED
            call.elicitation = {**call.elicitation, "response": response}
            call.save(update_fields=["elicitation"])
    return len(asked)


def _cancel_runs(models: ChatModels, pks: list[Any], using: str) -> int:
    """Cancel the runs of the chats ``pks`` that have one; how many were cancelled."""
    running = (
        models.chat._default_manager.using(using)
        .filter(pk__in=pks)
        .filter(Q(state__in=IN_FLIGHT) | Q(lease_token__gt=""))
    )
    return sum(1 for chat in running if chat.cancel())


def _held(models: ChatModels, pks: list[Any], using: str) -> Any:
    # Judged by the database's clock, as every lease decision is.
    return models.chat._default_manager.using(using).filter(
        pk__in=pks, lease_token__gt="", lease_expires_at__gt=Now()
    )


def _wait_for_leases(models: ChatModels, pks: list[Any], using: str, wait: float | None) -> int:
    """Wait up to ``wait`` seconds for the runs of ``pks`` to give their leases back; how
    many still hold one."""
    limit = agentloop_settings.LEASE_SECONDS if wait is None else max(0.0, wait)
    deadline = time.monotonic() + limit
    held = _held(models, pks, using)
    while True:
        count = held.count()
        if not count or time.monotonic() >= deadline:
            return count
        time.sleep(POLL)

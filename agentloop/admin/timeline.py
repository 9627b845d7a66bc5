"""A chat's transcript for display (``build_timeline``): three queries, whatever its length."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.db.models import Count, Q, Sum
from django.utils.translation import gettext_lazy as _

from ..messages import ToolCallState
from ..models import Memory, UsageStatus
from ..models.usage import TOKEN_SUMS
from .relations import has_field, related_model

__all__ = [
    "DECISION_LABELS",
    "GUARDRAIL_LABELS",
    "WAIT_LABELS",
    "CallEntry",
    "Entry",
    "GuardrailEntry",
    "RecallEntry",
    "Timeline",
    "build_timeline",
    "format_cost",
]

WAIT_LABELS = {
    "approval": _("waiting for approval"),
    "question": _("waiting for an answer"),
    "subagent": _("waiting for its subagent"),
    "deferred": _("waiting for its result from outside"),
}
DECISION_LABELS = {
    "approved": _("approved"),
    "denied": _("denied"),
    "answered": _("answered"),
    "submitted": _("result submitted"),
    "superseded": _("superseded by an edit or a regenerated answer: never run"),
}


GUARDRAIL_LABELS = {
    "passed": _("passed"),
    "blocked": _("blocked"),
    "replaced": _("replaced"),
    "error": _("failed"),
}


@dataclass
class GuardrailEntry:
    """What one guardrail decided about a message or a tool call (the row's JSON outcome)."""

    guardrail: str
    stage: str
    decision: str
    reason: str = ""
    #: what it replaced (text, or arguments as JSON), when kept.
    original: str = ""
    parallel: bool = False
    duration_ms: int | None = None

    @property
    def label(self) -> str:
        return str(GUARDRAIL_LABELS.get(self.decision, self.decision))


def guardrail_entries(outcomes: Any) -> list[GuardrailEntry]:
    """A row's ``guardrails`` column as entries (a malformed one is shown, not fatal)."""
    entries = []
    for outcome in outcomes or []:
        if not isinstance(outcome, dict):
            continue
        original = outcome.get("original")
        entries.append(
            GuardrailEntry(
                guardrail=str(outcome.get("guardrail", "")),
                stage=str(outcome.get("stage", "")),
                decision=str(outcome.get("decision", "")),
                reason=str(outcome.get("reason", "")),
                original=(original if isinstance(original, str) else _pretty_json(original))
                if original is not None
                else "",
                parallel=bool(outcome.get("parallel", False)),
                duration_ms=outcome.get("duration_ms"),
            )
        )
    return entries


def format_cost(value: Decimal | None) -> str:
    """US dollars, to the micro-dollar, without trailing zeros; "—" when unknown."""
    if value is None:
        return "—"
    amount = Decimal(value).quantize(Decimal("0.000001")).normalize()
    return f"${amount:f}"


def _pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


@dataclass
class CallEntry:
    """A tool call with its result row, its subagent chat and what the page says about it."""

    call: Any
    arguments: str
    result: Any = None
    child: Any = None
    child_url: str = ""
    decide_url: str = ""
    #: the model's arguments, when an approver edited them ("" otherwise).
    original_arguments: str = ""

    @property
    def guardrails(self) -> list[GuardrailEntry]:
        """What tool guardrails decided before it ran."""
        return guardrail_entries(getattr(self.call, "guardrails", None))

    @property
    def state_label(self) -> str:
        if self.call.state == ToolCallState.WAITING:
            return str(WAIT_LABELS.get(self.call.wait_reason, _("waiting")))
        return str(self.call.state)

    @property
    def handoff_label(self) -> str:
        """ "Handed off from Triage to Billing" when this call handed the chat over; ""."""
        handoff = self.call.handoff or {}
        target = str(handoff.get("to") or "").rpartition(".")[2]
        if not target:
            return ""
        source = str(handoff.get("from") or "").rpartition(".")[2]
        if source:
            return str(
                _("Handed off from %(source)s to %(target)s") % {"source": source, "target": target}
            )
        return str(_("Handed off to %(target)s") % {"target": target})

    @property
    def decision_label(self) -> str:
        return str(DECISION_LABELS.get(self.call.decision, self.call.decision))

    @property
    def duration(self) -> str:
        """How long the tool ran, when it ran: "17 ms", "2.4 s", "3 min 5 s"."""
        if not (self.call.started_at and self.call.finished_at):
            return ""
        seconds = (self.call.finished_at - self.call.started_at).total_seconds()
        if seconds < 1:
            return f"{seconds * 1000:.0f} ms"
        if seconds < 60:
            return f"{seconds:.1f} s"
        return f"{seconds // 60:.0f} min {seconds % 60:.0f} s"

    @property
    def error_summary(self) -> str:
        """The last line of the stored traceback: the exception and its message."""
        lines = [line for line in self.call.error.strip().splitlines() if line.strip()]
        return lines[-1].strip() if lines else ""


@dataclass(frozen=True)
class RecallEntry:
    """A memory an answer was given (``with_memory``): its id, its similarity to the user's
    message, and its text (untrusted: the template escapes it; "" once it was forgotten)."""

    memory_id: Any
    similarity: float
    text: str = ""


@dataclass
class Entry:
    """A message of the transcript; an assistant's tool calls (and their results) hang off it."""

    message: Any
    calls: list[CallEntry] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    parsed: str = ""
    #: the memories the answer was given (``Message.recall``), with their text.
    recall: list[RecallEntry] = field(default_factory=list)
    #: on the first of a run of superseded messages, how many the run holds (the timeline
    #: shows them collapsed); on its last, ``closes_superseded``.
    opens_superseded: int = 0
    closes_superseded: bool = False

    @property
    def guardrails(self) -> list[GuardrailEntry]:
        """What input (a user message) or output (an answer) guardrails decided about it."""
        return guardrail_entries(getattr(self.message, "guardrails", None))

    @property
    def usage_cost(self) -> str:
        """The cost of this message's attempts; "" when no price is known."""
        if not self.usage or self.usage["cost"] is None:
            return ""
        return format_cost(self.usage["cost"])


@dataclass
class Timeline:
    """A chat's transcript in order, with usage per message and for the whole chat."""

    chat: Any
    entries: list[Entry]
    totals: dict[str, Any]
    message_count: int
    pending_approvals: int = 0
    pending_questions: int = 0
    #: messages an edit or a regenerated answer superseded (shown collapsed).
    superseded_count: int = 0

    @property
    def total_cost(self) -> str:
        return format_cost(self.totals["cost"])


_USAGE_SUMS: dict[str, Any] = {
    **TOKEN_SUMS,
    # Null when no attempt of the group had a known price (not $0). Not named "cost": the
    # "unpriced" filter below must see the field, not this sum.
    "known_cost": Sum("cost"),
    "attempts": Count("id"),
    "failed": Count("id", filter=Q(status=UsageStatus.FAILED)),
    "cancelled": Count("id", filter=Q(status=UsageStatus.CANCELLED)),
    "unpriced": Count("id", filter=Q(cost__isnull=True)),
}


def _sum_usage(rows: list[dict[str, Any]]) -> dict[str, Any]:
    totals: dict[str, Any] = dict.fromkeys(_USAGE_SUMS, 0)
    for row in rows:
        for name in _USAGE_SUMS:
            if name != "known_cost":
                totals[name] += row[name]
    costs = [row["cost"] for row in rows if row["cost"] is not None]
    totals["cost"] = sum(costs, Decimal(0)) if costs else None
    del totals["known_cost"]
    return totals


def build_timeline(
    chat: Any, *, url_for_chat: Any = None, url_for_decision: Any = None
) -> Timeline:
    """Read a chat's transcript for display: three queries, whatever its length.

    ``url_for_chat(pk)`` links a subagent's chat, ``url_for_decision(call)`` is where the
    approve/deny/answer buttons of a waiting call post; without them there are no links.
    """
    chat_model = type(chat)
    tool_call_model = related_model(chat_model, "tool_calls")
    rows = list(chat.messages.order_by("id").defer("provider_data"))
    calls = chat.tool_calls.order_by("id").select_related("decided_by").defer("provider_data")
    with_children = has_field(tool_call_model, "child_chat")
    if with_children:
        calls = calls.select_related("child_chat")
    usage_rows = list(chat.usage_records.order_by().values("message_id").annotate(**_USAGE_SUMS))
    for row in usage_rows:
        row["cost"] = row.pop("known_cost")
    usage_by_message = {row["message_id"]: row for row in usage_rows if row["message_id"]}
    results = {row.tool_call_id: row for row in rows if row.tool_call_id is not None}

    calls_by_message: dict[Any, list[CallEntry]] = defaultdict(list)
    call_pks = set()
    timeline = Timeline(chat, [], _sum_usage(usage_rows), len(rows))
    for call in calls:
        call_pks.add(call.pk)
        child = getattr(call, "child_chat", None) if with_children else None
        entry = CallEntry(call, _pretty_json(call.arguments), results.get(call.pk), child)
        if call.original_arguments is not None:
            entry.original_arguments = _pretty_json(call.original_arguments)
        if child is not None and url_for_chat is not None:
            entry.child_url = url_for_chat(child.pk)
        if call.state == ToolCallState.WAITING and call.pk not in results:
            if call.wait_reason == "approval":
                timeline.pending_approvals += 1
            elif call.wait_reason == "question":
                timeline.pending_questions += 1
            if url_for_decision is not None and call.wait_reason in ("approval", "question"):
                entry.decide_url = url_for_decision(call)
        calls_by_message[call.message_id].append(entry)

    for row in rows:
        if row.tool_call_id in call_pks:
            continue  # a tool result is shown under the call it answers
        timeline.entries.append(
            Entry(
                row,
                calls_by_message.get(row.pk, []),
                usage_by_message.get(row.pk),
                _pretty_json(row.parsed) if row.parsed is not None else "",
            )
        )
    _add_recalls(timeline.entries)
    timeline.superseded_count = sum(
        1 for row in rows if getattr(row, "superseded_at", None) is not None
    )
    _collapse_superseded(timeline.entries)
    return timeline


def _add_recalls(entries: list[Entry]) -> None:
    """The memories each answer was given, with their text: one more query, only for a chat
    whose answers recalled any."""
    recalls = {
        id(entry): [item for item in entry.message.recall if isinstance(item, dict)]
        for entry in entries
        if getattr(entry.message, "recall", None)
    }
    if not recalls:
        return
    ids: set[Any] = {item.get("id") for items in recalls.values() for item in items}
    texts: dict[Any, str] = dict(Memory.objects.filter(pk__in=ids).values_list("pk", "text"))
    for entry in entries:
        for item in recalls.get(id(entry), []):
            memory_id = item.get("id")
            similarity = float(item.get("similarity") or 0)
            entry.recall.append(RecallEntry(memory_id, similarity, texts.get(memory_id, "")))


def _collapse_superseded(entries: list[Entry]) -> None:
    """Mark where each run of superseded messages (an edit, a regenerated answer) opens and
    closes, so the page folds them away."""
    first: Entry | None = None
    for index, entry in enumerate(entries):
        if getattr(entry.message, "superseded_at", None) is None:
            continue
        first = first or entry
        first.opens_superseded += 1
        following = entries[index + 1] if index + 1 < len(entries) else None
        if following is None or getattr(following.message, "superseded_at", None) is None:
            entry.closes_superseded, first = True, None

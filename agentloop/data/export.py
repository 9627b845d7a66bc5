"""Exporting everything agentloop keeps about one owner as one JSON document.

``export_owner(owner)`` returns the document as a dict; ``write_export(owner, file)`` writes
the same document to a text file a chat at a time, so an owner with many chats never sits
in memory whole. Its shape (``"format": "agentloop.owner-export"``, ``"version": 1``)::

    {"format", "version", "exported_at", "owner": {"id", "username"},
     "chats": [{"id", "title", "model", ..., "parent_id", "configuration": {...},
                "messages": [{"id", "role", "content", ..., "attachments": [...],
                              "tool_calls": [{"id", "call_id", "name", "arguments",
                                              "state", "decision", ...}]}]}],
     "usage": [{"id", "chat_id", "message_id", "model", "input_tokens", "cost", ...}],
     "decisions_on_other_chats": [{"tool_call_id", "chat_id", "name", "decision", ...}],
     "memories": [{"id", "subject", "agent", "text", "metadata", "chat_id", ...}],
     "working_memories": [{"id", "subject", "agent", "text", "updated_at"}],
     "eval_cases": [{"id", "run_id", "run", "model", "source_chat_id", "input", "reference",
                     "answer", "state", "scores", ...}],
     "eval_set_items": [{"eval_set_id", "eval_set", "chat", "turn", "input", "reference"}],
     "totals": {...}}

Subagent chats are listed with the others (``parent_id`` says whose they are). Attachments
are included as stored (``data`` in base64, or their ``url``), or with
``attachments="reference"`` only described: kind, media type, name, size and SHA-256.
Times are ISO 8601, costs decimal strings. Memories are the owner's (by ``owner``, or by
their budget subject's key, as erasure finds them), without their embeddings (numbers
computed from the text, which is there). Eval copies of their turns (docs/evals.md) are
theirs too, as erasure deletes them: the cases replayed from their chats (the turn, the
recorded answer and what each candidate answered, with its scores) and the items of eval
sets taken from their chats.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterator
from datetime import date, datetime
from decimal import Decimal
from typing import Any, Protocol

from django.contrib.auth import get_user_model
from django.db.models import Prefetch, Q
from django.utils import timezone

from ..models.evals import EvalCase, EvalSet
from ..models.memories import Memory, WorkingMemory
from .deletion import ChatModels, owner_pk, subagent_chats

__all__ = ["FORMAT", "VERSION", "export_owner", "write_export"]

FORMAT = "agentloop.owner-export"
VERSION = 1
#: chats read per round of queries (their messages, tool calls and usage with them).
BATCH = 100
ATTACHMENT_MODES = ("include", "reference")

_CHAT_FIELDS = (
    "id", "title", "model", "provider", "state", "stop_reason", "error", "agent_path",
    "agent_inputs", "created_at", "updated_at",
)  # fmt: skip
_CONFIGURATION_FIELDS = (
    "tools", "tool_options", "temperature", "max_output_tokens", "provider_options", "headers",
    "output_schema", "schema_path", "limits", "caching", "thinking", "context_window",
    "compaction", "fallbacks", "trace_context", "inbox",
)  # fmt: skip
_MESSAGE_FIELDS = (
    "id", "role", "content", "status", "is_error", "parsed", "model", "finish_reason",
    "thinking", "provider_data", "created_at", "tool_call_id",
)  # fmt: skip
_MEMORY_FIELDS = (
    "id", "subject", "agent", "text", "metadata", "embedding_model", "dimensions", "chat_id",
    "message_id", "created_at", "updated_at", "expires_at",
)  # fmt: skip
_WORKING_MEMORY_FIELDS = ("id", "subject", "agent", "text", "updated_at")
_EVAL_CASE_FIELDS = (
    "id", "run_id", "position", "source_chat_id", "source_message_id", "input", "reference",
    "state", "answer", "tool_calls", "unmatched_calls", "scores", "score", "cost",
    "input_tokens", "output_tokens", "latency_ms", "error", "finished_at",
)  # fmt: skip
_TOOL_CALL_FIELDS = (
    "id", "call_id", "name", "arguments", "original_arguments", "state", "error",
    "provider_data", "wait_reason", "question", "decision", "decision_reason",
    "decided_by_id", "decided_at", "waiting_since", "started_at", "finished_at", "elicitation",
)  # fmt: skip
_USAGE_FIELDS = (
    "id", "chat_id", "message_id", "provider", "model", "status", "input_tokens",
    "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens", "cost",
    "error", "duration_ms", "created_at",
)  # fmt: skip
_TOTALS = (
    "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens",
    "reasoning_tokens",
)  # fmt: skip


class Writable(Protocol):
    """Where :func:`write_export` writes: a text file, or anything with ``write(str)``."""

    def write(self, text: str, /) -> Any: ...


def export_owner(
    owner: Any, *, attachments: str = "include", chat_model: Any = None, using: str = "default"
) -> dict[str, Any]:
    """Everything agentloop keeps about ``owner`` (a user or its primary key), as a dict of
    JSON values: chats, messages, tool calls with their decisions, usage (see the module
    docstring for the shape). ``attachments``: ``"include"`` or ``"reference"``."""
    parts = _Parts(owner, attachments, chat_model, using)
    document = parts.head()
    document["chats"] = list(parts.chats())
    document["usage"] = list(parts.usage())
    document["decisions_on_other_chats"] = parts.decisions()
    document["memories"] = parts.memories()
    document["working_memories"] = parts.working_memories()
    document["eval_cases"] = parts.eval_cases()
    document["eval_set_items"] = parts.eval_set_items()
    document["totals"] = parts.totals
    return document


def write_export(
    owner: Any,
    out: Writable,
    *,
    attachments: str = "include",
    chat_model: Any = None,
    using: str = "default",
) -> None:
    """Write :func:`export_owner`'s document to ``out`` (a text file), a chat at a time."""
    parts = _Parts(owner, attachments, chat_model, using)
    head = json.dumps(parts.head(), ensure_ascii=False, indent=1)
    out.write(head[:-2] + ',\n "chats": [')  # its closing "}" comes last
    for number, chat in enumerate(parts.chats()):
        out.write(("," if number else "") + "\n  " + _dumps(chat))
    out.write('\n ],\n "usage": [')
    for number, row in enumerate(parts.usage()):
        out.write(("," if number else "") + "\n  " + _dumps(row))
    out.write(f'\n ],\n "decisions_on_other_chats": {_dumps(parts.decisions())},')
    out.write(f'\n "memories": {_dumps(parts.memories())},')
    out.write(f'\n "working_memories": {_dumps(parts.working_memories())},')
    out.write(f'\n "eval_cases": {_dumps(parts.eval_cases())},')
    out.write(f'\n "eval_set_items": {_dumps(parts.eval_set_items())},')
    out.write(f'\n "totals": {_dumps(parts.totals)}\n}}\n')


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class _Parts:
    """The document's parts, read with a bounded number of queries per batch of chats."""

    def __init__(self, owner: Any, attachments: str, chat_model: Any, using: str) -> None:
        if attachments not in ATTACHMENT_MODES:
            raise ValueError(f"attachments must be 'include' or 'reference', not {attachments!r}")
        self.pk = owner_pk(owner)
        self.attachments = attachments
        self.models = ChatModels.of(chat_model)
        self.using = using
        self.chat_pks: list[Any] = []
        self.totals: dict[str, Any] = {}

    def head(self) -> dict[str, Any]:
        user_model = get_user_model()
        user = user_model._default_manager.using(self.using).filter(pk=self.pk).first()
        username = user.get_username() if user is not None else None
        return {
            "format": FORMAT,
            "version": VERSION,
            "exported_at": timezone.now().isoformat(),
            "owner": {"id": _plain(self.pk), "username": username},
        }

    def chats(self) -> Iterator[dict[str, Any]]:
        manager = self.models.chat._default_manager.using(self.using)
        pks = list(manager.filter(owner_id=self.pk).order_by("pk").values_list("pk", flat=True))
        pks += subagent_chats(self.models, pks, self.using)
        self.chat_pks = sorted(pks)
        calls = Prefetch(
            "tool_calls", queryset=self.models.tool_call._default_manager.order_by("id")
        )
        messages = Prefetch(
            "messages",
            queryset=self.models.message._default_manager.order_by("id").prefetch_related(calls),
        )
        for start in range(0, len(self.chat_pks), BATCH):
            batch = manager.filter(pk__in=self.chat_pks[start : start + BATCH]).order_by("pk")
            for chat in batch.prefetch_related(messages):
                yield self._chat(chat)

    def _chat(self, chat: Any) -> dict[str, Any]:
        document = _fields(chat, _CHAT_FIELDS)
        document["parent_id"] = _plain(getattr(chat, "parent_id", None))
        document["parent_tool_call_id"] = _plain(getattr(chat, "parent_tool_call_id", None))
        document["configuration"] = _fields(chat, _CONFIGURATION_FIELDS)
        document["messages"] = [self._message(message) for message in chat.messages.all()]
        return document

    def _message(self, message: Any) -> dict[str, Any]:
        document = _fields(message, _MESSAGE_FIELDS)
        document["attachments"] = [self._attachment(item) for item in message.attachments or []]
        document["tool_calls"] = [
            _fields(call, _TOOL_CALL_FIELDS) for call in message.tool_calls.all()
        ]
        return document

    def _attachment(self, stored: dict[str, Any]) -> dict[str, Any]:
        if self.attachments == "include":
            return dict(stored)
        described = {key: stored.get(key) for key in ("kind", "media_type", "name", "url")}
        data = stored.get("data")
        if data:
            raw = base64.b64decode(data)
            described.update(size=len(raw), sha256=hashlib.sha256(raw).hexdigest())
        return described

    def usage(self) -> Iterator[dict[str, Any]]:
        """The usage rows of the owner and of the chats (after :meth:`chats`), totalled on
        the way into :attr:`totals`."""
        manager = self.models.usage._default_manager.using(self.using)
        rows = manager.filter(owner_id=self.pk) | manager.filter(chat_id__in=self.chat_pks)
        sums = dict.fromkeys(_TOTALS, 0)
        cost, attempts = Decimal(0), 0
        for row in rows.order_by("id").values(*_USAGE_FIELDS).iterator(chunk_size=2000):
            for key in _TOTALS:
                sums[key] += row[key]
            cost += row["cost"] or 0
            attempts += 1
            yield _values(row, _USAGE_FIELDS)
        self.totals = {**sums, "cost": str(cost), "attempts": attempts, "chats": len(self.chat_pks)}

    def decisions(self) -> list[dict[str, Any]]:
        """Calls of other owners' chats this owner decided (without those chats' content)."""
        decided = (
            self.models.tool_call._default_manager.using(self.using)
            .filter(decided_by_id=self.pk)
            .exclude(chat_id__in=self.chat_pks)
            .order_by("id")
            .values("id", "chat_id", "name", "decision", "decision_reason", "decided_at")
        )
        return [
            {"tool_call_id": _plain(row.pop("id")), **_values(row, tuple(row))} for row in decided
        ]

    def memories(self) -> list[dict[str, Any]]:
        """The owner's memories: theirs by ``owner``, or by their subject's key."""
        return self._remembered(Memory, _MEMORY_FIELDS)

    def working_memories(self) -> list[dict[str, Any]]:
        """The owner's working memories, found as their memories are."""
        return self._remembered(WorkingMemory, _WORKING_MEMORY_FIELDS)

    def _remembered(self, model: Any, fields: tuple[str, ...]) -> list[dict[str, Any]]:
        subject = f"{get_user_model()._meta.label_lower}:{self.pk}"  # budgets.owner_subject's
        rows = (
            model._default_manager.using(self.using)
            .filter(Q(owner_id=self.pk) | Q(subject=subject))
            .order_by("id")
            .values(*fields)
        )
        return [_values(row, fields) for row in rows]

    def eval_cases(self) -> list[dict[str, Any]]:
        """The eval cases replayed from the owner's chats (after :meth:`chats`): each with
        its run's name and model (a case's scores say what the run thought of the answer)."""
        found: list[dict[str, Any]] = []
        manager = EvalCase._default_manager.using(self.using)
        for start in range(0, len(self.chat_pks), BATCH):
            rows = (
                manager.filter(source_chat_id__in=self.chat_pks[start : start + BATCH])
                .order_by("id")
                .values(*_EVAL_CASE_FIELDS, "run__name", "run__model")
            )
            for row in rows:
                case = _values(row, _EVAL_CASE_FIELDS)
                found.append({**case, "run": row["run__name"], "model": row["run__model"]})
        return sorted(found, key=lambda case: case["id"])

    def eval_set_items(self) -> list[dict[str, Any]]:
        """The items of eval sets taken from the owner's chats (after :meth:`chats`)."""
        mine = set(self.chat_pks)
        if not mine:
            return []
        found = []
        sets = EvalSet._default_manager.using(self.using).order_by("id")
        for eval_set in sets.only("id", "name", "items"):
            for item in eval_set.items:
                if item.get("chat") in mine:
                    found.append(
                        {"eval_set_id": eval_set.pk, "eval_set": eval_set.name}
                        | {key: item.get(key) for key in ("chat", "turn", "input", "reference")}
                    )
        return found


def _fields(row: Any, names: tuple[str, ...]) -> dict[str, Any]:
    return {name: _plain(getattr(row, name, None)) for name in names}


def _values(row: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    return {name: _plain(row[name]) for name in names}


def _plain(value: Any) -> Any:
    """A JSON value: times in ISO 8601, decimals as strings, other keys as they are."""
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, int | float | str | bool | list | dict) or value is None:
        return value
    return str(value)  # a UUID primary key, and the like

"""The chat row a store keeps: the chat, its model's related models and compiled statements,
its database, and the rows built for its messages and usage (``ChatRow``). Every other part of
``DjangoStore`` reads the chat through it."""

from __future__ import annotations

from typing import Any

from ..agents.subagents import has_children
from ..engine import UsageRecord
from ..engine.store import Tracing
from ..messages import Message
from .instances import instances
from .sql import PreparedInsert, PreparedSelect, PreparedUpdate
from .transcript_reads import TranscriptRead, TranscriptReads
from .transcript_rows import JSON_COLUMNS, transcript_query

__all__ = ["ChatRow", "outcomes_json", "transcript_read", "transcript_select"]


def outcomes_json(outcomes: list[Any]) -> list[dict[str, Any]]:
    """Guardrail outcomes as a JSON column holds them (defaults left out)."""
    return [outcome.model_dump(mode="json", exclude_defaults=True) for outcome in outcomes]


class _Models:
    """What a chat model brings, worked out once per process (not per chat object): its
    message, tool-call and usage models, and the statements compiled for them."""

    def __init__(self, chat_model: Any) -> None:
        # A project's own chat model brings its own message models: find them by relation.
        meta: Any = chat_model._meta
        self.chat_model = chat_model
        self.message_model: Any = meta.get_field("messages").related_model
        self.tool_call_model: Any = meta.get_field("tool_calls").related_model
        self.usage_model: Any = meta.get_field("usage_records").related_model
        #: their instances, built without Django's per-field calls (``instances``).
        self.messages = instances(self.message_model)
        self.tool_calls = instances(self.tool_call_model)
        self.usages = instances(self.usage_model)
        self.has_children = has_children(chat_model)
        #: chats can wait in a provider batch (agentloop.models.Chat): that is a run too.
        self.has_batches = any(field.name == "batch_items" for field in meta.get_fields())
        self.message_insert = PreparedInsert(self.message_model)
        self.usage_insert = PreparedInsert(self.usage_model)
        # Moving a call to running, only from the state it was read in and while the lease
        # holds: the claim that makes a tool run at most once per take of the lease.
        self.start_call = PreparedUpdate(
            self.tool_call_model,
            ("state", "started_at"),
            (("id", "="), ("state", "=")),
            guard=(chat_model, "id", "lease_token"),
        )
        # ... with what tool guardrails decided (and the arguments, which one may replace).
        self.start_guarded_call = PreparedUpdate(
            self.tool_call_model,
            ("state", "started_at", "arguments", "guardrails"),
            (("id", "="), ("state", "=")),
            guard=(chat_model, "id", "lease_token"),
        )
        self.finish_call = PreparedUpdate(
            self.tool_call_model, ("state", "error", "finished_at"), (("id", "="),)
        )
        self._transcripts: dict[str, TranscriptReads] = {}
        self._flags: dict[str, PreparedSelect] = {}

    def transcript(self, using: str) -> TranscriptReads:
        """The transcript's reads on database ``using`` (its SELECT compiled once)."""
        reads = self._transcripts.get(using)
        if reads is None:
            queryset = transcript_query(self.message_model, 0).using(using)
            select = PreparedSelect(queryset, raw_columns=JSON_COLUMNS)
            if list(select.params) != [0]:  # pragma: no cover - Django compiles it so today
                raise RuntimeError("the transcript query takes more than the chat's key")
            reads = self._transcripts[using] = TranscriptReads(self.message_model, select)
        return reads

    def cancel_flag(self, using: str) -> PreparedSelect:
        """The chat's cancel flag and halt reason, compiled once; its parameter is the key."""
        select = self._flags.get(using)
        if select is None:
            rows = self.chat_model._base_manager.using(using).filter(pk=0).order_by()
            queryset = rows.values_list("cancel_requested_at", "halt_reason")[:1]
            select = self._flags[using] = PreparedSelect(queryset)
        return select


_MODELS: dict[Any, _Models] = {}


def transcript_select(chat_model: Any, using: str) -> PreparedSelect:
    """The plain transcript SELECT of a chat model's chats (its only parameter: the chat's key)."""
    return _models(chat_model).transcript(using).select


def transcript_read(chat_model: Any, using: str, chat_pk: Any) -> TranscriptRead:
    """The next read of a chat's transcript (for a job to send with its claim)."""
    return _models(chat_model).transcript(using).read(chat_pk)


def _models(chat_model: Any) -> _Models:
    models = _MODELS.get(chat_model)
    if models is None:
        models = _MODELS[chat_model] = _Models(chat_model)
    return models


class ChatRow(Tracing):
    """One chat row: its models (worked out once per process), its database, and the rows
    built for it. It holds the chat object every part of the store sees."""

    def __init__(self, chat: Any) -> None:
        self.chat = chat
        self.chat_model: Any = type(chat)
        self.models = _models(self.chat_model)

    @property
    def db(self) -> str:
        """The chat's database alias (read each time: saving the chat may set it)."""
        return self.chat._state.db or "default"

    def saved(self) -> Any:
        """The chat, saved first if it never was."""
        if self.chat.pk is None:
            self.chat.save()
        return self.chat

    def update(self, **values: Any) -> None:
        """Set the chat's columns ``values`` in the row and on the chat object."""
        self.chat_model.objects.filter(pk=self.chat.pk).update(**values)
        for field, value in values.items():
            setattr(self.chat, field, value)

    def transcript_read(self) -> TranscriptRead:
        """The next read of the chat's transcript (alone, or with the claim where one round
        trip can do both)."""
        return self.models.transcript(self.db).read(self.chat.pk)

    def message_row(self, message: Message, **extra: Any) -> Any:
        """A message model instance for ``message`` (not saved)."""
        return self.models.messages.new(
            {
                "chat": self.saved(),
                "role": message.role,
                "content": message.content,
                "status": message.status,
                "is_error": message.is_error,
                "parsed": message.parsed,
                "model": message.model or "",
                "finish_reason": message.finish_reason or "",
                "thinking": message.thinking,
                "provider_data": message.provider_data,
                "attachments": [
                    attachment.model_dump(mode="json", exclude_none=True)
                    for attachment in message.attachments
                ]
                if message.attachments
                else [],
                "guardrails": outcomes_json(message.guardrails) if message.guardrails else [],
                "recall": message.recall,
                **extra,
            }
        )

    def usage_row(self, usage: UsageRecord, message: Any = None) -> Any:
        """A usage model instance for ``usage`` (not saved)."""
        counts = usage.usage
        return self.models.usages.new(
            {
                "chat_id": self.chat.pk,
                "message": message,
                "owner_id": self.chat.owner_id,
                "provider": usage.provider,
                "model": usage.model,
                "status": usage.status,
                "input_tokens": counts.input_tokens,
                "output_tokens": counts.output_tokens,
                "cache_read_tokens": counts.cache_read_tokens,
                "cache_write_tokens": counts.cache_write_tokens,
                "reasoning_tokens": counts.reasoning_tokens,
                "cost": usage.cost,
                "error": usage.error,
                "duration_ms": usage.duration_ms,
            }
        )

    # -- tracing: the chat's own columns -------------------------------------------------
    def trace_names(self) -> tuple[str, str]:
        path = self.chat.agent_path
        return str(self.chat.pk or ""), path.rsplit(".", 1)[-1] if path else ""

    def trace_context(self) -> dict[str, str]:
        return self.chat.trace_context or {}

    def set_trace_context(self, carrier: dict[str, str]) -> None:
        self.update(trace_context=carrier)

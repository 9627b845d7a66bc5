"""The Django store: a chat's transcript, usage and cancel flag in the database.

Queries per verb don't grow with the history: the transcript is one SELECT
(messages joined with their tool calls, no model instances: see ``transcript_rows``), and
each write is a short transaction in the order DESIGN §2 gives (answer + its tool calls +
usage together; each tool result on its own).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, connections, transaction
from django.db.models import Q, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from ..engine import ChatConfig, ChatStore, UsageRecord
from ..exceptions import ConcurrentWriteError
from ..messages import Message, MessageStatus, ToolCall, ToolCallState
from ..tools import Tool, load_tool, tool_reference
from .rows import JSON_COLUMNS, messages_from_rows, transcript_query
from .sql import PreparedInsert, PreparedSelect

if TYPE_CHECKING:
    from .._leases import Lease
    from ..models import AbstractChat

__all__ = ["DjangoStore"]

# ChatConfig field -> chat column
_CONFIG_COLUMNS = {
    "model": "model",
    "provider": "provider",
    "tool_paths": "tools",
    "tool_options": "tool_options",
    "temperature": "temperature",
    "max_output_tokens": "max_output_tokens",
    "provider_options": "provider_options",
    "headers": "headers",
    "output_schema": "output_schema",
    "schema_path": "schema_path",
    "limits": "limits",
}


_INSERTERS: dict[Any, PreparedInsert] = {}


def _inserter(model: Any) -> PreparedInsert:
    inserter = _INSERTERS.get(model)
    if inserter is None:
        inserter = _INSERTERS[model] = PreparedInsert(model)
    return inserter


class DjangoStore(ChatStore):
    """Keeps one chat row's transcript; the models come from its related managers."""

    def __init__(self, chat: AbstractChat) -> None:
        self.chat = chat
        # A project's own chat model brings its own message models: find them by relation.
        meta: Any = chat._meta
        self.message_model: Any = meta.get_field("messages").related_model
        self.tool_call_model: Any = meta.get_field("tool_calls").related_model
        self.usage_model: Any = meta.get_field("usage_records").related_model
        self.chat_model: Any = type(chat)
        self._has_children = any(field.name == "parent" for field in meta.get_fields())
        self._tools: tuple[tuple[str, ...], list[type[Tool]]] | None = None
        self._queries: dict[str, tuple[tuple[str, Any], Any]] = {}
        self._config: ChatConfig | None = None
        self._running_elsewhere = False
        self._message_insert = _inserter(self.message_model)
        self._usage_insert = _inserter(self.usage_model)
        #: set by a background worker: every write then happens only while the lease is ours.
        self.lease: Lease | None = None
        from .._cancel_notices import listen_locally

        self.cancel_notice = listen_locally(chat)

    @contextmanager
    def _writing(self, *, atomic: bool = True) -> Iterator[None]:
        """A write. Under a lease it is always a transaction that first renews the lease,
        so a worker that lost its chat writes nothing; else a transaction if ``atomic``."""
        if self.lease is None and not atomic:
            yield
            return
        with transaction.atomic(using=self._db):
            if self.lease is not None:
                self.lease.ensure()
            yield

    def _saved_chat(self) -> Any:
        if self.chat.pk is None:
            self.chat.save()
        return self.chat

    # -- configuration -------------------------------------------------------------------
    def get_config(self) -> ChatConfig:
        # Changes made here go through update_config, which drops the cache; a chat row
        # changed by another process is seen by loading the chat again, as with any model.
        if self._config is None:
            self._config = self._read_config()
        return self._config

    def _read_config(self) -> ChatConfig:
        chat = self.chat
        return ChatConfig.model_validate(
            {
                "model": chat.model,
                "provider": chat.provider or None,
                "tool_paths": chat.tools or [],
                "tool_options": chat.tool_options or {},
                "temperature": chat.temperature,
                "max_output_tokens": chat.max_output_tokens,
                "provider_options": chat.provider_options or {},
                "headers": chat.headers or {},
                "output_schema": chat.output_schema,
                "schema_path": chat.schema_path or None,
                "limits": chat.limits or {},
            }
        )

    def update_config(self, **changes: Any) -> None:
        self._config = None
        columns = []
        for field, value in changes.items():
            column = _CONFIG_COLUMNS[field]
            if hasattr(value, "model_dump"):
                value = value.model_dump(mode="json", exclude_none=True)
            if value is None and column in {"provider", "schema_path"}:
                value = ""
            setattr(self.chat, column, value)
            columns.append(column)
        if self.chat.pk is None:
            self.chat.save()
        else:
            self.chat.save(update_fields=[*columns, "updated_at"])

    def set_tools(self, tools: list[Any]) -> None:
        paths = [tool_reference(tool) for tool in tools]
        self.update_config(tool_paths=paths)
        self._tools = (tuple(paths), list(tools))

    def get_tools(self) -> list[type[Tool]]:
        paths = tuple(self.chat.tools or ())
        if self._tools is None or self._tools[0] != paths:
            # The chat row names its tools; any process can load them again.
            self._tools = (paths, [load_tool(path) for path in paths])
        return self._tools[1]

    # -- transcript ----------------------------------------------------------------------
    # Building these querysets (resolving 18 columns across two joins) costs more than running
    # them on a short chat, so each is built once per chat and cloned for every read.
    def _query(self, name: str, build: Callable[[], Any]) -> list[Any]:
        """Rows of a query compiled once per chat (see agentloop.django_store.sql)."""
        key = (name, self.chat.pk)
        cached = self._queries.get(name)
        if cached is None or cached[0] != key:
            raw = JSON_COLUMNS if name == "transcript" else frozenset()
            cached = self._queries[name] = (key, PreparedSelect(build(), raw_columns=raw))
        rows: list[Any] = cached[1].rows()
        return rows

    def _transcript_query(self) -> Any:
        return transcript_query(self.message_model, self.chat.pk)

    def _cancel_query(self) -> Any:
        # At most one row (by primary key): no ORDER BY/LIMIT as .first() would add.
        return (
            self.chat_model.objects.filter(pk=self.chat.pk)
            .order_by()
            .values_list("cancel_requested_at", flat=True)
        )

    def load_transcript(self) -> list[Message]:
        return self.read_for_step()[0]

    def read_for_step(self) -> tuple[list[Message], datetime | None]:
        # One query: the transcript, each row carrying the chat's cancel flag.
        if self.chat.pk is None:
            return [], None
        rows = self._query("transcript", self._transcript_query)
        if not rows:
            self._running_elsewhere = False
            return [], self.cancel_requested_at()
        messages = messages_from_rows(rows)
        # The last three columns: the chat's lease token, lease expiry and cancel flag.
        token, expires = rows[-1][-3], rows[-1][-2]
        own = self.lease.token if self.lease is not None else ""
        self._running_elsewhere = bool(
            token and token != own and expires is not None and expires > timezone.now()
        )
        return messages, rows[-1][-1]

    def running_elsewhere(self) -> bool:
        return self._running_elsewhere

    def turn_started_at(self, message: Message) -> datetime | None:
        if message.created_at is not None or message.key is None:
            return message.created_at
        value: datetime | None = (
            self.message_model.objects.filter(pk=message.key)
            .values_list("created_at", flat=True)
            .first()
        )
        return value

    def _message_row(self, message: Message, **extra: Any) -> Any:
        return self.message_model(
            chat=self._saved_chat(),
            role=message.role,
            content=message.content,
            status=message.status,
            is_error=message.is_error,
            parsed=message.parsed,
            model=message.model or "",
            finish_reason=message.finish_reason or "",
            provider_data=message.provider_data,
            attachments=[
                attachment.model_dump(mode="json", exclude_none=True)
                for attachment in message.attachments
            ],
            **extra,
        )

    def append_message(self, message: Message) -> Any:
        record = self._message_row(message)
        clear_stop = message.role == "user" and (
            self.chat.stop_reason or self.chat.state == "stopped"
        )
        with self._writing(atomic=bool(clear_stop)):
            self._message_insert.insert(record, self._db)
            if clear_stop:
                self._update_chat(stop_reason="", state="idle")
        return record

    @property
    def _db(self) -> str:
        return self.chat._state.db or "default"

    def _update_chat(self, **values: Any) -> None:
        self.chat_model.objects.filter(pk=self.chat.pk).update(**values)
        for field, value in values.items():
            setattr(self.chat, field, value)

    def replace_instructions(self, text: str) -> None:
        system = self.message_model.objects.filter(chat_id=self._saved_chat().pk, role="system")
        with self._writing():
            first = system.order_by("id").values_list("pk", flat=True).first()
            if first is None:
                self._message_row(Message(role="system", content=text)).save()
                return
            # The first system message keeps its place (first, normally) and takes the text.
            system.filter(pk=first).update(content=text)
            system.exclude(pk=first).delete()

    def save_partial(self, content: str, partial_key: Any, model: str) -> Any:
        with self._writing(atomic=False):
            if partial_key is not None:
                self.message_model.objects.filter(pk=partial_key).update(content=content)
                return partial_key
            record = self._message_row(
                Message(
                    role="assistant", content=content, status=MessageStatus.PARTIAL, model=model
                )
            )
            record.save()
            return record.pk

    def _usage_row(self, usage: UsageRecord, message: Any = None) -> Any:
        return self.usage_model(
            chat_id=self.chat.pk,
            message=message,
            owner_id=self.chat.owner_id,
            provider=usage.provider,
            model=usage.model,
            status=usage.status,
            input_tokens=usage.usage.input_tokens,
            output_tokens=usage.usage.output_tokens,
            cached_tokens=usage.usage.cached_tokens,
            reasoning_tokens=usage.usage.reasoning_tokens,
            cost=usage.cost,
            error=usage.error,
            duration_ms=usage.duration_ms,
        )

    def save_answer(self, message: Message, usage: UsageRecord, partial_key: Any = None) -> Any:
        with self._writing():
            record = self._message_row(message)
            if partial_key is not None:
                # The streamed partial becomes the finished answer, keeping its place.
                record.pk = partial_key
                record.save(force_update=True)
            else:
                self._message_insert.insert(record, self._db)
            if message.tool_calls:
                self.tool_call_model.objects.bulk_create(
                    [
                        self.tool_call_model(
                            chat_id=self.chat.pk,
                            message=record,
                            call_id=call.id,
                            name=call.name,
                            arguments=call.arguments,
                            state=call.state,
                            provider_data=call.provider_data,
                        )
                        for call in message.tool_calls
                    ]
                )
            self._usage_insert.insert(self._usage_row(usage, record), self._db)
            if self.chat.stop_reason:
                # The turn goes on (limits were raised): it is no longer stopped.
                self._update_chat(stop_reason="", state="running" if self.lease else "idle")
        return record

    def record_usage(self, usage: UsageRecord) -> None:
        with self._writing(atomic=False):
            self._usage_insert.insert(self._usage_row(usage), self._db)

    def mark_tool_running(self, call: ToolCall) -> None:
        with self._writing(atomic=False):
            self.tool_call_model.objects.filter(pk=call.key).update(
                state=ToolCallState.RUNNING, started_at=timezone.now()
            )

    def save_tool_result(
        self, call: ToolCall, message: Message, state: ToolCallState, error: str | None
    ) -> Any:
        try:
            with self._writing():
                record = self._message_row(message, tool_call_id=call.key)
                self._message_insert.insert(record, self._db)
                self.tool_call_model.objects.filter(pk=call.key).update(
                    state=state, error=error or "", finished_at=timezone.now()
                )
        except IntegrityError as exc:
            raise ConcurrentWriteError(
                f"Tool call {call.id!r} ({call.name}) already has a result: "
                "another process answered it first."
            ) from exc
        return record

    def mark_tool_waiting(self, call: ToolCall, reason: str, question: str | None = None) -> None:
        with self._writing(atomic=False):
            self.tool_call_model.objects.filter(pk=call.key).update(
                state=ToolCallState.WAITING, wait_reason=reason, question=question or ""
            )

    def record_decision(
        self, call: ToolCall, decision: str, *, by: Any, reason: str, result: Message | None
    ) -> Any:
        fields: dict[str, Any] = {
            "decision": decision,
            "decision_digest": call.arguments_digest(),
            "decision_reason": reason,
            "decided_by_id": getattr(by, "pk", None),
            "decided_at": timezone.now(),
        }
        with self._writing():
            if result is None:  # approved: the call runs at the next step
                self.tool_call_model.objects.filter(pk=call.key).update(
                    state=ToolCallState.PENDING, **fields
                )
                return None
            self.tool_call_model.objects.filter(pk=call.key).update(**fields)
            state = ToolCallState.SUCCEEDED if decision == "answered" else ToolCallState.FAILED
            return self.save_tool_result(call, result, state, None)

    def native_message(self, message: Message) -> Any:
        return self.message_model.objects.get(pk=message.key)

    def native_tool_call(self, call: ToolCall) -> Any:
        return self.tool_call_model(
            pk=call.key,
            chat_id=self.chat.pk,
            call_id=call.id,
            name=call.name,
            arguments=call.arguments,
            state=call.state,
            wait_reason=call.wait_reason or "",
            question=call.question or "",
            decision=call.decision or "",
        )

    # -- cancellation and stopping ----------------------------------------------------------
    def cancel_requested_at(self) -> datetime | None:
        if self.chat.pk is None:
            return None
        rows = self._query("cancel", self._cancel_query)
        value: datetime | None = rows[0][0] if rows else None
        return value

    def request_cancel(self) -> None:
        # Keep the first request's time: clearing compares against it.
        pk = self._saved_chat().pk
        targets = Q(pk=pk)
        if self._has_children:
            # Running subagents stop too, in the same single UPDATE.
            # (in the background: queued or running; in this process: their parent's call runs)
            targets |= Q(parent_id=pk) & (
                Q(state__in=["queued", "running"]) | Q(parent_tool_call__state="running")
            )
        self.chat_model.objects.filter(targets).update(
            cancel_requested_at=Coalesce("cancel_requested_at", timezone.now())
        )
        from .._cancel_notices import notify

        notify(self.chat)

    def record_cancellation(
        self,
        requested_at: datetime | None,
        *,
        partial: Message | None,
        partial_key: Any,
        usage: UsageRecord | None,
        unanswered: list[ToolCall],
    ) -> None:
        with self._writing():
            flag = self.chat_model.objects.filter(pk=self.chat.pk)
            if requested_at is not None:
                # A cancel requested after the one we saw stays for the next run.
                flag = flag.filter(cancel_requested_at__lte=requested_at)
            flag.update(cancel_requested_at=None)
            message = None
            if partial is not None:
                message = self._message_row(partial.model_copy(update={"status": "cancelled"}))
                if partial_key is not None:
                    message.pk = partial_key
                    message.save(force_update=True)
                else:
                    message.save()
            elif partial_key is not None:
                self.message_model.objects.filter(pk=partial_key).update(status="cancelled")
            if usage is not None:
                self._usage_row(usage, message).save()
            if unanswered:
                self.tool_call_model.objects.filter(
                    pk__in=[call.key for call in unanswered]
                ).update(state=ToolCallState.CANCELLED)
        self.chat.cancel_requested_at = None

    def record_stop(self, reason: str) -> None:
        with self._writing(atomic=False):
            self._update_chat(stop_reason=reason[:300], state="stopped")

    def turn_cost(self, since: datetime) -> Decimal:
        total = self.usage_model.objects.filter(chat_id=self.chat.pk, created_at__gte=since)
        value = total.aggregate(total=Sum("cost", default=Decimal(0)))["total"]
        return Decimal(value)

    # -- threads -----------------------------------------------------------------------------
    def wrap_thread(self, function: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            try:
                return function()
            finally:
                # A tool thread that used the ORM opened its own connections.
                connections.close_all()

        return run

"""The Django store: a chat's transcript, usage and cancel flag in the database.

Queries per verb don't grow with the history: the transcript is one SELECT
(messages joined with their tool calls, no model instances: see ``transcript_rows``), and
each write is a short transaction in the order docs/design.md §2 gives (answer + its tool calls +
usage together; each tool result on its own).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime
from decimal import Decimal
from functools import partial
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import connections
from django.db.models import Sum

from ..agents.subagents import has_children
from ..engine import ChatConfig, ChatStore, UsageRecord
from ..exceptions import LeaseLostError
from ..messages import Message, MessageStatus
from ..process.cancel_notices import listen_locally
from ..tool_refs import load_tool, tool_reference
from ..tools import Tool
from .claims import ClaimMixin
from .leases import UNREAD
from .reconnect import committed_message, retried
from .rows import JSON_COLUMNS, held_calls, messages_from_rows, transcript_query
from .sql import PreparedInsert, PreparedSelect, PreparedUpdate
from .stopping import Stopping
from .tool_calls import ToolCallRows
from .waiting import release_connection
from .writes import OneStatementWrites

__all__ = ["DjangoStore"]

T = TypeVar("T")

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
    "caching": "caching",
    "thinking": "thinking",
    "context_window": "context_window",
    "compaction": "compaction",
    "fallbacks": "fallbacks",
}


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
        self.finish_call = PreparedUpdate(
            self.tool_call_model, ("state", "error", "finished_at"), (("id", "="),)
        )
        self._transcripts: dict[str, PreparedSelect] = {}
        self._flags: dict[str, PreparedSelect] = {}

    def transcript(self, using: str) -> PreparedSelect:
        """The transcript's SELECT, compiled once; its only parameter is the chat's key."""
        select = self._transcripts.get(using)
        if select is None:
            queryset = transcript_query(self.message_model, 0).using(using)
            select = self._transcripts[using] = PreparedSelect(queryset, raw_columns=JSON_COLUMNS)
            if list(select.params) != [0]:  # pragma: no cover - Django compiles it so today
                raise RuntimeError("the transcript query takes more than the chat's key")
        return select

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
    """The transcript SELECT of a chat model's chats (for a job to read with its claim)."""
    return _models(chat_model).transcript(using)


#: tool classes by the chat's tool references, for every chat of this process.
_LOADED_TOOLS: dict[tuple[str, ...], list[type[Tool]]] = {}


def _models(chat_model: Any) -> _Models:
    models = _MODELS.get(chat_model)
    if models is None:
        models = _MODELS[chat_model] = _Models(chat_model)
    return models


class DjangoStore(ClaimMixin, OneStatementWrites, ToolCallRows, Stopping, ChatStore):
    """Keeps one chat row's transcript; the models come from its related managers."""

    def __init__(self, chat: Any, *, send_next: Callable[[], None] | None = None) -> None:
        """``chat``: a row of a model built on ``AbstractChat``. ``send_next`` sends the
        chat's next background job: the store calls it when a verb run in-process (or a
        message queued to a free chat) leaves the chat queued for the background. The store
        sends nothing itself: its owner knows the runners."""
        self.chat = chat
        self.send_next = send_next
        self.chat_model: Any = type(chat)
        models = self.models = _models(self.chat_model)
        self.message_model = models.message_model
        self.tool_call_model = models.tool_call_model
        self.usage_model = models.usage_model
        self._tools: tuple[tuple[str, ...], list[type[Tool]]] | None = None
        self._config: ChatConfig | None = None
        #: the cancel flag read by the last write's lease renewal (a free checkpoint read).
        self._flag_after_write: Any = UNREAD

        self.cancel_notice = listen_locally(chat)

    @contextmanager
    def _writing(self, *, release: str | None = None) -> Iterator[None]:
        """A write transaction. Under a lease it first renews the lease (its row lock makes a
        would-be taker wait; a process that lost the chat writes nothing); with ``release``
        (the next move) the same first statement releases it instead."""
        lease = self.lease
        if lease is not None and lease.lost.is_set():
            raise LeaseLostError(f"The lease on chat {self.chat.pk} was lost.")
        self._prefetched = None  # a transcript read with the claim is stale after a write
        with ExitStack() as stack:
            # The lease's statement comes first: a connection that dropped meanwhile (a long
            # tool, a stream) fails there, before anything of the transaction is written,
            # so it opens again on a new connection while the lease is valid.
            released = retried(lease, self._db, lambda: self._begin_write(stack, release))
            yield
        if released is not None:
            self._released(*released)

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
                "caching": chat.caching,
                "thinking": chat.thinking,
                "context_window": chat.context_window,
                "compaction": chat.compaction,
                "fallbacks": chat.fallbacks or [],
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
            # The chat row names its tools; any process can load them again. Loaded once per
            # process (an agent tool builds its schema), not once per chat object.
            tools = _LOADED_TOOLS.get(paths)
            if tools is None:
                if len(_LOADED_TOOLS) >= 512:
                    _LOADED_TOOLS.clear()
                tools = _LOADED_TOOLS[paths] = [load_tool(path) for path in paths]
            self._tools = (paths, tools)
        return self._tools[1]

    # -- transcript ----------------------------------------------------------------------
    def load_transcript(self) -> list[Message]:
        return self.read_for_step()[0]

    def read_for_step(self) -> tuple[list[Message], datetime | None]:
        # One query for the transcript; the cancel flag comes from the claim's read of the chat
        # row just before (or from a query of its own when no verb holds the chat).
        if self.chat.pk is None:
            return [], None
        select = self.models.transcript(self._db)
        prefetched, self._prefetched = self._prefetched, None
        if prefetched is None:
            rows = retried(self.lease, self._db, lambda: select.rows([self.chat.pk]))
        else:
            rows = select.convert(prefetched)
        messages = messages_from_rows(rows)
        if self.lease is not None:
            self._held_calls = held_calls(messages)
        return messages, self.cancel_requested_at()

    def _prefetch(self) -> tuple[str, list[Any]]:
        """The transcript's SELECT, to read with the claim where one round trip can do both."""
        return self.models.transcript(self._db).sql, [self.chat.pk]

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
            thinking=message.thinking,
            provider_data=message.provider_data,
            attachments=[
                attachment.model_dump(mode="json", exclude_none=True)
                for attachment in message.attachments
            ],
            **extra,
        )

    def append_message(self, message: Message) -> Any:
        values: dict[str, Any] = {}
        if message.role == "user":
            # A new turn: it is no longer stopped, and never inherits an earlier cancel.
            if self.chat.cancel_requested_at is not None:
                values.update(cancel_requested_at=None)
            if self.chat.stop_reason or self.chat.state in ("stopped", "failed"):
                values.update(cancel_requested_at=None, stop_reason="", state="idle", error="")
            if self.chat.halt_reason:
                values.update(cancel_requested_at=None, halt_reason="")
        writes = self._step_writes()
        if writes is not None and not values:
            return self._append_at_once(writes, message)  # one statement, the lease's guard first
        record = self._message_row(message)
        with self._writing():
            self.models.message_insert.insert(record, self._db)
            if values:
                self._update_chat(**values)
        message.key = record.pk
        return record

    def _update_chat(self, **values: Any) -> None:
        self.chat_model.objects.filter(pk=self.chat.pk).update(**values)
        for field, value in values.items():
            setattr(self.chat, field, value)

    def trace_names(self) -> tuple[str, str]:
        path = self.chat.agent_path
        return str(self.chat.pk or ""), path.rsplit(".", 1)[-1] if path else ""

    def trace_context(self) -> dict[str, str]:
        return self.chat.trace_context or {}

    def set_trace_context(self, carrier: dict[str, str]) -> None:
        self._update_chat(trace_context=carrier)

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

    # A stream's writes come often, so a connection may drop in the middle of one: each is
    # tried again as a whole (an update is the same twice; an insert is looked for first).
    def save_partial(self, content: str, partial_key: Any, model: str) -> Any:
        if partial_key is not None:

            def update() -> Any:
                with self._writing():
                    self.message_model.objects.filter(pk=partial_key).update(content=content)
                return partial_key

            return retried(self.lease, self._db, update)
        record = self._message_row(
            Message(role="assistant", content=content, status=MessageStatus.PARTIAL, model=model)
        )

        def insert() -> Any:
            with self._writing():
                record.save()
            return record.pk

        landed = partial(committed_message, record, self.chat.pk, self._db)
        return retried(self.lease, self._db, insert, landed=landed)

    def fail_partial(self, partial_key: Any) -> None:
        def update() -> None:
            with self._writing():
                rows = self.message_model.objects.filter(pk=partial_key)
                rows.update(status=MessageStatus.FAILED)

        retried(self.lease, self._db, update)

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
            cache_read_tokens=usage.usage.cache_read_tokens,
            cache_write_tokens=usage.usage.cache_write_tokens,
            reasoning_tokens=usage.usage.reasoning_tokens,
            cost=usage.cost,
            error=usage.error,
            duration_ms=usage.duration_ms,
        )

    def save_answer(
        self,
        message: Message,
        usage: UsageRecord,
        partial_key: Any = None,
        *,
        release: str | None = None,
    ) -> Any:
        writes = self._step_writes()
        if writes is not None and partial_key is None and not self.chat.stop_reason:
            return self._save_answer_at_once(writes, message, usage, release)
        with self._writing(release=release):
            record = self._message_row(message)
            if partial_key is not None:
                # The streamed partial becomes the finished answer, keeping its place.
                record.pk = partial_key
                record.save(force_update=True)
            else:
                self.models.message_insert.insert(record, self._db)
            if message.tool_calls:
                rows = self.tool_call_model.objects.bulk_create(
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
                for call, row in zip(message.tool_calls, rows, strict=True):
                    call.key = row.pk
                if all(row.pk is not None for row in rows):
                    record._agentloop_tool_calls = rows  # the live event's, read no more
            else:
                record._agentloop_tool_calls = []
            self.models.usage_insert.insert(self._usage_row(usage, record), self._db)
            if self.chat.stop_reason:
                # The turn goes on (limits were raised): it is no longer stopped.
                self._update_chat(stop_reason="", state="running" if self.background else "idle")
        message.key = record.pk
        return record

    def record_usage(self, usage: UsageRecord) -> None:
        row = self._usage_row(usage)

        def insert() -> bool:
            with self._writing():
                self.models.usage_insert.insert(row, self._db)
            return True

        def landed() -> bool | None:
            rows = self.usage_model._default_manager.using(self._db)
            found = rows.filter(chat_id=self.chat.pk, created_at=row.created_at).exists()
            return True if found else None

        retried(self.lease, self._db, insert, landed=landed)

    def last_input_tokens(self) -> tuple[Any, int] | None:
        if self.chat.pk is None:
            return None
        row = (
            self.usage_model.objects.filter(
                chat_id=self.chat.pk,
                status="succeeded",
                message__role="assistant",  # a summary's call read other rows
                input_tokens__gt=0,
            )
            .order_by("-id")
            .values_list("message_id", "input_tokens")
            .first()
        )
        return (row[0], row[1]) if row is not None else None

    def native_message(self, message: Message) -> Any:
        return self.message_model.objects.get(pk=message.key)

    def turn_cost(self, since: datetime) -> Decimal:
        total = self.usage_model.objects.filter(chat_id=self.chat.pk, created_at__gte=since)
        value = total.aggregate(total=Sum("cost", default=Decimal(0)))["total"]
        return Decimal(value)

    # -- waiting and threads -----------------------------------------------------------------
    def before_wait(self) -> None:
        # The lease stays (the heartbeat renews it on a connection of its own); the next
        # statement takes a connection again (AGENTLOOP["RELEASE_CONNECTIONS"]).
        release_connection(self._db)

    phases_on_a_thread = True

    async def run_phase(self, function: Callable[..., T], *args: Any) -> T:
        # The ORM blocks: on the one thread Django's own async ORM calls use for this
        # context (a request's thread under ASGI), so a phase sees the verb's connection.
        return await sync_to_async(function, thread_sensitive=True)(*args)

    def wrap_thread(self, function: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            try:
                return function()
            finally:
                # A tool thread that used the ORM opened its own connections.
                connections.close_all()

        return run

"""The Django store's transcript: reading a chat's messages (one SELECT), appending them,
a stream's partial answer, an answer with its tool calls and usage, and the usage rows."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from decimal import Decimal
from functools import partial
from typing import Any

from django.db.models import Sum

from ..budgets.enforcement import ChatBudgets
from ..engine import UsageRecord
from ..engine import store as parts
from ..messages import Message, MessageStatus
from .chat_row import ChatRow, outcomes_json
from .reconnect import committed_message, retried
from .run_control import RunControl
from .transcript_rows import held_calls
from .writes import GUARD, StepWrites, Values, inserted

__all__ = ["Transcript"]


class Transcript(parts.Transcript, parts.Costs):
    """The chat's messages and usage rows, written under ``control``'s claim."""

    def __init__(self, row: ChatRow, control: RunControl, budgets: ChatBudgets) -> None:
        self.row = row
        self.control = control
        #: each usage row's write charges its subjects' budgets (docs/budgets.md).
        self.budgets = budgets
        self.chat = row.chat
        self.models = row.models

    def load_transcript(self) -> list[Message]:
        """The transcript: one query (none when the claim read it on the way)."""
        if self.chat.pk is None:
            return []
        messages = self.control.take_prefetched()
        if messages is None:
            read = self.row.transcript_read()
            # A verb's read (under the lease) may share unchanged messages with the last one.
            run = partial(read.run, shared=self.control.lease is not None)
            messages = retried(self.control.lease, self.row.db, run)
        if self.control.lease is not None:
            self.control.saw_held(held_calls(messages))
        return messages

    def turn_started_at(self, message: Message) -> datetime | None:
        if message.created_at is not None or message.key is None:
            return message.created_at
        value: datetime | None = (
            self.models.message_model.objects.filter(pk=message.key)
            .values_list("created_at", flat=True)
            .first()
        )
        return value

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
        writes = self.control.step_writes()
        if writes is not None and not values:
            return self._append_at_once(writes, message)  # one statement, the lease's guard first
        record = self.row.message_row(message)
        with self.control.writing():
            self.models.message_insert.insert(record, self.row.db)
            if values:
                self.row.update(**values)
        message.key = record.pk
        return record

    def save_guardrails(self, message: Message) -> None:
        judged = {"guardrails": outcomes_json(message.guardrails), "content": message.content,
                  "status": message.status}  # fmt: skip
        writes = self.control.step_writes()
        if writes is not None:  # one statement, the lease's guard first

            def body(guard: str, values: Values) -> str:
                return writes.judged(guard, values, judged, message.key)

            self.control.at_once(writes, None, body, None)
            return
        rows = self.models.message_model.objects.filter(pk=message.key)

        def update() -> None:  # the same twice: tried again as a whole on a dropped connection
            with self.control.writing():
                rows.update(**judged)

        retried(self.control.lease, self.row.db, update)

    def replace_instructions(self, text: str) -> None:
        system = self.models.message_model.objects.filter(
            chat_id=self.row.saved().pk, role="system"
        )
        with self.control.writing():
            first = system.order_by("id").values_list("pk", flat=True).first()
            if first is None:
                self.row.message_row(Message(role="system", content=text)).save()
                return
            # The first system message keeps its place (first, normally) and takes the text.
            system.filter(pk=first).update(content=text)
            system.exclude(pk=first).delete()

    # A stream's writes come often, so a connection may drop in the middle of one: each is
    # tried again as a whole (an update is the same twice; an insert is looked for first).
    def save_partial(self, content: str, partial_key: Any, model: str) -> Any:
        if partial_key is not None:

            def update() -> Any:
                with self.control.writing():
                    self.models.message_model.objects.filter(pk=partial_key).update(content=content)
                return partial_key

            return retried(self.control.lease, self.row.db, update)
        record = self.row.message_row(
            Message(role="assistant", content=content, status=MessageStatus.PARTIAL, model=model)
        )

        def insert() -> Any:
            with self.control.writing():
                record.save()
            return record.pk

        landed = partial(committed_message, record, self.chat.pk, self.row.db)
        return retried(self.control.lease, self.row.db, insert, landed=landed)

    def fail_partial(self, partial_key: Any) -> None:
        def update() -> None:
            with self.control.writing():
                rows = self.models.message_model.objects.filter(pk=partial_key)
                rows.update(status=MessageStatus.FAILED)

        retried(self.control.lease, self.row.db, update)

    def save_answer(
        self,
        message: Message,
        usage: UsageRecord,
        partial_key: Any = None,
        *,
        release: str | None = None,
    ) -> Any:
        writes = self.control.step_writes()
        at_once = partial_key is None and not self.chat.stop_reason
        charge = self.budgets.charge_at_once(usage) if writes is not None else None
        if writes is not None and at_once and (charge or not self.budgets.charges(usage)):
            return self._save_answer_at_once(writes, message, usage, release, charge)
        with self.control.writing(release=release):
            record = self.row.message_row(message)
            if partial_key is not None:
                # The streamed partial becomes the finished answer, keeping its place.
                record.pk = partial_key
                record.save(force_update=True)
            else:
                self.models.message_insert.insert(record, self.row.db)
            if message.tool_calls:
                rows = self.models.tool_call_model.objects.bulk_create(
                    [
                        self.models.tool_call_model(
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
            self.models.usage_insert.insert(self.row.usage_row(usage, record), self.row.db)
            self.budgets.charge(usage)
            if self.chat.stop_reason:
                # The turn goes on (limits were raised): it is no longer stopped. A write
                # that released the chat set its next state already: that one stands.
                if release is None:
                    state = "running" if self.control.background else "idle"
                    self.row.update(stop_reason="", state=state)
                else:
                    self.row.update(stop_reason="")
        message.key = record.pk
        return record

    def record_usage(self, usage: UsageRecord) -> None:
        row = self.row.usage_row(usage)

        def insert() -> bool:
            with self.control.writing():
                self.models.usage_insert.insert(row, self.row.db)
                self.budgets.charge(usage)
            return True

        def landed() -> bool | None:
            rows = self.models.usage_model._default_manager.using(self.row.db)
            found = rows.filter(chat_id=self.chat.pk, created_at=row.created_at).exists()
            return True if found else None

        retried(self.control.lease, self.row.db, insert, landed=landed)

    def last_input_tokens(self) -> tuple[Any, int] | None:
        if self.chat.pk is None:
            return None
        row = (
            self.models.usage_model.objects.filter(
                chat_id=self.chat.pk,
                status="succeeded",
                message__role="assistant",  # a summary's call read other rows
                message__superseded_at__isnull=True,  # no request sends those rows again
                input_tokens__gt=0,
            )
            .order_by("-id")
            .values_list("message_id", "input_tokens")
            .first()
        )
        return (row[0], row[1]) if row is not None else None

    def native_message(self, message: Message) -> Any:
        return self.models.message_model.objects.get(pk=message.key)

    def turn_cost(self, since: datetime) -> Decimal:
        total = self.models.usage_model.objects.filter(chat_id=self.chat.pk, created_at__gte=since)
        value = total.aggregate(total=Sum("cost", default=Decimal(0)))["total"]
        return Decimal(value)

    # -- the one-statement writes (PostgreSQL, under a lease) -----------------------
    def _save_answer_at_once(
        self,
        writes: StepWrites,
        message: Message,
        usage: UsageRecord,
        release: str | None,
        charge: Callable[[Values], list[str]] | None = None,
    ) -> Any:
        record = self.row.message_row(message)
        calls = message.tool_calls
        new_call = self.models.tool_calls.new
        chat_pk = self.chat.pk
        call_rows = [
            new_call(
                {
                    "chat_id": chat_pk,
                    "call_id": call.id,
                    "name": call.name,
                    "arguments": call.arguments,
                    "state": call.state,
                    "provider_data": call.provider_data,
                }
            )
            for call in calls
        ]
        usage_row = self.row.usage_row(usage)

        def body(guard: str, values: Values) -> str:
            return writes.answer(guard, values, record, call_rows, usage_row, charge)

        # A computed answer: written when the database comes back, never asked for again.
        rows = self.control.at_once(writes, release, body, record, keep=True)
        inserted(record, rows[0][GUARD], self.row.db)
        if calls:
            keys = {row[GUARD + 2]: row[GUARD + 1] for row in rows}
            for call, call_row in zip(calls, call_rows, strict=True):
                call.key = call_row.pk = keys[call.id]
                call_row.message_id = record.pk
        # The rows just saved, for the live event (agentloop.live_events.message_payload): its
        # calls need no statement of their own.
        record._agentloop_tool_calls = call_rows
        message.key = record.pk
        return record

    def _append_at_once(self, writes: StepWrites, message: Message) -> Any:
        record = self.row.message_row(message)

        def body(guard: str, values: Values) -> str:
            return writes.lone_message(guard, values, record)

        rows = self.control.at_once(writes, None, body, record)
        inserted(record, rows[0][GUARD], self.row.db)
        message.key = record.pk
        return record

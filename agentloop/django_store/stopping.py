"""The Django store's cancel flag and halts: requesting a stop from any process, and
recording what a cancel cut short (``Stopping``)."""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Case, CharField, DateTimeField, Exists, F, Q, Value, When
from django.db.models.functions import Coalesce, Now
from django.utils import timezone

from ..agents.subagents import cancel_children
from ..budgets.enforcement import ChatBudgets
from ..engine import UsageRecord
from ..engine import store as parts
from ..messages import Message, ToolCall, ToolCallState
from ..process.cancel_notices import covers, notify
from .chat_row import ChatRow
from .leases import UNREAD
from .reconnect import retried
from .run_control import RunControl

__all__ = ["Stopping"]


class Stopping(parts.Stopping):
    """Cancels and halts, asked for from any process and seen by ``control``'s run."""

    def __init__(
        self,
        row: ChatRow,
        control: RunControl,
        cancel_notice: threading.Event | None,
        budgets: ChatBudgets,
    ) -> None:
        self.row = row
        self.control = control
        self.cancel_notice = cancel_notice
        #: a cut-short attempt's usage row charges its budgets (and settles its reservation).
        self.budgets = budgets
        self.chat = row.chat
        self.models = row.models

    def _read_cancel_flag(self) -> datetime | None:
        # A halt asked for by another process comes with the flag, in the same query.
        select = self.models.cancel_flag(self.row.db)
        rows = retried(self.control.lease, self.row.db, lambda: select.rows([self.chat.pk]))
        if not rows:
            return None
        row = rows[0]
        value: datetime | None = row[0]
        if row[1]:
            # Only ever adds a halt: one this process asked for while it holds the chat is
            # kept in memory, not in the row, and a read must not undo it (its tools running
            # at once check the flag between them).
            self.chat.halt_reason = row[1]
        return value

    def cancel_requested_at(self) -> datetime | None:
        if self.chat.pk is None:
            return None
        flag = self.control.take_flag()
        if flag is not UNREAD and not (self.cancel_notice and self.cancel_notice.is_set()):
            # The last write's lease renewal read the flag just now: no query needed.
            value: datetime | None = flag
            return value
        return self._read_cancel_flag()

    def notices_cover(self, since: float) -> bool:
        # A verb heard by its process's Redis subscriber from its claim on (``hear``).
        return covers(self.cancel_notice, since)

    def request_cancel(self) -> bool:
        # Keep the first request's time: clearing compares against it. Only a run that is in
        # progress, queued or held for a person can be cancelled; else nothing is set, so a
        # later message can't inherit it.
        pk = self.row.saved().pk
        now = timezone.now()
        active = (
            # Judged by the database's clock, as every lease decision is.
            Q(lease_token__gt="", lease_expires_at__gt=Now())
            | Q(state__in=["queued", "running", "waiting"])
            | Q(tool_calls__state=ToolCallState.WAITING)
        )
        if self.models.has_batches:
            active |= Q(batch_items__status="pending", batch_items__cancelled_at__isnull=True)
        flagged = self.models.chat_model.objects.filter(
            pk__in=self.models.chat_model.objects.filter(active, pk=pk)
        ).update(cancel_requested_at=Coalesce("cancel_requested_at", now))
        if not flagged:
            return False
        cancel_children(self.models.chat_model, pk, now)  # running subagents stop too

        notify(self.chat)
        return True

    def record_cancellation(
        self,
        requested_at: datetime | None,
        *,
        partial: Message | None,
        partial_key: Any,
        usage: UsageRecord | None,
        unanswered: list[ToolCall],
    ) -> None:
        with self.control.writing():
            flag = self.models.chat_model.objects.filter(pk=self.chat.pk)
            if requested_at is not None:
                # A cancel requested after the one we saw stays for the next run.
                flag = flag.filter(cancel_requested_at__lte=requested_at)
            flag.update(cancel_requested_at=None)
            message = None
            if partial is not None:
                message = self.row.message_row(partial.model_copy(update={"status": "cancelled"}))
                if partial_key is not None:
                    message.pk = partial_key
                    message.save(force_update=True)
                else:
                    message.save()
            elif partial_key is not None:
                self.models.message_model.objects.filter(pk=partial_key).update(status="cancelled")
            if usage is not None:
                self.row.usage_row(usage, message).save()
                self.budgets.charge(usage)
            if unanswered:
                # A call still held for a person is decided too ("cancelled"): a decision that
                # answered it first stands, one that comes later is refused.
                held = Q(state=ToolCallState.WAITING)
                self.models.tool_call_model.objects.filter(
                    pk__in=[call.key for call in unanswered]
                ).exclude(state__in=[ToolCallState.SUCCEEDED, ToolCallState.FAILED]).update(
                    state=ToolCallState.CANCELLED,
                    decision=Case(
                        When(held, then=Value("cancelled")),
                        default=F("decision"),
                        output_field=CharField(),  # the column's field is a subclass (fields.py)
                    ),
                    decided_at=Case(
                        When(held, then=Value(timezone.now(), output_field=DateTimeField())),
                        default=F("decided_at"),
                    ),
                )
        self.chat.cancel_requested_at = None
        self.control.forget_flag()  # it was read before the flag was cleared

    def cancel_held(self, result: str) -> list[Any] | None:
        chats = self.models.chat_model._default_manager.using(self.row.db)
        calls = self.models.tool_call_model._default_manager.using(self.row.db)
        pk, now = self.row.saved().pk, timezone.now()
        # The held round: calls still waiting, or approved meanwhile and not started.
        held = calls.filter(chat_id=pk, state__in=[ToolCallState.WAITING, ToolCallState.PENDING])
        records = []
        with transaction.atomic(using=self.row.db):
            # Only while no run holds the chat or is queued to (that run applies the cancel at
            # its next checkpoint). The UPDATE locks the chat row: a claim waits for this
            # transaction, then finds the cancel applied.
            applied = (
                chats.filter(Exists(held), pk=pk, lease_token="")
                .exclude(state__in=["queued", "running"])
                .update(
                    cancel_requested_at=None,
                    state=Case(
                        When(state="waiting", then=Value("idle")),
                        default=F("state"),
                        output_field=CharField(),  # the column's field is a subclass (fields.py)
                    ),
                    updated_at=now,
                )
            )
            if not applied:
                return None
            round_calls = calls.filter(chat_id=pk, message_id__in=held.values("message_id"))
            undecided = round_calls.filter(
                Q(state=ToolCallState.PENDING)
                | (Q(state=ToolCallState.WAITING) & ~Q(wait_reason="subagent"))
            )
            for key, call_id, name in undecided.order_by("pk").values_list("pk", "call_id", "name"):
                # Each only while still undecided: a denial or an answer that got there first
                # stands; an approval that did is cancelled too (the call has not started).
                cancelled = calls.filter(pk=key, state=ToolCallState.WAITING).update(
                    state=ToolCallState.CANCELLED, decision="cancelled", decided_at=now,
                    finished_at=now,
                ) or calls.filter(pk=key, state=ToolCallState.PENDING).update(
                    state=ToolCallState.CANCELLED, finished_at=now
                )  # fmt: skip
                if cancelled:
                    answer = Message(
                        role="tool", content=result, tool_call_id=call_id, tool_name=name,
                        is_error=True,
                    )  # fmt: skip
                    record = self.row.message_row(answer, tool_call_id=key)
                    self.models.message_insert.insert(record, self.row.db)
                    records.append(record)
        self.chat.cancel_requested_at = None
        if self.chat.state == "waiting":
            self.chat.state = "idle"
        return records

    def record_stop(self, reason: str) -> None:
        with self.control.writing():
            self.row.update(stop_reason=reason[:300], state="stopped", halt_reason="")
        if self.control.lease is not None:
            self.control.lease.halt_reason = ""  # recorded: it stops this run, not the next one

    def request_halt(self, reason: str) -> bool:
        if self.control.lease is not None:
            # This process runs the chat (a tool, a callback): the run sees it in memory.
            self.chat.halt_reason = reason
            return True
        running = Q(lease_token__gt="", lease_expires_at__gt=Now()) | Q(
            state__in=["queued", "running"]
        )
        pk = self.row.saved().pk
        if not self.models.chat_model.objects.filter(running, pk=pk).update(halt_reason=reason):
            return False
        self.chat.halt_reason = reason
        # The run's next checkpoint reads the row (and the halt) at once.
        notify(self.chat, halt=True)
        return True

    def halt_requested(self) -> str:
        if (
            self.control.lease is not None
            and self.control.lease.halt_reason
            and not self.chat.halt_reason
        ):
            # Asked for by another process and read by a renewal of the lease (a write's
            # guard or the heartbeat): no query of its own.
            self.chat.halt_reason = self.control.lease.halt_reason
        return str(self.chat.halt_reason or "")

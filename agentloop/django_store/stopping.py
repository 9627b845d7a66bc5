"""The Django store's cancel flag and halts: requesting a stop from any process, and
recording what a cancel cut short (part of ``DjangoStore``)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Coalesce
from django.utils import timezone

from .._cancel_notices import notify
from .._leases import UNREAD
from ..engine import UsageRecord
from ..messages import Message, ToolCall, ToolCallState
from ..subagents import cancel_children
from .reconnect import retried

__all__ = ["Stopping"]


class Stopping:
    """Cancels and halts."""

    chat: Any
    chat_model: Any
    message_model: Any
    tool_call_model: Any
    models: Any
    cancel_notice: Any
    lease: Any
    _flag_after_write: Any
    # DjangoStore's own (one write transaction under the lease; rows; the saved chat).
    _writing: Callable[..., AbstractContextManager[None]]
    _message_row: Callable[..., Any]
    _usage_row: Callable[..., Any]
    _update_chat: Callable[..., None]
    _saved_chat: Callable[[], Any]

    @property
    def _db(self) -> str:
        return self.chat._state.db or "default"

    def _read_cancel_flag(self) -> datetime | None:
        # A halt asked for by another process comes with the flag, in the same query.
        select = self.models.cancel_flag(self._db)
        rows = retried(self.lease, self._db, lambda: select.rows([self.chat.pk]))
        if not rows:
            return None
        row = rows[0]
        value: datetime | None = row[0]
        self.chat.halt_reason = row[1]
        return value

    def cancel_requested_at(self) -> datetime | None:
        if self.chat.pk is None:
            return None
        flag, self._flag_after_write = self._flag_after_write, UNREAD
        if flag is not UNREAD and not (self.cancel_notice and self.cancel_notice.is_set()):
            # The last write's lease renewal read the flag just now: no query needed.
            value: datetime | None = flag
            return value
        return self._read_cancel_flag()

    def request_cancel(self) -> bool:
        # Keep the first request's time: clearing compares against it. Only a run that is in
        # progress, queued or held for a person can be cancelled; else nothing is set, so a
        # later message can't inherit it.
        pk = self._saved_chat().pk
        now = timezone.now()
        active = (
            Q(lease_token__gt="", lease_expires_at__gt=now)
            | Q(state__in=["queued", "running", "waiting"])
            | Q(tool_calls__state=ToolCallState.WAITING)
        )
        if self.models.has_batches:
            active |= Q(batch_items__status="pending", batch_items__cancelled_at__isnull=True)
        flagged = self.chat_model.objects.filter(
            pk__in=self.chat_model.objects.filter(active, pk=pk)
        ).update(cancel_requested_at=Coalesce("cancel_requested_at", now))
        if not flagged:
            return False
        cancel_children(self.chat_model, pk, now)  # running subagents stop too

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
        self._flag_after_write = UNREAD  # it was read before the flag was cleared

    def record_stop(self, reason: str) -> None:
        with self._writing():
            self._update_chat(stop_reason=reason[:300], state="stopped", halt_reason="")

    def request_halt(self, reason: str) -> bool:
        if self.lease is not None:
            # This process runs the chat (a tool, a callback): the run sees it in memory.
            self.chat.halt_reason = reason
            return True
        now = timezone.now()
        running = Q(lease_token__gt="", lease_expires_at__gt=now) | Q(
            state__in=["queued", "running"]
        )
        pk = self._saved_chat().pk
        if not self.chat_model.objects.filter(running, pk=pk).update(halt_reason=reason):
            return False
        self.chat.halt_reason = reason
        notify(self.chat)  # the run's next checkpoint reads the row (and the halt) at once
        return True

    def halt_requested(self) -> str:
        return str(self.chat.halt_reason or "")

    # -- messages sent while a run holds the chat -------------------------------------------
    def queue_message(self, message: Message) -> None:
        data = message.model_dump(mode="json", include={"role", "content", "attachments"})
        rows = self.chat_model._default_manager.using(self._db).filter(pk=self._saved_chat().pk)
        with transaction.atomic(using=self._db):
            # Locked: two messages queued at once both stay, in the order they came.
            current = rows.select_for_update().values_list("inbox", flat=True).first()
            inbox = [*(current or []), data]
            rows.update(inbox=inbox)
        self.chat.inbox = inbox
        # A run that ended just before would leave it unanswered: queue the chat if nothing
        # holds it (the holder's release does it otherwise; exactly one of the two wins).
        woken = (
            rows.filter(lease_token="")
            .exclude(state="queued")
            .update(state="queued", updated_at=timezone.now())
        )
        if woken:
            self.chat.state = "queued"
            # Function-local: background imports the runner, which imports this store.
            from ..background import enqueue

            enqueue(self.chat.pk, self.chat._meta.label, using=self._db)

    def run_in_progress(self) -> bool:
        state = self.chat_model._default_manager.filter(pk=self.chat.pk).values_list(
            "state", flat=True
        )
        return state.first() in ("queued", "running")

    def has_queued(self) -> bool:
        return bool(getattr(self.chat, "inbox", None))

    def take_queued(self) -> list[Message]:
        rows = self.chat_model._default_manager.using(self._db).filter(pk=self.chat.pk)
        with self._writing():
            current = rows.select_for_update().values_list("inbox", flat=True).first()
            if current:
                rows.update(inbox=[])
        self.chat.inbox = []
        return [Message.model_validate(item) for item in current or []]

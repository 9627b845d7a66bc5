"""The Django store's edits: rows superseded by an edit or a regenerated answer, the calls
among them, and forks (``Edits``). See docs/editing.md."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import Case, CharField, DateTimeField, F, Q, Value, When
from django.utils import timezone

from ..engine import store as parts
from ..engine.store import SUPERSEDED_DECISION, Superseded
from ..messages import Message, MessageStatus, ToolCall, ToolCallState
from .chat_row import ChatRow
from .run_control import RunControl
from .transcript_rows import MESSAGE_COLUMNS, messages_from_rows

__all__ = ["Edits"]

#: a chat's columns a fork starts afresh (its run, its links) instead of copying.
_NOT_COPIED = frozenset(
    {
        "state", "stop_reason", "halt_reason", "error", "error_detail", "attempts", "retry_at",
        "inbox", "trace_context", "cancel_requested_at", "lease_token", "lease_expires_at",
        "lease_holder", "created_at", "updated_at", "edited_at", "parent", "parent_tool_call",
        "forked_from", "forked_from_message",
    }
)  # fmt: skip
#: a copied message's or call's columns set for the copy, not copied.
_MESSAGE_OWN = frozenset({"chat", "tool_call", "created_at", "superseded_at"})
_CALL_OWN = frozenset({"chat", "message"})
_FINISHED = (ToolCallState.SUCCEEDED, ToolCallState.FAILED, ToolCallState.CANCELLED)
#: where a summary row says which message it covers through (engine.compaction).
_THROUGH = "summarizes_through"


def _copy(instance: Any, model: Any, own: frozenset[str], **values: Any) -> Any:
    """A new, unsaved ``model`` row with ``instance``'s columns but its key and ``own``."""
    copied = {
        field.attname: getattr(instance, field.attname)
        for field in model._meta.concrete_fields
        if not field.primary_key and field.name not in own
    }
    return model(**copied, **values)


class Edits(parts.Edits, parts.Forks):
    """Superseding rows under ``control``'s claim, reading them back, and forking the chat."""

    def __init__(self, row: ChatRow, control: RunControl) -> None:
        self.row = row
        self.control = control
        self.chat = row.chat
        self.models = row.models
        #: the superseded calls as of the chat's ``edited_at`` (read once per edit).
        self._superseded: tuple[Any, list[ToolCall]] | None = None

    def _messages(self) -> Any:
        return self.models.message_model._default_manager.using(self.row.db)

    def _calls(self) -> Any:
        return self.models.tool_call_model._default_manager.using(self.row.db)

    # -- reading -------------------------------------------------------------------------
    def load_history(self) -> list[Message]:
        if self.chat.pk is None:
            return []
        rows = self._messages().filter(chat_id=self.chat.pk)
        messages = messages_from_rows(
            list(rows.order_by("id", "tool_calls__id").values_list(*MESSAGE_COLUMNS))
        )
        superseded = set(rows.filter(superseded_at__isnull=False).values_list("pk", flat=True))
        for message in messages:
            message.superseded = message.key in superseded
        return messages

    def superseded_calls(self) -> list[ToolCall]:
        edited = getattr(self.chat, "edited_at", None)
        if edited is None or self.chat.pk is None:
            return []  # never edited: no query (this is asked for every answer with calls)
        if self._superseded is None or self._superseded[0] != edited:
            rows = self._calls().filter(chat_id=self.chat.pk, message__superseded_at__isnull=False)
            calls = [
                ToolCall(id=call_id, name=name, key=key)
                for key, call_id, name in rows.order_by("id").values_list("pk", "call_id", "name")
            ]
            self._superseded = (edited, calls)
        return self._superseded[1]

    def pending_run(self) -> str:
        chat = self.chat  # as the verb's claim read it
        if chat.state in ("queued", "running"):
            return f"has a run in progress ({chat.state})"
        if self.models.has_batches:
            items = self.models.chat_model._meta.get_field("batch_items").related_model
            waiting = items._default_manager.using(self.row.db).filter(
                chat_id=chat.pk, status="pending", cancelled_at__isnull=True
            )
            if waiting.exists():
                return "waits for its answer from a provider batch"
        return ""

    # -- superseding -----------------------------------------------------------------------
    def supersede(self, first: Message) -> Superseded:
        now = timezone.now()
        pk = self.row.saved().pk
        rows = (
            self._messages()
            .filter(chat_id=pk, id__gte=first.key, superseded_at__isnull=True)
            .exclude(role="system")  # the instructions are configuration, not conversation
        )
        answered = self._messages().filter(chat_id=pk, tool_call__isnull=False)
        open_calls = (
            self._calls()
            .filter(chat_id=pk, message__in=rows)
            .exclude(state__in=_FINISHED)
            .exclude(pk__in=answered.values("tool_call_id"))
        )
        held = Q(state=ToolCallState.WAITING)
        with self.control.writing():
            keys = list(rows.order_by("id").values_list("pk", flat=True))
            found = list(
                open_calls.order_by("id").values_list(
                    "pk", "call_id", "name", "state", "wait_reason"
                )
            )
            # Never run, decided or swept afterwards: a held call is decided "superseded".
            self._calls().filter(pk__in=[call[0] for call in found]).update(
                state=ToolCallState.CANCELLED,
                decision=Case(
                    When(held, then=Value(SUPERSEDED_DECISION)),
                    default=F("decision"),
                    output_field=CharField(),  # the column's field is a subclass (fields.py)
                ),
                decided_at=Case(
                    When(held, then=Value(now, output_field=DateTimeField())),
                    default=F("decided_at"),
                ),
                finished_at=now,
            )
            self._messages().filter(pk__in=keys).update(superseded_at=now)
            self.row.update(edited_at=now)
        self._superseded = None
        calls = [
            ToolCall(
                id=call_id, name=name, key=key, state=ToolCallState(state),
                wait_reason=wait_reason or None,
            )
            for key, call_id, name, state, wait_reason in found
        ]  # fmt: skip
        return Superseded(keys=keys, open_calls=calls)

    # -- forking ---------------------------------------------------------------------------
    def fork(self, at: Message, open_call_result: str) -> Any:
        chat_model = self.models.chat_model
        using, pk = self.row.db, self.row.saved().pk
        origin = chat_model._default_manager.using(using).get(pk=pk)  # as configured now
        fork = _copy(origin, chat_model, _NOT_COPIED | {"id"})
        names = {field.name for field in chat_model._meta.concrete_fields}
        if "forked_from" in names and "forked_from_message" in names:
            fork.forked_from_id, fork.forked_from_message_id = pk, at.key
        rows = list(
            self._messages()
            .filter(chat_id=pk, id__lte=at.key, superseded_at__isnull=True)
            .exclude(status=MessageStatus.PARTIAL)
            .order_by("id")
        )
        calls = list(self._calls().filter(message_id__in=[row.pk for row in rows]).order_by("id"))
        answered = {row.tool_call_id for row in rows if row.tool_call_id is not None}
        now = timezone.now()
        message_model, call_model = self.models.message_model, self.models.tool_call_model
        with transaction.atomic(using=using):
            fork.save(using=using)
            copies = [
                _copy(row, message_model, _MESSAGE_OWN, chat=fork, created_at=now) for row in rows
            ]
            message_model._default_manager.using(using).bulk_create(copies)
            message_pks = {row.pk: copy.pk for row, copy in zip(rows, copies, strict=True)}
            call_copies = []
            for call in calls:
                copy = _copy(call, call_model, _CALL_OWN, chat=fork)
                copy.message_id = message_pks[call.message_id]
                if call.pk not in answered:
                    copy.state = ToolCallState.CANCELLED  # answered below: it never runs here
                call_copies.append(copy)
            call_model._default_manager.using(using).bulk_create(call_copies)
            call_pks = {call.pk: copy.pk for call, copy in zip(calls, call_copies, strict=True)}
            self._link(rows, copies, message_pks, call_pks)
            unanswered = [
                message_model(
                    chat=fork, role="tool", content=open_call_result, is_error=True,
                    tool_call_id=copy.pk, created_at=now,
                )
                for call, copy in zip(calls, call_copies, strict=True)
                if call.pk not in answered
            ]  # fmt: skip
            message_model._default_manager.using(using).bulk_create(unanswered)
        return fork

    def _link(
        self,
        rows: list[Any],
        copies: list[Any],
        message_pks: dict[Any, Any],
        call_pks: dict[Any, Any],
    ) -> None:
        """The copies' links to each other: results to their copied calls, summaries to the
        copied rows they cover."""
        changed = []
        for row, copy in zip(rows, copies, strict=True):
            if row.tool_call_id is not None:
                copy.tool_call_id = call_pks.get(row.tool_call_id)
                changed.append(copy)
            through = (row.provider_data or {}).get(_THROUGH)
            if row.role == "summary" and through in message_pks:
                copy.provider_data = {**row.provider_data, _THROUGH: message_pks[through]}
                changed.append(copy)
        if changed:
            self._messages().bulk_update(changed, ["tool_call", "provider_data"])

"""The Django store's inbox: messages sent while a run holds the chat, queued on the chat row
and taken by the run's next step (``Inbox``)."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from ..engine import store as parts
from ..messages import Message
from .chat_row import ChatRow
from .run_control import RunControl

__all__ = ["Inbox"]


class Inbox(parts.Inbox):
    """Messages queued while a run holds the chat; a free chat is queued for the background."""

    def __init__(self, row: ChatRow, control: RunControl) -> None:
        self.row = row
        self.control = control
        self.chat = row.chat
        self.models = row.models

    def queue_message(self, message: Message) -> None:
        data = message.model_dump(mode="json", include={"role", "content", "attachments"})
        rows = self.models.chat_model._default_manager.using(self.row.db).filter(
            pk=self.row.saved().pk
        )
        with transaction.atomic(using=self.row.db):
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
            if self.control.send_next is not None:
                self.control.send_next()

    def run_in_progress(self) -> bool:
        state = self.models.chat_model._default_manager.filter(pk=self.chat.pk).values_list(
            "state", flat=True
        )
        return state.first() in ("queued", "running")

    def has_queued(self) -> bool:
        return bool(getattr(self.chat, "inbox", None))

    def take_queued(self) -> list[Message]:
        rows = self.models.chat_model._default_manager.using(self.row.db).filter(pk=self.chat.pk)
        with self.control.writing():
            current = rows.select_for_update().values_list("inbox", flat=True).first()
            if current:
                rows.update(inbox=[])
        self.chat.inbox = []
        return [Message.model_validate(item) for item in current or []]

"""The example site's own data: notes the demo agent saves with its ``save_note`` tool, and
a chat model of its own (support conversations about tickets)."""

from django.conf import settings
from django.db import models

from agentloop.models import (
    AbstractChat,
    AbstractMessage,
    AbstractToolCall,
    AbstractUsage,
    ToolResultField,
)


class Note(models.Model):
    """A note an agent saved for a user (or, for a chat without owner, for that chat)."""

    chat = models.ForeignKey(
        "agentloop.Chat", null=True, blank=True, on_delete=models.CASCADE, related_name="notes"
    )
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="agent_notes",
    )
    text = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return self.text if len(self.text) <= 60 else self.text[:57] + "..."


# -- a chat model of the project's own (docs/custom-models.md) ----------------------------------
# agentloop's abstract models make any model a chat: here a support conversation about a
# ticket, with its own message, tool-call and usage tables. The related names ``messages``,
# ``tool_calls`` and ``usage_records`` are what agentloop reads them by (check
# agentloop.E008 says so when one is missing).


class Ticket(models.Model):
    """A support ticket; each may have a conversation with the support agent."""

    subject = models.CharField(max_length=200)

    def __str__(self) -> str:
        return self.subject


class SupportConversation(AbstractChat):
    """A chat about one ticket."""

    ticket = models.ForeignKey(
        Ticket, null=True, blank=True, on_delete=models.CASCADE, related_name="conversations"
    )


class SupportMessage(AbstractMessage):
    chat = models.ForeignKey(SupportConversation, on_delete=models.CASCADE, related_name="messages")
    tool_call = ToolResultField(  # a OneToOneField whose call.result is None until written
        "SupportToolCall", null=True, blank=True, on_delete=models.CASCADE, related_name="result"
    )

    class Meta(AbstractMessage.Meta):
        abstract = False
        ordering = ["id"]


class SupportToolCall(AbstractToolCall):
    chat = models.ForeignKey(
        SupportConversation, on_delete=models.CASCADE, related_name="tool_calls"
    )
    message = models.ForeignKey(SupportMessage, on_delete=models.CASCADE, related_name="tool_calls")

    class Meta(AbstractToolCall.Meta):
        abstract = False
        constraints = [
            models.UniqueConstraint(fields=["chat", "call_id"], name="support_unique_call_id")
        ]


class SupportUsage(AbstractUsage):
    chat = models.ForeignKey(
        SupportConversation,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="usage_records",
    )
    message = models.ForeignKey(
        SupportMessage, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="support_usage",
    )

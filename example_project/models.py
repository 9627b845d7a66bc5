"""The example site's own data: notes the demo agent saves with its ``save_note`` tool."""

from django.conf import settings
from django.db import models


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

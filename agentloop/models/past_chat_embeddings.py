"""``MessageEmbedding``: a past chat's message, embedded for search across an owner's chats.

Opt-in (``AGENTLOOP["PAST_CHATS_EMBEDDING_MODEL"]``): background jobs
(``agentloop.past_chats.embed_pending_messages``) add one row per user or assistant message
of an owned chat; a message with no text to embed gets a row without a vector, so the next
job goes past it. The owner is copied from the chat, so a search filters on one column of
this table, in the same statement as the distance (never crossing owners). Deleting the
chat (or the message, or the owner) deletes the rows.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from ..django_store.fields import StorableCharField
from .chat import Chat
from .memories import EmbeddingField, MemoryQuerySet
from .message import Message

__all__ = ["MessageEmbedding", "MessageEmbeddingQuerySet"]


class MessageEmbeddingQuerySet(MemoryQuerySet):
    """``nearest(vector, k)`` as memories have it (the same ``embedding`` and ``dimensions``
    columns, the same HNSW cast on PostgreSQL); filter by ``owner`` and ``chat`` first."""

    def embedded(self) -> MessageEmbeddingQuerySet:
        """The rows with a vector (not the markers of messages with nothing to embed)."""
        return self.filter(embedding__isnull=False)


class MessageEmbedding(models.Model):
    """One message's vector (or none: nothing to embed), with whose chat it is."""

    message = models.OneToOneField(
        Message,
        verbose_name=_("message"),
        on_delete=models.CASCADE,
        related_name="past_chat_embedding",
    )
    chat = models.ForeignKey(
        Chat,
        verbose_name=_("chat"),
        on_delete=models.CASCADE,
        related_name="+",
        db_index=False,  # (owner, chat) below serves the searches
    )
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name=_("owner"),
        on_delete=models.CASCADE,
        related_name="+",
        db_index=False,
    )
    embedding = EmbeddingField(_("embedding"), null=True, blank=True)
    embedding_model = StorableCharField(_("embedding model"), max_length=200, blank=True)
    dimensions = models.PositiveIntegerField(_("dimensions"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), default=timezone.now, editable=False)

    objects = MessageEmbeddingQuerySet.as_manager()

    #: set on the rows ``nearest()`` returns: their cosine distance.
    distance: float | None = None

    class Meta:
        verbose_name = _("message embedding")
        verbose_name_plural = _("message embeddings")
        indexes = [
            models.Index(fields=["owner", "chat"], name="agentloop_msgemb_owner_idx"),
        ]

    def __str__(self) -> str:
        return f"message {self.message_id} ({self.embedding_model or 'nothing to embed'})"

"""Provider batches: ``Batch`` (one provider batch) and ``BatchItem`` (one chat's request in it)."""

from __future__ import annotations

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from ..django_store.fields import (
    StorableCharField,
    StorableJSONField,
    StorableTextField,
    optional_link,
)
from .chat import Chat
from .message import Message


class BatchStatus(models.TextChoices):
    CREATED = "created", _("created, not sent yet")
    IN_PROGRESS = "in_progress", _("in progress")
    CANCELLING = "cancelling", _("cancelling")
    ENDED = "ended", _("ended")
    CANCELLED = "cancelled", _("cancelled")
    EXPIRED = "expired", _("expired")
    FAILED = "failed", _("failed")


class BatchItemStatus(models.TextChoices):
    PENDING = "pending", _("pending")
    SUCCEEDED = "succeeded", _("answered")
    FAILED = "failed", _("failed")
    #: the chat was cancelled while its request sat in the batch: the answer is discarded.
    CANCELLED = "cancelled", _("cancelled")
    #: the batch ended (cancelled or expired) before the provider ran the request.
    NOT_RUN = "not_run", _("not run")
    #: the chat moved on meanwhile (another answer came first): the answer is discarded.
    DISCARDED = "discarded", _("discarded")


class BatchQuerySet(models.QuerySet["Batch"]):
    def open(self) -> BatchQuerySet:
        """Batches whose results are not all in their chats yet."""
        return self.filter(collected_at__isnull=True)


class AbstractBatch(models.Model):
    """One provider batch: the next model call of many chats, sent together."""

    provider = StorableCharField(_("provider"), max_length=100)
    #: the model of every request, or blank when the batch mixes models.
    model = StorableCharField(_("model"), max_length=200, blank=True)
    provider_batch_id = StorableCharField(_("provider batch id"), max_length=200, blank=True)
    status = StorableCharField(
        _("status"), max_length=20, choices=BatchStatus.choices, default=BatchStatus.CREATED
    )
    #: chats whose answers ask for tools run them and go into the next batch.
    auto_continue = models.BooleanField(_("continue in batches"), default=False)
    request_count = models.PositiveIntegerField(_("requests"), default=0)
    processing_count = models.PositiveIntegerField(_("processing"), default=0)
    succeeded_count = models.PositiveIntegerField(_("succeeded"), default=0)
    failed_count = models.PositiveIntegerField(_("failed"), default=0)
    error = StorableTextField(_("error"), blank=True)
    provider_data = StorableJSONField(_("provider data"), default=dict, blank=True)
    #: one poller at a time: a claim (token + expiry) taken with a conditional UPDATE.
    claim_token = StorableCharField(_("claim token"), max_length=32, blank=True, editable=False)
    claimed_until = models.DateTimeField(_("claimed until"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), default=timezone.now, editable=False)
    submitted_at = models.DateTimeField(_("submitted at"), null=True, blank=True)
    polled_at = models.DateTimeField(_("last polled at"), null=True, blank=True)
    ended_at = models.DateTimeField(_("ended at"), null=True, blank=True)
    #: every result is in its chat (or the batch failed): nothing left to poll.
    collected_at = models.DateTimeField(_("collected at"), null=True, blank=True)
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    objects = BatchQuerySet.as_manager()

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"Batch {self.pk} ({self.provider}, {self.status})"


class Batch(AbstractBatch):
    #: the batch whose answers led to this one (auto_continue).
    previous = optional_link("self", _("previous batch"), "next_batches")
    #: the eval run whose cases' requests it holds (``agentloop.evals.batch_rounds``), or
    #: null for a batch of chats. An eval batch has no items: its cases point at it.
    eval_run = optional_link("agentloop.EvalRun", _("eval run"), "batches")

    class Meta(AbstractBatch.Meta):
        verbose_name = _("batch")
        verbose_name_plural = _("batches")
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["collected_at", "status"], name="agentloop_batch_open_idx"),
        ]


class BatchItem(models.Model):
    """One chat's request in a batch, and what became of it."""

    batch = models.ForeignKey(
        Batch, verbose_name=_("batch"), on_delete=models.CASCADE, related_name="items"
    )
    chat = models.ForeignKey(
        Chat, verbose_name=_("chat"), on_delete=models.CASCADE, related_name="batch_items"
    )
    custom_id = StorableCharField(_("custom id"), max_length=64)
    model = StorableCharField(_("model"), max_length=200)
    status = StorableCharField(
        _("status"),
        max_length=20,
        choices=BatchItemStatus.choices,
        default=BatchItemStatus.PENDING,
    )
    #: the chat's latest message when the request was made: an answer to anything else
    #: would be out of place, and is discarded.
    after_message = optional_link(Message, _("after message"), "+")
    #: the answer appended to the chat.
    message = optional_link(Message, _("answer"), "+")
    error = StorableTextField(_("error"), blank=True)
    #: set when the chat was cancelled while the request waited: its answer is discarded.
    cancelled_at = models.DateTimeField(_("cancelled at"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), default=timezone.now, editable=False)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)

    class Meta:
        verbose_name = _("batch item")
        verbose_name_plural = _("batch items")
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["batch", "custom_id"], name="agentloop_batchitem_unique_custom_id"
            )
        ]
        indexes = [
            models.Index(fields=["chat", "status"], name="agentloop_batchitem_chat_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.custom_id}: chat {self.chat_id} ({self.status})"

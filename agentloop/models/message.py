"""Transcript rows: ``Message`` and ``ToolCall`` (and their abstract mixins)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.db.models.fields.related_descriptors import ReverseOneToOneDescriptor
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from ..django_store.fields import (
    StorableCharField,
    StorableJSONField,
    StorableTextField,
    optional_link,
)
from ..messages import MessageStatus, ToolCallState


class Role(models.TextChoices):
    SYSTEM = "system", _("system")
    USER = "user", _("user")
    ASSISTANT = "assistant", _("assistant")
    TOOL = "tool", _("tool")
    #: a compaction's summary of the messages before it (sent as context, see the docs).
    SUMMARY = "summary", _("summary of earlier messages")


MESSAGE_STATUS_CHOICES = [(status.value, status.value) for status in MessageStatus]
TOOL_CALL_STATE_CHOICES = [(state.value, state.value) for state in ToolCallState]


class MessageQuerySet(models.QuerySet["AbstractMessage"]):
    def finished(self) -> MessageQuerySet:
        """Messages that count: no streamed partials, no cancelled answers."""
        return self.filter(status=MessageStatus.COMPLETE)

    def partial(self) -> MessageQuerySet:
        """Answers cut short (a crash mid-stream, or a cancel)."""
        return self.exclude(status__in=[MessageStatus.COMPLETE, MessageStatus.BLOCKED])

    def blocked(self) -> MessageQuerySet:
        """User messages and answers a guardrail blocked (kept, never sent to the model)."""
        return self.filter(status=MessageStatus.BLOCKED)

    def current(self) -> MessageQuerySet:
        """Messages of the conversation as it stands: none an edit or a regenerated answer
        superseded (docs/editing.md)."""
        return self.filter(superseded_at__isnull=True)

    def superseded(self) -> MessageQuerySet:
        """Messages an edit or a regenerated answer replaced: kept, never sent again."""
        return self.filter(superseded_at__isnull=False)


class AbstractMessage(models.Model):
    """One message of a transcript."""

    role = StorableCharField(_("role"), max_length=20, choices=Role.choices)
    content = StorableTextField(_("content"), blank=True)
    status = StorableCharField(
        _("status"), max_length=20, choices=MESSAGE_STATUS_CHOICES, default=MessageStatus.COMPLETE
    )
    is_error = models.BooleanField(_("is an error result"), default=False)
    parsed = StorableJSONField(_("structured output"), null=True, blank=True)
    model = StorableCharField(_("model"), max_length=200, blank=True)
    finish_reason = StorableCharField(_("finish reason"), max_length=50, blank=True)
    #: the model's readable thinking behind an answer (model text: escape it when shown).
    thinking = StorableTextField(_("thinking"), blank=True)
    provider_data = StorableJSONField(_("provider data"), default=dict, blank=True)
    #: images and documents sent with the message (``Attachment`` as JSON; data in base64).
    attachments = StorableJSONField(_("attachments"), default=list, blank=True)
    #: what input (a user message) or output (an answer) guardrails decided about it
    #: (``GuardrailOutcome`` as JSON).
    guardrails = StorableJSONField(
        _("guardrail outcomes"), default=list, db_default=[], blank=True, editable=False
    )
    #: for an answer of a chat ``with_memory``: the memories it was given, nearest first
    #: (``[{"id": <Memory pk>, "similarity": 0.83}]``); null: no recall was made for it.
    recall = StorableJSONField(_("memories recalled"), null=True, blank=True, editable=False)
    created_at = models.DateTimeField(_("created at"), default=timezone.now, editable=False)
    #: when an edit or a regenerated answer replaced this message (null: it is current). A
    #: superseded message stays, with its usage rows, and is never sent to a model again.
    superseded_at = models.DateTimeField(_("superseded at"), null=True, blank=True)

    objects = MessageQuerySet.as_manager()

    class Meta:
        abstract = True

    def __str__(self) -> str:
        text = self.content if len(self.content) <= 60 else self.content[:57] + "..."
        return f"{self.role}: {text}"


class AbstractToolCall(models.Model):
    """A tool call the model asked for, and how running it went."""

    call_id = StorableCharField(_("provider call id"), max_length=200)
    name = StorableCharField(_("tool name"), max_length=200)
    arguments = StorableJSONField(_("arguments"), default=dict, blank=True)
    #: the model's arguments, when the approver edited them (``arguments`` is what ran).
    original_arguments = StorableJSONField(_("original arguments"), null=True, blank=True)
    state = StorableCharField(
        _("state"), max_length=20, choices=TOOL_CALL_STATE_CHOICES, default=ToolCallState.PENDING
    )
    error = StorableTextField(_("error"), blank=True)
    provider_data = StorableJSONField(_("provider data"), default=dict, blank=True)
    #: why a waiting call waits: approval, question or subagent.
    wait_reason = StorableCharField(_("waits for"), max_length=20, blank=True)
    question = StorableTextField(_("question"), blank=True)
    #: a person's decision: approved, denied or answered; bound to ``decision_digest``.
    decision = StorableCharField(_("decision"), max_length=20, blank=True)
    decision_digest = StorableCharField(_("arguments digest"), max_length=64, blank=True)
    decision_reason = StorableTextField(_("decision reason"), blank=True)
    decided_by = optional_link(settings.AUTH_USER_MODEL, _("decided by"), "+")
    decided_at = models.DateTimeField(_("decided at"), null=True, blank=True)
    #: the handoff this call made: {"from": <agent path or "">, "to": <agent path>,
    #: "inputs": {...}} (``Agent.as_handoff``, ``ToolContext.hand_off``); null: none.
    handoff = StorableJSONField(_("handoff"), null=True, blank=True, editable=False)
    #: what tool guardrails decided before it ran (``GuardrailOutcome`` as JSON).
    guardrails = StorableJSONField(
        _("guardrail outcomes"), default=list, db_default=[], blank=True, editable=False
    )
    #: an MCP server's question while the call ran (docs/mcp.md): {"server", "message",
    #: "schema", "response": {"action", "content", "by", "at", "reason"} or null}; null: none.
    elicitation = StorableJSONField(_("elicitation"), null=True, blank=True, editable=False)
    #: when the call began to wait (``APPROVAL_TIMEOUT`` counts from then).
    waiting_since = models.DateTimeField(_("waiting since"), null=True, blank=True)
    started_at = models.DateTimeField(_("started at"), null=True, blank=True)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"{self.name}({self.call_id})"


class _ResultOrNone(ReverseOneToOneDescriptor):
    """``call.result``: the message answering the call, or None while it has none."""

    def __get__(self, instance: models.Model | None, cls: type | None = None) -> Any:
        if instance is None:
            return self
        try:
            return super().__get__(instance, cls)
        except self.RelatedObjectDoesNotExist:
            return None


class ToolResultField(models.OneToOneField):
    """A tool message's link to the call it answers, whose ``call.result`` is None while the
    call has no result (cancelled or denied before one was written), not an error.

    It deconstructs as Django's ``OneToOneField``: using it needs no migration."""

    related_accessor_class = _ResultOrNone

    def deconstruct(self) -> Any:
        name, _, args, kwargs = super().deconstruct()
        return name, "django.db.models.OneToOneField", args, kwargs


def _chat_link(related_name: str) -> Any:
    """A row's chat, without an index of its own (one of the model's serves it)."""
    return models.ForeignKey(
        "Chat",  # by name: the chat module imports this one (its verbs return these rows)
        verbose_name=_("chat"),
        on_delete=models.CASCADE,
        related_name=related_name,
        db_index=False,
    )


class Message(AbstractMessage):
    #: (chat, id) below serves it: one index less to write per message.
    chat = _chat_link("messages")
    #: for a tool message, the call it answers (one result per call, enforced).
    tool_call = optional_link(
        "ToolCall", _("tool call"), "result", models.CASCADE, field=ToolResultField
    )

    class Meta(AbstractMessage.Meta):
        verbose_name = _("message")
        verbose_name_plural = _("messages")
        ordering = ["id"]
        indexes = [models.Index(fields=["chat", "id"], name="agentloop_message_chat_idx")]


class ToolCall(AbstractToolCall):
    #: the unique (chat, call_id) below serves it.
    chat = _chat_link("tool_calls")
    message = models.ForeignKey(
        Message, verbose_name=_("message"), on_delete=models.CASCADE, related_name="tool_calls"
    )

    class Meta(AbstractToolCall.Meta):
        verbose_name = _("tool call")
        verbose_name_plural = _("tool calls")
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["chat", "call_id"], name="agentloop_toolcall_unique_call_id"
            )
        ]
        indexes = [
            # The approval inbox across chats (oldest first) and APPROVAL_TIMEOUT's sweep:
            # partial, so only the few calls waiting for someone have an entry.
            models.Index(
                fields=["waiting_since"],
                name="agentloop_toolcall_waiting_idx",
                condition=models.Q(state="waiting"),
            ),
            # The inbox's decisions, newest first: only decided calls have an entry.
            models.Index(
                fields=["-decided_at"],
                name="agentloop_toolcall_decided_idx",
                condition=models.Q(decided_at__isnull=False),
            ),
        ]

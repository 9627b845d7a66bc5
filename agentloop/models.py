"""Persisted chats: abstract mixins and the concrete ``Chat``, ``Message``, ``ToolCall``, ``Usage``.

A project can make its own model a chat by subclassing the abstract classes, as
long as the related names match (``messages``, ``tool_calls``, ``usage_records``).
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import models
from django.db.models import Count, Q, Sum
from django.db.models.functions import Coalesce, TruncDay, TruncMonth, TruncWeek
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from .messages import MessageStatus, ToolCallState

if TYPE_CHECKING:
    from .engine import Conversation, StreamCallback

__all__ = [
    "AbstractChat",
    "AbstractMessage",
    "AbstractToolCall",
    "AbstractUsage",
    "Batch",
    "BatchItem",
    "BatchItemStatus",
    "BatchQuerySet",
    "BatchStatus",
    "Chat",
    "ChatState",
    "Message",
    "Role",
    "ToolCall",
    "Usage",
    "UsageStatus",
]


class ChatState(models.TextChoices):
    IDLE = "idle", _("idle")
    QUEUED = "queued", _("queued")
    RUNNING = "running", _("running")
    WAITING = "waiting", _("waiting")
    STOPPED = "stopped", _("stopped by a limit")
    FAILED = "failed", _("failed")


class Role(models.TextChoices):
    SYSTEM = "system", _("system")
    USER = "user", _("user")
    ASSISTANT = "assistant", _("assistant")
    TOOL = "tool", _("tool")


class UsageStatus(models.TextChoices):
    SUCCEEDED = "succeeded", _("succeeded")
    FAILED = "failed", _("failed")
    CANCELLED = "cancelled", _("cancelled")


MESSAGE_STATUS_CHOICES = [(status.value, status.value) for status in MessageStatus]
TOOL_CALL_STATE_CHOICES = [(state.value, state.value) for state in ToolCallState]


class ChatQuerySet(models.QuerySet["AbstractChat"]):
    def stopped(self) -> ChatQuerySet:
        return self.filter(state=ChatState.STOPPED)

    def failed(self) -> ChatQuerySet:
        return self.filter(state=ChatState.FAILED)

    def waiting(self) -> ChatQuerySet:
        return self.filter(state=ChatState.WAITING)

    def cancel_requested(self) -> ChatQuerySet:
        return self.filter(cancel_requested_at__isnull=False)

    def owned_by(self, user: Any) -> ChatQuerySet:
        return self.filter(owner=user)

    def batch(self, auto_continue: bool = False) -> Batch:
        """Send these chats' next model call as one provider batch (``agentloop.batch``)."""
        from .batches import submit

        return submit(self, auto_continue=auto_continue)


class AbstractChat(models.Model):
    """A chat whose configuration and state live on its row; the verbs run the loop."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name=_("owner"),
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="%(app_label)s_%(class)s_set",
    )
    title = models.CharField(_("title"), max_length=200, blank=True)
    model = models.CharField(_("model"), max_length=200, blank=True)
    provider = models.CharField(_("provider"), max_length=100, blank=True)
    tools = models.JSONField(_("tools (import paths)"), default=list, blank=True)
    tool_options = models.JSONField(_("tool options"), default=dict, blank=True)
    temperature = models.FloatField(_("temperature"), null=True, blank=True)
    max_output_tokens = models.PositiveIntegerField(_("max output tokens"), null=True, blank=True)
    provider_options = models.JSONField(_("provider options"), default=dict, blank=True)
    headers = models.JSONField(_("headers"), default=dict, blank=True)
    output_schema = models.JSONField(_("output schema"), null=True, blank=True)
    schema_path = models.CharField(_("schema import path"), max_length=300, blank=True)
    limits = models.JSONField(_("limits per turn"), default=dict, blank=True)
    agent_path = models.CharField(_("agent import path"), max_length=300, blank=True)
    state = models.CharField(
        _("state"), max_length=20, choices=ChatState.choices, default=ChatState.IDLE
    )
    stop_reason = models.CharField(_("stop reason"), max_length=300, blank=True)
    error = models.TextField(_("error"), blank=True)
    cancel_requested_at = models.DateTimeField(_("cancel requested at"), null=True, blank=True)
    #: the one worker allowed to write (see agentloop.leases).
    lease_token = models.CharField(_("lease token"), max_length=64, blank=True, editable=False)
    lease_expires_at = models.DateTimeField(_("lease expires at"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), default=timezone.now, editable=False)
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    objects = ChatQuerySet.as_manager()

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return self.title or f"Chat {self.pk} ({self.model or 'default model'})"

    # -- the engine ---------------------------------------------------------------------
    @property
    def conversation(self) -> Conversation:
        """The engine driving this chat (one per instance; callbacks live on it)."""
        cached: Conversation | None = self.__dict__.get("_conversation")
        if cached is None:
            from .engine import Conversation
            from .store import DjangoStore

            cached = Conversation(DjangoStore(self), owner=self)
            _connect_signals(self, cached)
            self.__dict__["_conversation"] = cached
        return cached

    # configuration (each persists and returns the chat)
    def with_model(self, model: str, provider: str | None = None) -> AbstractChat:
        self.conversation.with_model(model, provider)
        return self

    def with_instructions(self, text: str, append: bool = False) -> AbstractChat:
        self.conversation.with_instructions(text, append)
        return self

    def with_tools(self, *tools: Any, replace: bool = False) -> AbstractChat:
        self.conversation.with_tools(*tools, replace=replace)
        return self

    def with_tool_options(self, **options: Any) -> AbstractChat:
        self.conversation.with_tool_options(**options)
        return self

    def with_temperature(self, temperature: float | None) -> AbstractChat:
        self.conversation.with_temperature(temperature)
        return self

    def with_max_output_tokens(self, tokens: int | None) -> AbstractChat:
        self.conversation.with_max_output_tokens(tokens)
        return self

    def with_provider_options(self, **options: Any) -> AbstractChat:
        self.conversation.with_provider_options(**options)
        return self

    def with_headers(self, **headers: str) -> AbstractChat:
        self.conversation.with_headers(**headers)
        return self

    def with_schema(self, schema: Any) -> AbstractChat:
        self.conversation.with_schema(schema)
        return self

    def with_limits(self, **limits: Any) -> AbstractChat:
        self.conversation.with_limits(**limits)
        return self

    # callbacks (this instance only; signals reach every chat)
    def before_message(self, callback: Callable[[], Any]) -> AbstractChat:
        self.conversation.before_message(callback)
        return self

    def after_message(self, callback: Callable[[Any], Any]) -> AbstractChat:
        self.conversation.after_message(callback)
        return self

    def before_tool_call(self, callback: Callable[[Any], Any]) -> AbstractChat:
        self.conversation.before_tool_call(callback)
        return self

    def after_tool_result(self, callback: Callable[[Any], Any]) -> AbstractChat:
        self.conversation.after_tool_result(callback)
        return self

    # verbs
    def ask_later(self, content: str, attachments: Any = None) -> AbstractChat:
        """Add a user message; no model call."""
        self.conversation.ask_later(content, attachments)
        return self

    def ask(
        self, content: str, stream: StreamCallback | None = None, *, attachments: Any = None
    ) -> Any:
        """``ask_later`` then ``complete``; returns the answer (a ``Message``)."""
        return self.conversation.ask(content, stream, attachments=attachments)

    def generate(self, stream: StreamCallback | None = None) -> Any:
        """One model call; returns the saved assistant ``Message``."""
        return self.conversation.generate(stream)

    def run_tools(self) -> list[Any]:
        """Run pending tool calls; returns the saved tool ``Message`` rows."""
        return self.conversation.run_tools()

    def step(self, stream: StreamCallback | None = None) -> Any:
        """The next move, or None when complete or waiting."""
        return self.conversation.step(stream)

    def complete(self, stream: StreamCallback | None = None) -> Any:
        """Step until complete or waiting; returns the last ``Message``."""
        return self.conversation.complete(stream)

    def is_complete(self) -> bool:
        return self.conversation.is_complete()

    def is_waiting(self) -> bool:
        return self.conversation.is_waiting()

    def cancel(self) -> None:
        """Request cancellation: one UPDATE, seen by the run wherever it is.

        Subagent chats still running for this one are cancelled too.
        """
        self.conversation.cancel()

    # people in the loop
    def pending_approvals(self) -> list[Any]:
        """Tool calls (``ToolCall`` rows) waiting for approval."""
        return self.conversation.pending_approvals()

    def pending_questions(self) -> list[Any]:
        """Tool calls waiting for a person's answer (``.question``)."""
        return self.conversation.pending_questions()

    def approve(self, tool_call_id: Any, by: Any = None) -> None:
        """Approve a waiting call (by call id, pk or row) for exactly its arguments."""
        self.conversation.approve(tool_call_id, by=by)
        self._resume_if_background()

    def deny(self, tool_call_id: Any, reason: str = "", by: Any = None) -> Any:
        """Deny a waiting call: the model gets an error result saying so."""
        record = self.conversation.deny(tool_call_id, reason=reason, by=by)
        self._resume_if_background()
        return record

    def answer(self, tool_call_id: Any, text: str, by: Any = None) -> Any:
        """Answer a waiting call's question; the answer is the call's result."""
        record = self.conversation.answer(tool_call_id, text, by=by)
        self._resume_if_background()
        return record

    def _resume_if_background(self) -> None:
        # A chat a worker left waiting continues in the background once nothing holds it.
        from .engine.transcript import next_move

        self.refresh_from_db(fields=["state"])
        if self.state == ChatState.WAITING and next_move(self.conversation.messages) in (
            "tools",
            "generate",
        ):
            self.complete_later()

    def complete_later(self) -> AbstractChat:
        """Run the conversation in the background, one step per job, from the next commit.

        Also the way to resume a failed or stopped chat (after raising its limits).
        """
        from .background import enqueue

        if self.pk is None:
            self.save()
        type(self).objects.filter(pk=self.pk).exclude(state=ChatState.RUNNING).update(
            state=ChatState.QUEUED, error="", updated_at=timezone.now()
        )
        self.refresh_from_db(fields=["state", "error", "updated_at"])
        enqueue(self.pk, self._meta.label, using=self._state.db)
        return self


def _settle_parent(chat: AbstractChat, message: Any) -> None:
    """A subagent's final answer becomes its parent's tool result, and the parent goes on."""
    call_id = getattr(chat, "parent_tool_call_id", None)
    if call_id is None or message.role != "assistant" or message.status != "complete":
        return
    if message.tool_calls.exists():
        return
    parent = type(chat).objects.filter(pk=getattr(chat, "parent_id", None)).first()
    if parent is None:
        return
    from .agents import _last_answer

    if parent.conversation.settle_subagent(call_id, _last_answer(chat)):
        _resume_parent(parent)


def _resume_parent(parent: AbstractChat) -> None:
    # The state is read after the result is written: a parent whose job is still finishing
    # either reads the result itself (and goes on) or has already released it as waiting.
    parent.refresh_from_db(fields=["state"])
    if parent.state == ChatState.WAITING:
        parent.complete_later()


#: a parent's tool result when its subagent's run was cancelled before it answered.
SUBAGENT_CANCELLED_RESULT = "The subagent's run was cancelled before it answered."


def _release_parent(chat: AbstractChat) -> None:
    """A cancelled subagent releases its parent's waiting call with an error result: nothing
    else would ever settle it, and the parent could take no new message."""
    call_id = getattr(chat, "parent_tool_call_id", None)
    if call_id is None:
        return
    parent = type(chat).objects.filter(pk=getattr(chat, "parent_id", None)).first()
    if parent is None:
        return
    if parent.conversation.settle_subagent(call_id, SUBAGENT_CANCELLED_RESULT, is_error=True):
        _resume_parent(parent)  # its own cancel, if it was cancelled too, then stops it


def _cancel_children(chat: AbstractChat) -> None:
    if any(field.name == "parent" for field in chat._meta.get_fields()):
        children: dict[str, Any] = {"parent_id": chat.pk}
        type(chat).objects.filter(
            state__in=[ChatState.QUEUED, ChatState.RUNNING], **children
        ).update(cancel_requested_at=Coalesce("cancel_requested_at", timezone.now()))


def _connect_signals(chat: AbstractChat, conversation: Conversation) -> None:
    from . import signals

    conversation.on("after_message", lambda m: _settle_parent(chat, m))
    # A cancelled chat's running subagents stop too (their own subagents follow in turn).
    conversation.on("cancelled", lambda: _cancel_children(chat))
    conversation.on("cancelled", lambda: _release_parent(chat))
    sender = type(chat)
    conversation.on("before_message", lambda: signals.model_call_started.send(sender, chat=chat))
    conversation.on(
        "after_message", lambda m: signals.message_added.send(sender, chat=chat, message=m)
    )
    conversation.on(
        "before_tool_call",
        lambda call: signals.tool_call_started.send(sender, chat=chat, tool_call=call),
    )
    conversation.on(
        "after_tool_result",
        lambda m: signals.tool_call_finished.send(sender, chat=chat, message=m),
    )
    conversation.on("cancelled", lambda: signals.chat_cancelled.send(sender, chat=chat))
    conversation.on(
        "stopped", lambda reason: signals.chat_stopped.send(sender, chat=chat, reason=reason)
    )


class MessageQuerySet(models.QuerySet["AbstractMessage"]):
    def finished(self) -> MessageQuerySet:
        """Messages that count: no streamed partials, no cancelled answers."""
        return self.filter(status=MessageStatus.COMPLETE)

    def partial(self) -> MessageQuerySet:
        """Answers cut short (a crash mid-stream, or a cancel)."""
        return self.exclude(status=MessageStatus.COMPLETE)


class AbstractMessage(models.Model):
    """One message of a transcript."""

    role = models.CharField(_("role"), max_length=20, choices=Role.choices)
    content = models.TextField(_("content"), blank=True)
    status = models.CharField(
        _("status"), max_length=20, choices=MESSAGE_STATUS_CHOICES, default=MessageStatus.COMPLETE
    )
    is_error = models.BooleanField(_("is an error result"), default=False)
    parsed = models.JSONField(_("structured output"), null=True, blank=True)
    model = models.CharField(_("model"), max_length=200, blank=True)
    finish_reason = models.CharField(_("finish reason"), max_length=50, blank=True)
    provider_data = models.JSONField(_("provider data"), default=dict, blank=True)
    #: images and documents sent with the message (``Attachment`` as JSON; data in base64).
    attachments = models.JSONField(_("attachments"), default=list, blank=True)
    created_at = models.DateTimeField(_("created at"), default=timezone.now, editable=False)

    objects = MessageQuerySet.as_manager()

    class Meta:
        abstract = True

    def __str__(self) -> str:
        text = self.content if len(self.content) <= 60 else self.content[:57] + "..."
        return f"{self.role}: {text}"


class AbstractToolCall(models.Model):
    """A tool call the model asked for, and how running it went."""

    call_id = models.CharField(_("provider call id"), max_length=200)
    name = models.CharField(_("tool name"), max_length=200)
    arguments = models.JSONField(_("arguments"), default=dict, blank=True)
    state = models.CharField(
        _("state"), max_length=20, choices=TOOL_CALL_STATE_CHOICES, default=ToolCallState.PENDING
    )
    error = models.TextField(_("error"), blank=True)
    provider_data = models.JSONField(_("provider data"), default=dict, blank=True)
    #: why a waiting call waits: approval, question or subagent.
    wait_reason = models.CharField(_("waits for"), max_length=20, blank=True)
    question = models.TextField(_("question"), blank=True)
    #: a person's decision: approved, denied or answered; bound to ``decision_digest``.
    decision = models.CharField(_("decision"), max_length=20, blank=True)
    decision_digest = models.CharField(_("arguments digest"), max_length=64, blank=True)
    decision_reason = models.TextField(_("decision reason"), blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name=_("decided by"),
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    decided_at = models.DateTimeField(_("decided at"), null=True, blank=True)
    started_at = models.DateTimeField(_("started at"), null=True, blank=True)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"{self.name}({self.call_id})"


_TOTALS: dict[str, Any] = {
    "input_tokens": Sum("input_tokens", default=0),
    "output_tokens": Sum("output_tokens", default=0),
    "cached_tokens": Sum("cached_tokens", default=0),
    "reasoning_tokens": Sum("reasoning_tokens", default=0),
    "cost": Sum("cost", default=Decimal(0)),
    "attempts": Count("id"),
}


class UsageQuerySet(models.QuerySet["AbstractUsage"]):
    def for_owner(self, owner: Any) -> UsageQuerySet:
        return self.filter(owner=owner)

    def by_model(self) -> Any:
        """Totals per provider and model (rows of dicts)."""
        return self.values("provider", "model").annotate(**_TOTALS).order_by("provider", "model")

    def by_period(self, period: str = "day") -> Any:
        """Totals per ``period`` ("day", "week" or "month"), oldest first."""
        trunc = {"day": TruncDay, "week": TruncWeek, "month": TruncMonth}[period]
        return (
            self.annotate(period=trunc("created_at"))
            .values("period")
            .annotate(**_TOTALS)
            .order_by("period")
        )

    def totals(self) -> dict[str, Any]:
        """Token sums, the known cost, and attempts by status."""
        return self.aggregate(
            input_tokens=Sum("input_tokens", default=0),
            output_tokens=Sum("output_tokens", default=0),
            cached_tokens=Sum("cached_tokens", default=0),
            reasoning_tokens=Sum("reasoning_tokens", default=0),
            cost=Sum("cost", default=Decimal(0)),
            attempts=Count("id"),
            failed=Count("id", filter=Q(status=UsageStatus.FAILED)),
            cancelled=Count("id", filter=Q(status=UsageStatus.CANCELLED)),
        )


class AbstractUsage(models.Model):
    """One provider attempt: tokens, cost when the price is known, and how it ended."""

    provider = models.CharField(_("provider"), max_length=100, blank=True)
    model = models.CharField(_("model"), max_length=200, blank=True)
    status = models.CharField(_("status"), max_length=20, choices=UsageStatus.choices)
    input_tokens = models.PositiveIntegerField(_("input tokens"), default=0)
    output_tokens = models.PositiveIntegerField(_("output tokens"), default=0)
    cached_tokens = models.PositiveIntegerField(_("cached tokens"), default=0)
    reasoning_tokens = models.PositiveIntegerField(_("reasoning tokens"), default=0)
    cost = models.DecimalField(_("cost"), max_digits=14, decimal_places=8, null=True, blank=True)
    error = models.TextField(_("error"), blank=True)
    duration_ms = models.PositiveIntegerField(_("duration (ms)"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), default=timezone.now, editable=False)

    objects = UsageQuerySet.as_manager()

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"{self.model} {self.status} ({self.input_tokens}+{self.output_tokens} tokens)"


class Chat(AbstractChat):
    #: for a subagent's chat: the chat that handed it the task, and that tool call.
    parent = models.ForeignKey(
        "self",
        verbose_name=_("parent chat"),
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="children",
    )
    parent_tool_call = models.OneToOneField(
        "ToolCall",
        verbose_name=_("parent tool call"),
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="child_chat",
    )

    class Meta(AbstractChat.Meta):
        abstract = False
        verbose_name = _("chat")
        verbose_name_plural = _("chats")
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["state"], name="agentloop_chat_state_idx"),
            models.Index(fields=["owner", "-created_at"], name="agentloop_chat_owner_idx"),
            models.Index(fields=["lease_expires_at"], name="agentloop_chat_lease_idx"),
            models.Index(fields=["-created_at"], name="agentloop_chat_created_idx"),
        ]


class Message(AbstractMessage):
    chat = models.ForeignKey(
        Chat, verbose_name=_("chat"), on_delete=models.CASCADE, related_name="messages"
    )
    #: for a tool message, the call it answers (one result per call, enforced).
    tool_call = models.OneToOneField(
        "ToolCall",
        verbose_name=_("tool call"),
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="result",
    )

    class Meta(AbstractMessage.Meta):
        abstract = False
        verbose_name = _("message")
        verbose_name_plural = _("messages")
        ordering = ["id"]
        indexes = [models.Index(fields=["chat", "id"], name="agentloop_message_chat_idx")]


class ToolCall(AbstractToolCall):
    chat = models.ForeignKey(
        Chat, verbose_name=_("chat"), on_delete=models.CASCADE, related_name="tool_calls"
    )
    message = models.ForeignKey(
        Message, verbose_name=_("message"), on_delete=models.CASCADE, related_name="tool_calls"
    )

    class Meta(AbstractToolCall.Meta):
        abstract = False
        verbose_name = _("tool call")
        verbose_name_plural = _("tool calls")
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["chat", "call_id"], name="agentloop_toolcall_unique_call_id"
            )
        ]


class Usage(AbstractUsage):
    chat = models.ForeignKey(
        Chat,
        verbose_name=_("chat"),
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="usage_records",
    )
    message = models.ForeignKey(
        Message,
        verbose_name=_("message"),
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="usage_records",
    )
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name=_("owner"),
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="agentloop_usage",
    )

    class Meta(AbstractUsage.Meta):
        abstract = False
        verbose_name = _("usage")
        verbose_name_plural = _("usage")
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["owner", "created_at"], name="agentloop_usage_owner_idx"),
            models.Index(fields=["chat", "created_at"], name="agentloop_usage_chat_idx"),
        ]


# -- batches ----------------------------------------------------------------------------------
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

    provider = models.CharField(_("provider"), max_length=100)
    #: the model of every request, or blank when the batch mixes models.
    model = models.CharField(_("model"), max_length=200, blank=True)
    provider_batch_id = models.CharField(_("provider batch id"), max_length=200, blank=True)
    status = models.CharField(
        _("status"), max_length=20, choices=BatchStatus.choices, default=BatchStatus.CREATED
    )
    #: chats whose answers ask for tools run them and go into the next batch.
    auto_continue = models.BooleanField(_("continue in batches"), default=False)
    request_count = models.PositiveIntegerField(_("requests"), default=0)
    processing_count = models.PositiveIntegerField(_("processing"), default=0)
    succeeded_count = models.PositiveIntegerField(_("succeeded"), default=0)
    failed_count = models.PositiveIntegerField(_("failed"), default=0)
    error = models.TextField(_("error"), blank=True)
    provider_data = models.JSONField(_("provider data"), default=dict, blank=True)
    #: one poller at a time: a claim (token + expiry) taken with a conditional UPDATE.
    claim_token = models.CharField(_("claim token"), max_length=32, blank=True, editable=False)
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
    previous = models.ForeignKey(
        "self",
        verbose_name=_("previous batch"),
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="next_batches",
    )

    class Meta(AbstractBatch.Meta):
        abstract = False
        verbose_name = _("batch")
        verbose_name_plural = _("batches")
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["collected_at", "status"], name="agentloop_batch_open_idx"),
        ]

    def refresh(self) -> Batch:
        """Poll the provider now; collect the results if the batch has ended."""
        from .batches import refresh

        return refresh(self)

    def cancel(self) -> Batch:
        """Ask the provider to stop the batch; answers already given are still collected."""
        from .batches import cancel

        return cancel(self)


class BatchItem(models.Model):
    """One chat's request in a batch, and what became of it."""

    batch = models.ForeignKey(
        Batch, verbose_name=_("batch"), on_delete=models.CASCADE, related_name="items"
    )
    chat = models.ForeignKey(
        Chat, verbose_name=_("chat"), on_delete=models.CASCADE, related_name="batch_items"
    )
    custom_id = models.CharField(_("custom id"), max_length=64)
    model = models.CharField(_("model"), max_length=200)
    status = models.CharField(
        _("status"),
        max_length=20,
        choices=BatchItemStatus.choices,
        default=BatchItemStatus.PENDING,
    )
    #: the chat's latest message when the request was made: an answer to anything else
    #: would be out of place, and is discarded.
    after_message = models.ForeignKey(
        Message,
        verbose_name=_("after message"),
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    #: the answer appended to the chat.
    message = models.ForeignKey(
        Message,
        verbose_name=_("answer"),
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    error = models.TextField(_("error"), blank=True)
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

"""Chats: ``ChatState``, ``ChatQuerySet``, the abstract ``AbstractChat`` and the concrete ``Chat``.

``AbstractChat`` holds a chat's configuration and state; its verbs are those of
``chat.conversation`` (a ``Conversation`` over a ``DjangoStore``): generated, one line each,
in ``ConversationDelegations`` (models/delegations.py); the verbs that do more are here.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import models, router, transaction
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from ..agents import subagents
from ..django_store import elicitations
from ..django_store.database import DjangoStore
from ..django_store.fields import (
    StorableCharField,
    StorableJSONField,
    StorableTextField,
    optional_link,
)
from ..django_store.releases import IN_LINE
from ..django_store.sql import PreparedUpdate, get_by_pk
from ..engine import Conversation
from ..engine._transcript_reading import next_move
from ..runners import enqueue
from . import bulk
from .chat_events import ChatEvents
from .delegations import ConversationDelegations


class ChatState(models.TextChoices):
    IDLE = "idle", _("idle")
    QUEUED = "queued", _("queued")
    RUNNING = "running", _("running")
    WAITING = "waiting", _("waiting")
    STOPPED = "stopped", _("stopped")
    FAILED = "failed", _("failed")


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

    def on_model(self, glob: str) -> ChatQuerySet:
        """Chats whose model matches ``glob`` (``"anthropic:*"``; see ``bulk.model_matches``)."""
        return self.filter(bulk.model_matches(glob))

    # -- set-based control (agentloop.models.bulk; docs/bulk-control.md) ---------------------
    # Each takes dry_run=False (count only), batch_size (chats per statement, default 1000)
    # and on_batch (called with each batch's changed keys). Like delete(), on a queryset
    # only: Chat.objects.all().halt(...) says "every chat".
    def cancel(self, **options: Any) -> bulk.BulkResult:
        """``chat.cancel()`` for each chat with a run to cancel, in batches; the counts."""
        return bulk.cancel(self, **options)

    def halt(self, reason: str, **options: Any) -> bulk.BulkResult:
        """``chat.halt(reason)`` for each chat a run is in progress or queued for."""
        return bulk.halt(self, reason, **options)

    def complete_later(self, **options: Any) -> bulk.BulkResult:
        """``chat.complete_later()`` for each chat no run holds (running ones are skipped)."""
        return bulk.complete_later(self, **options)

    def resume(self, **options: Any) -> bulk.BulkResult:
        """The stopped and failed chats go on in the background."""
        return bulk.resume(self, **options)

    def with_model(
        self, model: str, provider: str | None = None, **options: Any
    ) -> bulk.BulkResult:
        """``chat.with_model(model, provider)`` for each chat no run holds now."""
        return bulk.with_model(self, model, provider, **options)

    cancel.queryset_only = True  # type: ignore[attr-defined]
    halt.queryset_only = True  # type: ignore[attr-defined]
    complete_later.queryset_only = True  # type: ignore[attr-defined]
    resume.queryset_only = True  # type: ignore[attr-defined]
    with_model.queryset_only = True  # type: ignore[attr-defined]


class ChatManager(models.Manager.from_queryset(ChatQuerySet)):  # type: ignore[misc]
    """``Chat.objects``: ``get(pk=...)`` alone, what a worker does per job, runs a statement
    compiled once per process (the ORM's SQL, conversions and errors; no query building)."""

    def get(self, *args: Any, **kwargs: Any) -> Any:
        plain = type(self).get_queryset is ChatManager.get_queryset  # no filtering subclass
        if plain and not args and len(kwargs) == 1 and self._db is None:
            ((name, value),) = kwargs.items()
            if name == "pk" or name == self.model._meta.pk.name:
                return get_by_pk(self.model, router.db_for_read(self.model), value)
        return super().get(*args, **kwargs)


def _owner_field(*, db_index: bool) -> Any:
    """A chat's owner (the abstract chat's, and ``Chat``'s without an index of its own)."""
    return optional_link(
        settings.AUTH_USER_MODEL, _("owner"), "%(app_label)s_%(class)s_set", db_index=db_index
    )


class AbstractChat(ConversationDelegations, models.Model):
    """A chat whose configuration and state live on its row; the verbs run the loop."""

    owner = _owner_field(db_index=True)
    title = StorableCharField(_("title"), max_length=200, blank=True)
    model = StorableCharField(_("model"), max_length=200, blank=True)
    provider = StorableCharField(_("provider"), max_length=100, blank=True)
    tools = StorableJSONField(_("tools (import paths)"), default=list, blank=True)
    tool_options = StorableJSONField(_("tool options"), default=dict, blank=True)
    temperature = models.FloatField(_("temperature"), null=True, blank=True)
    max_output_tokens = models.PositiveIntegerField(_("max output tokens"), null=True, blank=True)
    provider_options = StorableJSONField(_("provider options"), default=dict, blank=True)
    headers = StorableJSONField(_("headers"), default=dict, blank=True)
    output_schema = StorableJSONField(_("output schema"), null=True, blank=True)
    schema_path = StorableCharField(_("schema import path"), max_length=300, blank=True)
    limits = StorableJSONField(_("limits per turn"), default=dict, blank=True)
    #: ``with_caching``: {"ttl", "key"}; null when the chat asked for no prompt caching.
    caching = StorableJSONField(_("prompt caching"), null=True, blank=True)
    #: ``with_thinking``: {"effort", "budget_tokens"}; null: the model's default.
    thinking = StorableJSONField(_("thinking"), null=True, blank=True)
    #: ``with_context_window``: the model's context window in tokens; null: the catalog's.
    context_window = models.PositiveIntegerField(_("context window"), null=True, blank=True)
    #: ``with_compaction``: {"at", "keep_recent", "model"}; null: no compaction.
    compaction = StorableJSONField(_("compaction"), null=True, blank=True)
    #: ``with_fallbacks``: models tried in order when the chat's model fails for the step.
    fallbacks = StorableJSONField(_("fallback models"), default=list, blank=True)
    #: ``with_guardrails``: the chat's guardrails (import paths), each stage's in order.
    guardrails = StorableJSONField(
        _("guardrails (import paths)"), default=list, db_default=[], blank=True
    )
    #: ``with_memory``: {"k", "min_similarity", "max_tokens", ...}; null: no recall.
    memory = StorableJSONField(_("memory"), null=True, blank=True)
    agent_path = StorableCharField(_("agent import path"), max_length=300, blank=True)
    #: the inputs the agent's instructions were filled from (re-applied when the code changes).
    agent_inputs = StorableJSONField(_("agent inputs"), default=dict, blank=True)
    #: digest of the agent configuration last applied (see ``agentloop.agents.agent_refresh``).
    agent_digest = StorableCharField(
        _("agent configuration digest"), max_length=64, blank=True, editable=False
    )
    state = StorableCharField(
        _("state"), max_length=20, choices=ChatState.choices, default=ChatState.IDLE
    )
    stop_reason = StorableCharField(_("stop reason"), max_length=300, blank=True)
    #: ``halt(reason)`` asked while a run was in progress: applied before its next model call.
    halt_reason = StorableCharField(_("halt requested"), max_length=250, blank=True)
    #: what went wrong, in one line a user may see (no traceback, no paths).
    error = StorableTextField(_("error"), blank=True)
    #: the traceback behind ``error``, for the admin and the log only.
    error_detail = StorableTextField(_("error details"), blank=True, editable=False)
    #: failed attempts of the current step (transient provider errors, in the background);
    #: kept across re-enqueues, reset by a step that goes through.
    attempts = models.PositiveIntegerField(_("attempts of the current step"), default=0)
    #: the next attempt is due then (the sweeper leaves a queued chat alone until it is).
    retry_at = models.DateTimeField(_("retry at"), null=True, blank=True)
    #: what the chat's next step waits for ("rate limit: openai requests per minute"), until
    #: ``retry_at`` in the background; "" when it waits for nothing. A database default too,
    #: so code deployed before this column (a rolling deploy) still creates chats.
    waiting_for = StorableCharField(
        _("waiting for"), max_length=200, blank=True, default="", db_default="", editable=False
    )
    #: user messages sent while a run held the chat (``ask_later(if_busy="queue")``): each
    #: is added and answered, in order, once the run is over.
    inbox = StorableJSONField(_("queued messages"), default=list, blank=True, editable=False)
    #: the current turn's OpenTelemetry trace context (W3C headers), so every job of the
    #: turn joins its trace (``AGENTLOOP["TRACING"]``); replaced when a turn starts.
    trace_context = StorableJSONField(_("trace context"), default=dict, blank=True, editable=False)
    cancel_requested_at = models.DateTimeField(_("cancel requested at"), null=True, blank=True)
    #: the one worker allowed to write (see agentloop.django_store.leases).
    lease_token = StorableCharField(_("lease token"), max_length=64, blank=True, editable=False)
    lease_expires_at = models.DateTimeField(_("lease expires at"), null=True, blank=True)
    #: the process holding the lease, "<host>/<boot>:<pid>:<start time>": a claimant on the
    #: same host takes the chat at once when that process is gone. A database default too, so
    #: code deployed before this column (a rolling deploy) still creates chats.
    lease_holder = StorableCharField(
        _("lease holder"), max_length=255, blank=True, default="", db_default="", editable=False
    )
    #: when a message was last edited or an answer regenerated (rows superseded); null: never.
    edited_at = models.DateTimeField(_("edited at"), null=True, blank=True, editable=False)
    created_at = models.DateTimeField(_("created at"), default=timezone.now, editable=False)
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    objects = ChatManager()

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
            store = DjangoStore(self, send_next=self._send_next, send_job=self._send_job)
            cached = Conversation(store, owner=self, listener=ChatEvents(self))
            self.__dict__["_conversation"] = cached
        return cached

    async def acancel(self) -> bool:
        """``cancel`` for async code; the same answer."""
        return await sync_to_async(self.cancel)()

    def cancel(self) -> bool:
        """Request cancellation: one UPDATE, seen by the run wherever it is.

        True when a run was in progress, queued or waiting for a person (subagent chats
        still running for this one are cancelled too, and those waiting for a person have
        their held calls cancelled); False, and nothing set, when no run was: a later
        message never inherits a cancel.
        """
        cancelled = self.conversation.cancel()
        if cancelled and self.state == ChatState.QUEUED and self.waiting_for.endswith(IN_LINE):
            # In line for a chats-in-flight place (as loaded), it has no job in flight to see
            # the cancel: one is sent (should it have left the line meanwhile, a second job
            # finds it held or moved on).
            enqueue(self.pk, self._meta.label, using=self._state.db)
        if cancelled and self.state not in (ChatState.QUEUED, ChatState.RUNNING):
            # No worker will come back to record this cancel (its "cancelled" hook does that
            # for a run): the subagents it waits for that wait for a person are cancelled now.
            subagents.cancel_waiting_children(self)
        return cancelled

    # people in the loop (a parent also finds the calls of the subagents it waits for)
    def pending_approvals(self) -> list[Any]:
        """Tool calls (``ToolCall`` rows) waiting for approval, its subagents' included."""
        own = self.conversation.pending_approvals()
        return own + subagents.pending_in_children(self, "pending_approvals")

    def pending_questions(self) -> list[Any]:
        """Tool calls waiting for a person's answer (``.question``), its subagents' included,
        and calls whose MCP server waits for one (``wait_reason == "elicitation"``)."""
        own = self.conversation.pending_questions() + self._servers_questions()
        return own + subagents.pending_in_children(self, "pending_questions")

    def _own_calls(self) -> Any:
        """This chat's ``ToolCall`` rows (of its own tool call model), on its database."""
        model: Any = self._meta.get_field("tool_calls").related_model
        using = self._state.db or "default"
        return model._default_manager.using(using).filter(chat_id=self.pk)

    def _servers_questions(self) -> list[Any]:
        if self.pk is None:
            return []
        return elicitations.pending_questions(self._own_calls())

    def question_desk(self, tool_call_key: Any) -> elicitations.QuestionDesk:
        """Where an MCP server's questions during call ``tool_call_key`` are written and
        their answers read, by the process running the call (docs/mcp.md)."""
        return elicitations.QuestionDesk(self._own_calls(), tool_call_key)

    def approve(
        self, tool_call_id: Any, by: Any = None, arguments: dict[str, Any] | None = None
    ) -> None:
        """Approve a waiting call (by call id, pk or row) for exactly its arguments, or for
        ``arguments`` edited by the approver (``InvalidArgumentsError`` when its tool's
        ``Params`` refuse them; nothing is written); the model's are kept."""
        subagents.decide(self, "approve", tool_call_id, by=by, arguments=arguments)

    def deny(self, tool_call_id: Any, reason: str = "", by: Any = None) -> Any:
        """Deny a waiting call: the model gets an error result saying so."""
        return subagents.decide(self, "deny", tool_call_id, reason=reason, by=by)

    def answer(self, tool_call_id: Any, text: str, by: Any = None) -> Any:
        """Answer a waiting call's question; the answer is the call's result.

        For a question an MCP server asks while its call runs, ``text`` is the content it
        asked for, a JSON object (a dict is taken too), and goes back to the server, which
        then finishes the call; content its schema refuses raises ``InvalidAnswerError``
        (one line; nothing written, the question still waits)."""
        asked = elicitations.find_question(self._own_calls(), tool_call_id)
        if asked is not None:
            elicitations.respond(asked, "accept", text, by=by)
            return None
        return subagents.decide(self, "answer", tool_call_id, text=text, by=by)

    def decline(self, tool_call_id: Any, by: Any = None, action: str = "decline") -> None:
        """Refuse to answer an MCP server's question (``action="cancel"``: dismiss it without
        a choice); the server hears so and finishes the call its own way."""
        asked = elicitations.find_question(self._own_calls(), tool_call_id)
        if asked is None:
            raise elicitations.not_a_question(tool_call_id)
        elicitations.respond(asked, action, by=by)

    def submit_result(self, tool_call_id: Any, content: Any, error: bool = False) -> Any:
        """Give a deferred tool's call its result (a webhook, an operator's system); a chat a
        worker left waiting goes on. A second submit gets ``DecisionConflictError``."""
        return subagents.decide(self, "submit_result", tool_call_id, content=content, error=error)

    def resume_if_waiting(self) -> None:
        """A chat a worker left waiting continues in the background once nothing holds it
        (after a decision, or a subagent's answer).

        Conditional: only a waiting chat no worker holds is queued, so this and a worker
        finishing its step at the same moment never both enqueue (the worker queues it
        itself when it sees the decision: ``DjangoStore`` releases)."""
        if next_move(self.conversation.messages) not in ("tools", "generate"):
            return
        queued = (
            type(self)
            ._default_manager.filter(pk=self.pk, state=ChatState.WAITING, lease_token="")
            .update(state=ChatState.QUEUED, updated_at=timezone.now())
        )
        if queued:
            self.state = ChatState.QUEUED
            enqueue(self.pk, self._meta.label, using=self._state.db)

    def _send_next(self) -> None:
        """Send this chat's next background job (after the current transaction commits)."""
        enqueue(self.pk, self._meta.label, using=self._state.db or "default")

    def _send_job(self, model_label: str, chat_key: str) -> None:
        """Send a step of another chat (of this database): one whose turn in line for a
        place of a chats-in-flight quota came when this one freed it."""
        enqueue(chat_key, model_label, using=self._state.db or "default")

    def complete_later(self) -> AbstractChat:
        """Run the conversation in the background, one step per job, from the next commit.

        Also the way to resume a failed or stopped chat (after raising its limits).
        """
        if self.pk is None:
            self.save()
        queued = {
            "state": ChatState.QUEUED, "error": "", "attempts": 0, "retry_at": None,
            "updated_at": timezone.now(),
        }  # fmt: skip
        if _queue_unless_running(type(self), self.pk, queued):
            for name, value in queued.items():
                setattr(self, name, value)
        else:  # running (or gone): as it is now
            self.refresh_from_db(fields=["state", "error", "attempts", "retry_at", "updated_at"])
        enqueue(self.pk, self._meta.label, using=self._state.db)
        return self


#: by chat model: ``complete_later``'s UPDATE, built once (a turn's first statement).
_QUEUE_UNLESS_RUNNING: dict[Any, PreparedUpdate] = {}


def _queue_unless_running(chat_model: Any, pk: Any, queued: dict[str, Any]) -> int:
    """``chat_model.objects.filter(pk=pk).exclude(state="running").update(**queued)``: the
    same UPDATE, without building the queryset, when the manager is ``ChatManager``'s own."""
    manager = chat_model.objects
    if type(manager).get_queryset is not ChatManager.get_queryset or manager._db is not None:
        # A manager of the project's own may filter: its query, as it is.
        rows = manager.filter(pk=pk).exclude(state=ChatState.RUNNING)
        return int(rows.update(**queued))
    update = _QUEUE_UNLESS_RUNNING.get(chat_model)
    if update is None:
        # ``state`` is never NULL: ``<>`` is what ``exclude(state=...)`` compiles to.
        update = _QUEUE_UNLESS_RUNNING[chat_model] = PreparedUpdate(
            chat_model, tuple(queued), ((chat_model._meta.pk.name, "="), ("state", "<>"))
        )
    using = router.db_for_write(chat_model)
    with transaction.mark_for_rollback_on_error(using):  # as QuerySet.update()
        return update.run(using, list(queued.values()), [pk, ChatState.RUNNING])


class Chat(AbstractChat):
    #: (owner, -created_at) below serves owner lookups: one index less to write per claim.
    owner = _owner_field(db_index=False)
    #: for a subagent's chat: the chat that handed it the task, and that tool call.
    parent = optional_link("self", _("parent chat"), "children", models.CASCADE)
    parent_tool_call = optional_link(
        "ToolCall", _("parent tool call"), "child_chat", field=models.OneToOneField
    )
    #: for a fork (``chat.fork(at=message)``): the chat it was copied from, and that message.
    forked_from = optional_link("self", _("forked from"), "forks")
    forked_from_message = optional_link("Message", _("forked at message"), "+")

    class Meta(AbstractChat.Meta):
        verbose_name = _("chat")
        verbose_name_plural = _("chats")
        ordering = ["-created_at"]
        indexes = [
            # The settled states people look for (admin filters, ``failed()``...); partial,
            # so a claim (running) or a release to idle writes no entry into it.
            models.Index(
                fields=["state"],
                name="agentloop_chat_settled_idx",
                condition=models.Q(state__in=["waiting", "stopped", "failed"]),
            ),
            models.Index(fields=["owner", "-created_at"], name="agentloop_chat_owner_idx"),
            # The sweeper's scan (lease expiry included): only the few chats in flight.
            models.Index(
                fields=["state", "updated_at"],
                name="agentloop_chat_inflight_idx",
                condition=models.Q(state__in=["queued", "running"]),
            ),
            models.Index(fields=["-created_at"], name="agentloop_chat_created_idx"),
        ]

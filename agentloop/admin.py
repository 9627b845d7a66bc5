"""Admin: a chat's change page is a timeline of its transcript; the list scales to many chats.

Both pages cost a constant number of queries: the list annotates its counts and totals as
subqueries (no query per row), and the timeline reads the messages, the tool calls (with
who decided them and their subagent chats) and the usage in one query each, whatever the
length of the transcript. ``tests/test_admin.py`` asserts the figures.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Count, Exists, OuterRef, Q, QuerySet, Subquery, Sum
from django.db.models.functions import Coalesce
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from .exceptions import ToolCallNotWaitingError
from .messages import MessageStatus, ToolCallState
from .models import Chat, ChatState, Message, ToolCall, Usage, UsageStatus

__all__ = ["ChatAdmin", "Timeline", "build_timeline"]

#: the reason a denial from the admin gives the model when the reviewer typed none.
DEFAULT_DENY_REASON = "Denied by a reviewer in the admin."

WAIT_LABELS = {
    "approval": _("waiting for approval"),
    "question": _("waiting for an answer"),
    "subagent": _("waiting for its subagent"),
}
DECIDED_MESSAGES = {
    "approve": _("Approved: the tool call runs at the chat's next step."),
    "deny": _("Denied: the model is told so."),
    "answer": _("Answered: the answer is the tool call's result."),
}
DECISION_LABELS = {
    "approved": _("approved"),
    "denied": _("denied"),
    "answered": _("answered"),
}


def _related_model(model: Any, name: str) -> Any:
    """The model behind a chat's reverse relation (``messages``, ``tool_calls``, ...)."""
    return model._meta.get_field(name).related_model


def _has_field(model: Any, name: str) -> bool:
    return any(field.name == name for field in model._meta.get_fields())


def format_cost(value: Decimal | None) -> str:
    """US dollars, to the micro-dollar, without trailing zeros; "—" when unknown."""
    if value is None:
        return "—"
    amount = Decimal(value).quantize(Decimal("0.000001")).normalize()
    return f"${amount:f}"


def _pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


# -- the timeline -----------------------------------------------------------------------------
@dataclass
class CallEntry:
    """A tool call with its result row, its subagent chat and what the page says about it."""

    call: Any
    arguments: str
    result: Any = None
    child: Any = None
    child_url: str = ""
    decide_url: str = ""

    @property
    def state_label(self) -> str:
        if self.call.state == ToolCallState.WAITING:
            return str(WAIT_LABELS.get(self.call.wait_reason, _("waiting")))
        return str(self.call.state)

    @property
    def decision_label(self) -> str:
        return str(DECISION_LABELS.get(self.call.decision, self.call.decision))

    @property
    def duration(self) -> str:
        """How long the tool ran, when it ran: "17 ms", "2.4 s", "3 min 5 s"."""
        if not (self.call.started_at and self.call.finished_at):
            return ""
        seconds = (self.call.finished_at - self.call.started_at).total_seconds()
        if seconds < 1:
            return f"{seconds * 1000:.0f} ms"
        if seconds < 60:
            return f"{seconds:.1f} s"
        return f"{seconds // 60:.0f} min {seconds % 60:.0f} s"

    @property
    def error_summary(self) -> str:
        """The last line of the stored traceback: the exception and its message."""
        lines = [line for line in self.call.error.strip().splitlines() if line.strip()]
        return lines[-1].strip() if lines else ""


@dataclass
class Entry:
    """A message of the transcript; an assistant's tool calls (and their results) hang off it."""

    message: Any
    calls: list[CallEntry] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    parsed: str = ""

    @property
    def usage_cost(self) -> str:
        """The cost of this message's attempts; "" when no price is known."""
        if not self.usage or self.usage["cost"] is None:
            return ""
        return format_cost(self.usage["cost"])


@dataclass
class Timeline:
    """A chat's transcript in order, with usage per message and for the whole chat."""

    chat: Any
    entries: list[Entry]
    totals: dict[str, Any]
    message_count: int
    pending_approvals: int = 0
    pending_questions: int = 0

    @property
    def total_cost(self) -> str:
        return format_cost(self.totals["cost"])


_USAGE_SUMS: dict[str, Any] = {
    "input_tokens": Sum("input_tokens", default=0),
    "output_tokens": Sum("output_tokens", default=0),
    "cached_tokens": Sum("cached_tokens", default=0),
    "reasoning_tokens": Sum("reasoning_tokens", default=0),
    # Null when no attempt of the group had a known price (not $0). Not named "cost": the
    # "unpriced" filter below must see the field, not this sum.
    "known_cost": Sum("cost"),
    "attempts": Count("id"),
    "failed": Count("id", filter=Q(status=UsageStatus.FAILED)),
    "cancelled": Count("id", filter=Q(status=UsageStatus.CANCELLED)),
    "unpriced": Count("id", filter=Q(cost__isnull=True)),
}


def _sum_usage(rows: list[dict[str, Any]]) -> dict[str, Any]:
    totals: dict[str, Any] = dict.fromkeys(_USAGE_SUMS, 0)
    for row in rows:
        for name in _USAGE_SUMS:
            if name != "known_cost":
                totals[name] += row[name]
    costs = [row["cost"] for row in rows if row["cost"] is not None]
    totals["cost"] = sum(costs, Decimal(0)) if costs else None
    del totals["known_cost"]
    return totals


def build_timeline(
    chat: Any, *, url_for_chat: Any = None, url_for_decision: Any = None
) -> Timeline:
    """Read a chat's transcript for display: three queries, whatever its length.

    ``url_for_chat(pk)`` links a subagent's chat, ``url_for_decision(call)`` is where the
    approve/deny/answer buttons of a waiting call post; without them there are no links.
    """
    chat_model = type(chat)
    tool_call_model = _related_model(chat_model, "tool_calls")
    rows = list(chat.messages.order_by("id").defer("provider_data"))
    calls = chat.tool_calls.order_by("id").select_related("decided_by").defer("provider_data")
    with_children = _has_field(tool_call_model, "child_chat")
    if with_children:
        calls = calls.select_related("child_chat")
    usage_rows = list(chat.usage_records.order_by().values("message_id").annotate(**_USAGE_SUMS))
    for row in usage_rows:
        row["cost"] = row.pop("known_cost")
    usage_by_message = {row["message_id"]: row for row in usage_rows if row["message_id"]}
    results = {row.tool_call_id: row for row in rows if row.tool_call_id is not None}

    calls_by_message: dict[Any, list[CallEntry]] = defaultdict(list)
    call_pks = set()
    timeline = Timeline(chat, [], _sum_usage(usage_rows), len(rows))
    for call in calls:
        call_pks.add(call.pk)
        child = getattr(call, "child_chat", None) if with_children else None
        entry = CallEntry(call, _pretty_json(call.arguments), results.get(call.pk), child)
        if child is not None and url_for_chat is not None:
            entry.child_url = url_for_chat(child.pk)
        if call.state == ToolCallState.WAITING and call.pk not in results:
            if call.wait_reason == "approval":
                timeline.pending_approvals += 1
            elif call.wait_reason == "question":
                timeline.pending_questions += 1
            if url_for_decision is not None and call.wait_reason in ("approval", "question"):
                entry.decide_url = url_for_decision(call)
        calls_by_message[call.message_id].append(entry)

    for row in rows:
        if row.tool_call_id in call_pks:
            continue  # a tool result is shown under the call it answers
        timeline.entries.append(
            Entry(
                row,
                calls_by_message.get(row.pk, []),
                usage_by_message.get(row.pk),
                _pretty_json(row.parsed) if row.parsed is not None else "",
            )
        )
    return timeline


# -- list filters -----------------------------------------------------------------------------
def _holding(queryset: QuerySet[Any], reason: str | None) -> QuerySet[Any]:
    """The chats with a tool call waiting for ``reason`` (approval, question, subagent; None:
    any of them)."""
    tool_calls = _related_model(queryset.model, "tool_calls").objects
    held = tool_calls.filter(chat=OuterRef("pk"), state=ToolCallState.WAITING)
    if reason is not None:
        held = held.filter(wait_reason=reason)
    return queryset.filter(Exists(held))


class WaitingFilter(admin.SimpleListFilter):
    """Chats held by a person or a subagent, by what holds them."""

    title = _("waiting for")
    parameter_name = "waiting_for"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [
            ("approval", _("an approval")),
            ("question", _("an answer")),
            ("subagent", _("a subagent")),
            ("any", _("anything")),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        if value is None:
            return None
        # By the tool calls, not the chat's state: a chat driven in-process that stopped at
        # an approval keeps its state ("idle") while its call waits.
        return _holding(queryset, None if value == "any" else value)


class ProblemFilter(admin.SimpleListFilter):
    """Chats where something went wrong: a provider failure, a limit, a tool, a cancel."""

    title = _("went wrong")
    parameter_name = "problem"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [
            ("failed", _("failed (provider error)")),
            ("stopped", _("stopped by a limit")),
            ("tool_failed", _("a tool failed")),
            ("cancelled", _("cancelled")),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        model = queryset.model
        tool_calls = _related_model(model, "tool_calls").objects.filter(chat=OuterRef("pk"))
        if value == "failed":
            return queryset.filter(state=ChatState.FAILED)
        if value == "stopped":
            return queryset.filter(state=ChatState.STOPPED)
        if value == "tool_failed":
            failed = tool_calls.filter(state=ToolCallState.FAILED).exclude(decision="denied")
            return queryset.filter(Exists(failed))
        if value == "cancelled":
            messages_ = _related_model(model, "messages").objects.filter(chat=OuterRef("pk"))
            return queryset.filter(
                Exists(messages_.filter(status=MessageStatus.CANCELLED))
                | Exists(tool_calls.filter(state=ToolCallState.CANCELLED))
            )
        return None


class OwnerFilter(admin.SimpleListFilter):
    """Mine, nobody's, or one owner (picked by clicking an owner in the list).

    Listing every owner would load every user; this reads one user, and only when one is
    chosen.
    """

    title = _("owner")
    parameter_name = "owner"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        choices: list[tuple[str, Any]] = [("mine", _("mine")), ("none", _("nobody"))]
        value = self.value()
        if value and value not in ("mine", "none"):
            owner_model = model_admin.model._meta.get_field("owner").related_model
            try:
                owner = owner_model._default_manager.filter(pk=value).first()
            except (ValueError, ValidationError):
                owner = None
            if owner is not None:
                choices.append((value, str(owner)))
        return choices

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        if value is None:
            return None
        if value == "mine":
            return queryset.filter(owner_id=request.user.pk)
        if value == "none":
            return queryset.filter(owner__isnull=True)
        try:
            return queryset.filter(owner_id=value)
        except (ValueError, ValidationError) as exc:
            raise IncorrectLookupParameters(exc) from exc


# -- actions ----------------------------------------------------------------------------------
@admin.action(description=_("Cancel the running step"), permissions=["change"])
def cancel_chats(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    chats = list(queryset)
    for chat in chats:
        chat.cancel()  # also wakes a run in this process, or any worker when Redis is set
        modeladmin.log_change(request, chat, "Cancellation requested.")
    modeladmin.message_user(request, gettext("Cancellation requested for %d chat(s).") % len(chats))


@admin.action(description=_("Resume in the background"), permissions=["change"])
def resume_chats(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    chats = list(queryset)
    for chat in chats:
        chat.complete_later()
        modeladmin.log_change(request, chat, "Queued to resume in the background.")
    modeladmin.message_user(request, gettext("%d chat(s) queued.") % len(chats))


def _decide_all(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet, verb: str
) -> None:
    decided = chats = 0
    for chat in _holding(queryset, "approval"):
        done = 0
        for call in chat.pending_approvals():
            try:
                if verb == "approve":
                    chat.approve(call.pk, by=request.user)
                else:
                    chat.deny(call.pk, reason=DEFAULT_DENY_REASON, by=request.user)
            except ToolCallNotWaitingError:
                continue  # decided meanwhile by someone else
            done += 1
            past = "Approved" if verb == "approve" else "Denied"
            modeladmin.log_change(request, chat, f"{past} tool call {call.name} ({call.call_id}).")
        decided += done
        chats += bool(done)
    text = (
        gettext("Approved %(calls)d tool call(s) in %(chats)d chat(s).")
        if verb == "approve"
        else gettext("Denied %(calls)d tool call(s) in %(chats)d chat(s).")
    )
    level = messages.SUCCESS if decided else messages.WARNING
    modeladmin.message_user(request, text % {"calls": decided, "chats": chats}, level)


@admin.action(description=_("Approve the tool calls waiting for approval"), permissions=["change"])
def approve_pending(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    _decide_all(modeladmin, request, queryset, "approve")


@admin.action(description=_("Deny the tool calls waiting for approval"), permissions=["change"])
def deny_pending(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    _decide_all(modeladmin, request, queryset, "deny")


# -- the chat admin ---------------------------------------------------------------------------
CONFIG_FIELDS = (
    "model", "provider", "agent_path", "tools", "tool_options", "temperature",
    "max_output_tokens", "limits", "provider_options", "headers", "output_schema", "schema_path",
)  # fmt: skip


class ChatAdmin(admin.ModelAdmin):
    """Chats: a list that scales, and a change page that reads as a timeline.

    Works for any chat model built from ``AbstractChat`` (register it with this class);
    subagent links appear when the model has ``parent``/``parent_tool_call`` like ``Chat``.
    """

    change_form_template = "admin/agentloop/chat/change_form.html"
    actions = [cancel_chats, resume_chats, approve_pending, deny_pending]
    list_display = (
        "chat", "owner_link", "model", "state_badge", "waiting_for", "last_activity",
        "message_count", "cost",
    )  # fmt: skip
    list_filter = ("state", WaitingFilter, ProblemFilter, "model", OwnerFilter)
    search_fields = ("title", "model", "owner__username")
    list_select_related = ("owner",)
    date_hierarchy = "created_at"
    # Counting 10,000+ rows twice per page is waste: show "n results" of the filter only.
    show_full_result_count = False
    raw_id_fields = ("owner",)
    readonly_fields = (
        "state", "subagent_of", "cancel_requested_at", "lease_expires_at", "created_at",
    )  # fmt: skip

    class Media:
        css = {"all": ["agentloop/admin/timeline.css"]}

    # -- queries ----------------------------------------------------------------------------
    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        """Chats with their list columns as subqueries: one SELECT for a page of rows."""
        queryset = super().get_queryset(request)
        model = queryset.model
        messages_ = _related_model(model, "messages").objects.filter(chat=OuterRef("pk")).order_by()
        usage = _related_model(model, "usage_records").objects.filter(chat=OuterRef("pk"))
        waiting = _related_model(model, "tool_calls").objects.filter(
            chat=OuterRef("pk"), state=ToolCallState.WAITING
        )
        return queryset.annotate(
            message_count=Coalesce(
                Subquery(messages_.values("chat").annotate(count=Count("pk")).values("count")), 0
            ),
            last_activity=Coalesce(
                Subquery(messages_.order_by("-id").values("created_at")[:1]), "created_at"
            ),
            total_cost=Subquery(
                usage.order_by().values("chat").annotate(total=Sum("cost")).values("total")
            ),
            waiting_reason=Subquery(waiting.order_by("id").values("wait_reason")[:1]),
        )

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> Any:
        queryset = self.get_queryset(request).select_related("owner")
        if _has_field(self.model, "parent"):
            queryset = queryset.select_related("parent", "parent_tool_call")
        model = queryset.model
        pk_field = model._meta.pk if from_field is None else model._meta.get_field(from_field)
        try:
            return queryset.get(**{pk_field.name: pk_field.to_python(object_id)})
        except (model.DoesNotExist, ValidationError, ValueError):
            return None

    # -- list columns -----------------------------------------------------------------------
    @admin.display(description=_("chat"), ordering="title")
    def chat(self, obj: Any) -> str:
        return str(obj)

    @admin.display(description=_("owner"), ordering="owner__username")
    def owner_link(self, obj: Any) -> str:
        if obj.owner_id is None:
            return "—"
        return format_html('<a href="?owner={}">{}</a>', obj.owner_id, obj.owner)

    @admin.display(description=_("state"), ordering="state")
    def state_badge(self, obj: Any) -> str:
        return format_html(
            '<span class="agentloop-badge agentloop-state-{}">{}</span>',
            obj.state,
            obj.get_state_display(),
        )

    @admin.display(description=_("waiting for"))
    def waiting_for(self, obj: Any) -> str:
        reason = getattr(obj, "waiting_reason", None)
        return str(WAIT_LABELS.get(reason, reason)) if reason else "—"

    @admin.display(description=_("last activity"), ordering="last_activity")
    def last_activity(self, obj: Any) -> Any:
        return obj.last_activity

    @admin.display(description=_("messages"), ordering="message_count")
    def message_count(self, obj: Any) -> int:
        return int(obj.message_count)

    @admin.display(description=_("cost"), ordering="total_cost")
    def cost(self, obj: Any) -> str:
        return format_cost(obj.total_cost)

    # -- the change page --------------------------------------------------------------------
    @admin.display(description=_("subagent of"))
    def subagent_of(self, obj: Any) -> str:
        parent = getattr(obj, "parent", None)
        if parent is None:
            return "—"
        return format_html(
            '<a href="{}">{}</a> ({})', self._chat_url(parent.pk), parent, obj.parent_tool_call
        )

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        summary: list[Any] = ["title", "owner"]
        if obj is not None:
            summary.append("state")
            if getattr(obj, "parent_id", None):
                summary.append("subagent_of")
        return [
            (None, {"fields": summary}),
            (_("Configuration"), {"classes": ["collapse"], "fields": CONFIG_FIELDS}),
            (
                _("Run"),
                {
                    "classes": ["collapse"],
                    "fields": ["cancel_requested_at", "lease_expires_at", "created_at"],
                },
            ),
        ]

    def _chat_url(self, pk: Any) -> str:
        opts = self.opts
        return reverse(
            f"admin:{opts.app_label}_{opts.model_name}_change",
            args=[pk],
            current_app=self.admin_site.name,
        )

    def _decide_url(self, call: Any) -> str:
        opts = self.opts
        return reverse(
            f"admin:{opts.app_label}_{opts.model_name}_decide",
            args=[call.chat_id, call.pk],
            current_app=self.admin_site.name,
        )

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Any = None,
    ) -> Any:
        if obj is not None and obj.pk is not None:
            can_decide = self.has_change_permission(request, obj)
            context["timeline"] = build_timeline(
                obj,
                url_for_chat=self._chat_url,
                url_for_decision=self._decide_url if can_decide else None,
            )
            context["can_decide"] = can_decide
        return super().render_change_form(request, context, add, change, form_url, obj)

    # -- approve, deny or answer one call from the timeline --------------------------------------
    def get_urls(self) -> list[URLPattern]:
        opts = self.opts
        decide = path(
            "<path:object_id>/decide/<str:call_pk>/",
            self.admin_site.admin_view(self.decide_view),
            name=f"{opts.app_label}_{opts.model_name}_decide",
        )
        return [decide, *super().get_urls()]

    def decide_view(self, request: HttpRequest, object_id: str, call_pk: str) -> HttpResponse:
        """POST ``decision`` = approve, deny (``reason-<pk>``) or answer (``answer-<pk>``)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        chat = self.get_object(request, object_id)
        if chat is None:
            raise Http404("No such chat.")
        if not self.has_change_permission(request, chat):
            raise PermissionDenied
        decision = request.POST.get("decision")
        try:
            if decision == "approve":
                chat.approve(call_pk, by=request.user)
            elif decision == "deny":
                reason = request.POST.get(f"reason-{call_pk}", "").strip()
                chat.deny(call_pk, reason=reason or DEFAULT_DENY_REASON, by=request.user)
            elif decision == "answer":
                text = request.POST.get(f"answer-{call_pk}", "").strip()
                if not text:
                    self.message_user(request, gettext("Type an answer first."), messages.ERROR)
                    return HttpResponseRedirect(self._chat_url(chat.pk) + f"#call-{call_pk}")
                chat.answer(call_pk, text, by=request.user)
            else:
                return HttpResponseBadRequest("decision must be approve, deny or answer")
        except ToolCallNotWaitingError as exc:
            self.message_user(request, str(exc), messages.ERROR)
        else:
            past = {"approve": "Approved", "deny": "Denied", "answer": "Answered"}[decision]
            self.log_change(request, chat, f"{past} tool call {call_pk}.")
            self.message_user(request, DECIDED_MESSAGES[decision])
        return HttpResponseRedirect(self._chat_url(chat.pk) + f"#call-{call_pk}")


admin.site.register(Chat, ChatAdmin)


@admin.register(ToolCall)
class ToolCallAdmin(admin.ModelAdmin):
    list_display = ("id", "chat", "name", "call_id", "state", "wait_reason", "decision",
                    "started_at", "finished_at")  # fmt: skip
    list_filter = ("state", "wait_reason", "decision", "name")
    list_select_related = ("chat",)
    search_fields = ("name", "call_id")
    raw_id_fields = ("chat", "message", "decided_by")
    show_full_result_count = False


@admin.register(Usage)
class UsageAdmin(admin.ModelAdmin):
    list_display = (
        "id", "chat", "owner", "model", "status", "input_tokens", "output_tokens", "cost",
        "created_at",
    )  # fmt: skip
    list_filter = ("status", "provider", "model")
    list_select_related = ("chat", "owner")
    raw_id_fields = ("chat", "message", "owner")
    date_hierarchy = "created_at"
    show_full_result_count = False


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = ("id", "chat", "role", "status", "created_at")
    list_filter = ("role", "status")
    list_select_related = ("chat",)
    raw_id_fields = ("chat", "tool_call")
    show_full_result_count = False


from . import admin_batches  # noqa: E402, F401  (the Batch admin lives in its own module)

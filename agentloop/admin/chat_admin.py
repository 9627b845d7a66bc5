"""``ChatAdmin``: a list of chats that scales, and a change page that reads as a timeline.

Both pages cost a constant number of queries: the list annotates its counts and totals as
subqueries (no query per row), and the timeline reads the messages, the tool calls (with
who decided them and their subagent chats) and the usage in one query each, whatever the
length of the transcript. ``tests/test_admin.py`` asserts the figures.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Count, OuterRef, QuerySet, Subquery, Sum
from django.db.models.functions import Coalesce
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.urls import URLPattern, reverse
from django.utils.formats import date_format
from django.utils.html import format_html
from django.utils.timezone import localtime
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from ..conf import agentloop_settings
from ..exceptions import ToolCallNotWaitingError
from ..json_input import ADMIN_JSON_FIELDS
from ..messages import ToolCallState
from ..models import Chat
from .actions import CHAT_ACTIONS, DEFAULT_DENY_REASON
from .approval_inbox import ApprovalInbox
from .eval_admin import make_eval_set
from .filters import ModelFilter, OwnerFilter, ProblemFilter, WaitingFilter
from .relations import has_field, related_model
from .routes import admin_path
from .timeline import WAIT_LABELS, build_timeline, format_cost

__all__ = ["CONFIG_FIELDS", "DECIDED_MESSAGES", "ChatAdmin"]


#: what a waiting chat waits for, short enough for the list's state column (under the
#: "waiting" badge); the full WAIT_LABELS text is its title.
WAITS_FOR = {
    "approval": _("for approval"),
    "question": _("for an answer"),
    "subagent": _("for its subagent"),
}


def _cut(text: str, classes: str = "", title: str | None = None) -> str:
    """``text`` escaped, on one line cut to its cell's width; the whole of it in the title."""
    return format_html(
        '<span class="{}" title="{}">{}</span>',
        f"agentloop-cut {classes}".strip(),
        text if title is None else title,
        text,
    )


DECIDED_MESSAGES = {
    "approve": _("Approved: the tool call runs at the chat's next step."),
    "deny": _("Denied: the model is told so."),
    "answer": _("Answered: the answer is the tool call's result."),
}

CONFIG_FIELDS = (
    "model", "provider", "agent_path", "tools", "guardrails", "tool_options", "temperature",
    "max_output_tokens", "limits", "provider_options", "headers", "output_schema", "schema_path",
)  # fmt: skip


class ChatAdmin(admin.ModelAdmin):
    """Chats: a list that scales, and a change page that reads as a timeline.

    Works for any chat model built from ``AbstractChat`` (register it with this class);
    subagent links appear when the model has ``parent``/``parent_tool_call`` like ``Chat``.
    """

    change_form_template = "admin/agentloop/chat/change_form.html"
    change_list_template = "admin/agentloop/chat/change_list.html"
    actions = [*CHAT_ACTIONS, make_eval_set]
    # Five columns fit the content column of a 1280 px screen beside both sidebars: the chat
    # shows its model under its title, the state what it waits for, the last activity the
    # number of messages; long text is cut (chat_list.css) with the whole of it in a title.
    list_display = ("chat", "owner_link", "state_badge", "last_activity", "cost")
    list_filter = ("state", WaitingFilter, ProblemFilter, ModelFilter, OwnerFilter)
    search_fields = ("title", "model", "owner__username")
    list_select_related = ("owner",)
    date_hierarchy = "created_at"
    # Counting 10,000+ rows twice per page is waste: show "n results" of the filter only.
    show_full_result_count = False
    raw_id_fields = ("owner",)
    formfield_overrides = ADMIN_JSON_FIELDS  # JSON typed in: bounded, a form error past it
    readonly_fields = (
        "state", "subagent_of", "fork_of", "forks", "cancel_requested_at", "lease_expires_at",
        "lease_holder", "created_at", "edited_at",
        "error", "error_detail", "attempts", "waiting_for", "retry_at",
    )  # fmt: skip

    class Media:
        css = {"all": ["agentloop/admin/timeline.css", "agentloop/admin/chat_list.css"]}

    # -- queries ----------------------------------------------------------------------------
    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        """Chats with their list columns as subqueries: one SELECT for a page of rows."""
        queryset = super().get_queryset(request)
        model = queryset.model
        messages_ = related_model(model, "messages").objects.filter(chat=OuterRef("pk")).order_by()
        usage = related_model(model, "usage_records").objects.filter(chat=OuterRef("pk"))
        waiting = related_model(model, "tool_calls").objects.filter(
            chat=OuterRef("pk"), state=ToolCallState.WAITING
        )
        if has_field(model, "forked_from"):
            forks = model._default_manager.filter(forked_from=OuterRef("pk")).order_by()
            queryset = queryset.annotate(
                fork_count=Subquery(
                    forks.values("forked_from").annotate(count=Count("pk")).values("count")
                )
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
        if has_field(self.model, "parent"):
            queryset = queryset.select_related("parent", "parent_tool_call")
        if has_field(self.model, "forked_from"):
            queryset = queryset.select_related("forked_from")
        model = queryset.model
        pk_field = model._meta.pk if from_field is None else model._meta.get_field(from_field)
        try:
            return queryset.get(**{pk_field.name: pk_field.to_python(object_id)})
        except (model.DoesNotExist, ValidationError, ValueError):
            return None

    # -- list columns -----------------------------------------------------------------------
    @admin.display(description=_("chat"), ordering="title")
    def chat(self, obj: Any) -> str:
        if obj.model:
            return format_html("{}{}", _cut(str(obj)), _cut(obj.model, "agentloop-quiet"))
        # No model stored: it runs on the default, which is what the list says (not "—").
        default = agentloop_settings.DEFAULT_MODEL
        return format_html(
            "{}{}", _cut(str(obj)), _cut(default, "agentloop-quiet", f"{default} (default)")
        )

    @admin.display(description=_("owner"), ordering="owner__username")
    def owner_link(self, obj: Any) -> str:
        if obj.owner_id is None:
            return "—"
        return format_html(
            '<a class="agentloop-cut" href="?owner={}" title="{}">{}</a>',
            obj.owner_id,
            obj.owner,
            obj.owner,
        )

    @admin.display(description=_("state"), ordering="state")
    def state_badge(self, obj: Any) -> str:
        badge = format_html(
            '<span class="agentloop-badge agentloop-state-{}">{}</span>',
            obj.state,
            obj.get_state_display(),
        )
        if getattr(obj, "waiting_for", "") and obj.state == "queued":
            # A background step that waits for a rate limit, until its retry.
            return format_html("{}{}", badge, _cut(obj.waiting_for, "agentloop-quiet"))
        reason = getattr(obj, "waiting_reason", None)
        if not reason:
            return badge
        short = str(WAITS_FOR.get(reason, reason))
        return format_html("{}{}", badge, _cut(short, "agentloop-quiet", self.waiting_for(obj)))

    @admin.display(description=_("waiting for"))
    def waiting_for(self, obj: Any) -> str:
        reason = getattr(obj, "waiting_reason", None)
        return str(WAIT_LABELS.get(reason, reason)) if reason else "—"

    @admin.display(description=_("last activity"), ordering="last_activity")
    def last_activity(self, obj: Any) -> str:
        moment = localtime(obj.last_activity)
        count = self.message_count(obj)
        return format_html(
            '<time datetime="{}" title="{}">{}</time><span class="agentloop-quiet">{}</span>',
            moment.isoformat(),
            date_format(moment, "DATETIME_FORMAT"),
            date_format(moment, "SHORT_DATETIME_FORMAT"),
            ngettext("%(count)d message", "%(count)d messages", count) % {"count": count},
        )

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

    @admin.display(description=_("forked from"))
    def fork_of(self, obj: Any) -> str:
        origin = getattr(obj, "forked_from", None)
        if origin is None:
            return "—"
        at = getattr(obj, "forked_from_message_id", None)
        anchor = f"#message-{at}" if at else ""
        return format_html(
            '<a href="{}{}">{}</a> ({})',
            self._chat_url(origin.pk),
            anchor,
            origin,
            gettext("at message %(pk)s") % {"pk": at} if at else gettext("its message is gone"),
        )

    @admin.display(description=_("forks"))
    def forks(self, obj: Any) -> str:
        count = int(getattr(obj, "fork_count", None) or 0)
        if not count:
            return "—"
        opts = self.opts
        url = reverse(
            f"admin:{opts.app_label}_{opts.model_name}_changelist", current_app=self.admin_site.name
        )
        label = ngettext("%(count)d fork", "%(count)d forks", count) % {"count": count}
        return format_html('<a href="{}?forked_from__id__exact={}">{}</a>', url, obj.pk, label)

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        summary: list[Any] = ["title", "owner"]
        if obj is not None:
            summary.append("state")
            if getattr(obj, "waiting_for", ""):
                summary += ["waiting_for", "retry_at"]
            if getattr(obj, "parent_id", None):
                summary.append("subagent_of")
            if getattr(obj, "forked_from_id", None):
                summary.append("fork_of")
            if getattr(obj, "fork_count", None):
                summary.append("forks")
            if getattr(obj, "edited_at", None):
                summary.append("edited_at")
        failure: list[Any] = []
        if obj is not None and obj.error:
            # The one line users see, and (collapsed) the traceback behind it.
            failure = [
                (_("Failure"), {"fields": ["error", "attempts"]}),
                (_("Traceback"), {"classes": ["collapse"], "fields": ["error_detail"]}),
            ]
        return [
            (None, {"fields": summary}),
            *failure,
            (_("Configuration"), {"classes": ["collapse"], "fields": CONFIG_FIELDS}),
            (
                _("Run"),
                {
                    "classes": ["collapse"],
                    "fields": [
                        "cancel_requested_at",
                        "lease_expires_at",
                        "lease_holder",
                        "created_at",
                    ],  # fmt: skip
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

    # -- the approval inbox (admin/approval_inbox.py) ----------------------------------------------
    @property
    def inbox(self) -> ApprovalInbox:
        """The inbox of the calls waiting for a person across this admin's chats."""
        found: ApprovalInbox | None = self.__dict__.get("_inbox")
        if found is None:
            found = self.__dict__["_inbox"] = ApprovalInbox(self)
        return found

    def inbox_queryset(self, request: HttpRequest, calls: QuerySet[Any]) -> QuerySet[Any]:
        """The tool calls the inbox may show this request (all of them: narrow it in a
        subclass, e.g. to a tenant's chats)."""
        return calls

    # -- approve, deny or answer one call from the timeline --------------------------------------
    def get_urls(self) -> list[URLPattern]:
        decide = admin_path(
            self, "<path:object_id>/decide/<str:call_pk>/", self.decide_view, "decide"
        )
        # Before the model admin's own: "inbox/" is not a chat's key.
        return [*self.inbox.urls(), decide, *super().get_urls()]

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

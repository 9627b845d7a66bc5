"""The approval inbox: every tool call waiting for a person, across chats, in one admin page.

``ChatAdmin`` serves it at ``<the chat list>/inbox/``: the calls waiting for an approval or
an answer, oldest first, filtered by kind, tool, owner and age; each with approve, deny,
approve with edited arguments (a JSON object, checked by the tool's ``Params``) or answer.
An MCP server's question (a running call with ``wait_reason="elicitation"``, docs/mcp.md)
is listed with the questions: answered with a JSON object, or declined.
A decision is the chat's own verb (``chat.approve(..., arguments=...)``, ``deny``,
``answer``, ``decline``), so the rules are the views': only a call still waiting can be decided (the
loser of a race is told who decided first, and when), invalid edited arguments change
nothing and are shown again with why, and a background chat goes on once nothing holds it.
``?view=decided`` lists the decisions made, with who made them and when.

One page costs a constant number of queries whatever it shows (``tests/test_approval_inbox.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.db.models import F, Q, QuerySet
from django.db.models.functions import Now
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.template.response import TemplateResponse
from django.urls import URLPattern, reverse
from django.utils.formats import date_format
from django.utils.timezone import localtime
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..exceptions import (
    DecisionConflictError,
    InvalidAnswerError,
    InvalidArgumentsError,
    ToolCallNotWaitingError,
)
from ..json_input import JSONInputError, check_json_bounds
from ..tools.mcp.elicitation import ELICITATION
from .actions import DEFAULT_DENY_REASON
from .relations import related_model
from .routes import admin_path

__all__ = ["AGES", "PER_PAGE", "ApprovalInbox", "InboxFilters"]

PER_PAGE = 25
#: "waiting longer than" choices: the filter's value, its label, and the time.
AGES = {
    "5m": (_("5 minutes"), timedelta(minutes=5)),
    "1h": (_("an hour"), timedelta(hours=1)),
    "1d": (_("a day"), timedelta(days=1)),
    "7d": (_("a week"), timedelta(days=7)),
}
KINDS = {"approval": _("approvals"), "question": _("questions")}
DECIDED = ("approved", "denied", "answered", "cancelled")


@dataclass(frozen=True)
class InboxFilters:
    """What the page shows, from its query string (values it doesn't know are ignored)."""

    view: str = "waiting"
    kind: str = ""
    tool: str = ""
    owner: str = ""
    age: str = ""
    page: str = "1"

    @classmethod
    def from_request(cls, request: HttpRequest) -> InboxFilters:
        get = request.GET
        return cls(
            view="decided" if get.get("view") == "decided" else "waiting",
            kind=get.get("kind", "") if get.get("kind") in KINDS else "",
            tool=get.get("tool", "")[:200],
            owner=get.get("owner", "")[:64],
            age=get.get("age", "") if get.get("age") in AGES else "",
            page=get.get("page", "1")[:12],
        )

    def query(self, **changes: str) -> str:
        """The query string of these filters with ``changes`` (empty values dropped)."""
        values = {**self.__dict__, **changes}
        if values["view"] == "waiting":
            values["view"] = ""
        if values["page"] == "1":
            values["page"] = ""
        return urlencode({name: value for name, value in values.items() if value})

    def apply(self, calls: QuerySet[Any], user: Any) -> QuerySet[Any]:
        if self.kind == "question":  # a person's answer: a tool's, or an MCP server's
            calls = calls.filter(wait_reason__in=["question", ELICITATION])
        elif self.kind:
            calls = calls.filter(wait_reason=self.kind)
        if self.tool:
            calls = calls.filter(name=self.tool)
        if self.owner == "mine":
            calls = calls.filter(chat__owner_id=user.pk)
        elif self.owner == "none":
            calls = calls.filter(chat__owner__isnull=True)
        elif self.owner:
            calls = calls.filter(chat__owner_id=self.owner)
        if self.age and self.view == "waiting":
            # The database's clock, as the wait's start (and APPROVAL_TIMEOUT) are.
            calls = calls.filter(waiting_since__lt=Now() - AGES[self.age][1])
        return calls


class _Incomplete(Exception):  # noqa: N818 - a form to fill in, not a failure
    """The decision's form lacks what it needs (an answer's text, JSON arguments)."""


class ApprovalInbox:
    """The inbox of one chat admin (``ChatAdmin.inbox``): its URLs and its two views."""

    def __init__(self, model_admin: Any) -> None:
        self.model_admin = model_admin
        self.opts = model_admin.opts
        self.tool_calls: Any = related_model(model_admin.model, "tool_calls")

    # -- URLs -------------------------------------------------------------------------------
    def url_name(self, view: str) -> str:
        return f"{self.opts.app_label}_{self.opts.model_name}_{view}"

    def urls(self) -> list[URLPattern]:
        return [
            admin_path(self.model_admin, "inbox/", self.list_view, "inbox"),
            admin_path(
                self.model_admin, "inbox/<str:call_pk>/decide/", self.decide_view, "inbox_decide"
            ),
        ]

    def _url(self, view: str, *args: Any) -> str:
        site = self.model_admin.admin_site
        return reverse(f"{site.name}:{self.url_name(view)}", args=args, current_app=site.name)

    # -- what it lists ----------------------------------------------------------------------
    def waiting(self, request: HttpRequest) -> QuerySet[Any]:
        """The calls waiting for a person (``ChatAdmin.inbox_queryset`` may narrow them)."""
        calls = self.tool_calls._default_manager.filter(
            Q(state="waiting", wait_reason__in=list(KINDS))
            # An MCP server's question: its call runs, held open while a person decides.
            | Q(state="running", wait_reason=ELICITATION)
        )
        narrowed: QuerySet[Any] = self.model_admin.inbox_queryset(request, calls)
        return narrowed

    def decided(self, request: HttpRequest) -> QuerySet[Any]:
        calls = self.tool_calls._default_manager.filter(
            decided_at__isnull=False, decision__in=DECIDED, wait_reason__in=list(KINDS)
        )
        narrowed: QuerySet[Any] = self.model_admin.inbox_queryset(request, calls)
        return narrowed

    def waiting_count(self, request: HttpRequest) -> int:
        return int(self.waiting(request).count())

    # -- the page ---------------------------------------------------------------------------
    def list_view(self, request: HttpRequest) -> HttpResponse:
        if request.method != "GET":
            return HttpResponseNotAllowed(["GET"])
        return self.render(request)

    def render(
        self,
        request: HttpRequest,
        *,
        problems: dict[str, str] | None = None,
        drafts: dict[str, dict[str, str]] | None = None,
        status: int = 200,
    ) -> TemplateResponse:
        """The page; ``problems`` and ``drafts`` (by call pk) show a refused decision again
        with what the reviewer typed."""
        admin = self.model_admin
        if not admin.has_view_or_change_permission(request):
            raise PermissionDenied
        filters = InboxFilters.from_request(request)
        if filters.view == "decided":
            base = self.decided(request)
            ordered = base.order_by(F("decided_at").desc(), "-pk")
        else:
            base = self.waiting(request)
            ordered = base.order_by(F("waiting_since").asc(nulls_first=True), "pk")
        try:
            chosen = filters.apply(ordered, request.user)
            calls = chosen.select_related("chat", "chat__owner", "decided_by")
            page = Paginator(calls, PER_PAGE).get_page(filters.page)
            rows = list(page.object_list)
        except (ValueError, ValidationError):  # an owner that is no user's key
            return TemplateResponse(
                request, "admin/agentloop/chat/inbox.html", self._context(request, filters),
                status=400,
            )  # fmt: skip
        can_decide = admin.has_change_permission(request)
        entries = [
            self._entry(call, can_decide, filters, (problems or {}).get(str(call.pk)),
                        (drafts or {}).get(str(call.pk), {}))
            for call in rows
        ]  # fmt: skip
        context = {
            **self._context(request, filters),
            "entries": entries,
            "page": page,
            "tools": sorted(set(base.order_by().values_list("name", flat=True).distinct())),
        }
        return TemplateResponse(request, "admin/agentloop/chat/inbox.html", context, status=status)

    def _context(self, request: HttpRequest, filters: InboxFilters) -> dict[str, Any]:
        admin = self.model_admin
        return {
            **admin.admin_site.each_context(request),
            "opts": self.opts,
            "title": gettext("Decided tool calls")
            if filters.view == "decided"
            else gettext("Approval inbox"),
            "filters": filters,
            "entries": [],
            "tools": [],
            "kinds": list(KINDS.items()),
            "ages": [(key, label) for key, (label, _delta) in AGES.items()],
            "owner_label": self._owner_label(filters.owner),
            "base_query": filters.query(page="1"),
            "waiting_url": "?" + filters.query(view="waiting", page="1"),
            "decided_url": "?" + filters.query(view="decided", page="1"),
            "changelist_url": reverse(
                f"{admin.admin_site.name}:{self.opts.app_label}_{self.opts.model_name}_changelist"
            ),
        }

    def _owner_label(self, owner: str) -> str:
        if owner in ("", "mine", "none"):
            return ""
        owner_model = self.model_admin.model._meta.get_field("owner").related_model
        try:
            found = owner_model._default_manager.filter(pk=owner).first()
        except (ValueError, ValidationError):
            return ""
        return str(found) if found is not None else ""

    def _entry(
        self,
        call: Any,
        can_decide: bool,
        filters: InboxFilters,
        problem: str | None,
        draft: dict[str, str],
    ) -> dict[str, Any]:
        arguments = json.dumps(call.arguments, indent=2, ensure_ascii=False, default=str)
        original = call.original_arguments
        return {
            "call": call,
            "chat": call.chat,
            "chat_url": self._chat_url(call.chat_id) + f"#call-{call.pk}",
            "owner_url": (
                "?" + filters.query(owner=str(call.chat.owner_id), page="1")
                if call.chat.owner_id is not None
                else ""
            ),  # fmt: skip
            "arguments": arguments,
            "original_arguments": (
                json.dumps(original, indent=2, ensure_ascii=False, default=str)
                if original is not None
                else ""
            ),  # fmt: skip
            "edited_arguments": draft.get("arguments", arguments),
            # What an MCP server's question asks for (untrusted: the template escapes it).
            "schema": (
                json.dumps(call.elicitation.get("schema"), indent=2, ensure_ascii=False)
                if call.wait_reason == ELICITATION and isinstance(call.elicitation, dict)
                else ""
            ),
            "reason": draft.get("reason", ""),
            "answer": draft.get("text", ""),
            "problem": problem,
            "decide_url": (
                self._url("inbox_decide", call.pk) + "?" + filters.query()
                if can_decide and (call.state == "waiting" or call.wait_reason == ELICITATION)
                else ""
            ),  # fmt: skip
        }

    def _chat_url(self, pk: Any) -> str:
        site = self.model_admin.admin_site
        return reverse(
            f"{site.name}:{self.opts.app_label}_{self.opts.model_name}_change",
            args=[pk],
            current_app=site.name,
        )

    # -- deciding ---------------------------------------------------------------------------
    def decide_view(self, request: HttpRequest, call_pk: str) -> HttpResponse:
        """POST ``decision`` = approve, approve_edited (``arguments``: a JSON object), deny
        (``reason``, optional) or answer (``text``)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        admin = self.model_admin
        back = self._url("inbox") + ("?" + request.GET.urlencode() if request.GET else "")
        try:
            call = self.tool_calls._default_manager.filter(pk=call_pk).first()
        except (ValueError, ValidationError):
            call = None
        chat = admin.get_object(request, str(call.chat_id)) if call is not None else None
        if call is None or chat is None:
            admin.message_user(request, gettext("That tool call no longer exists."), messages.ERROR)
            return HttpResponseRedirect(back)
        if not admin.has_change_permission(request, chat):
            raise PermissionDenied
        decision = request.POST.get("decision", "")
        if decision not in ("approve", "approve_edited", "deny", "answer", "decline"):
            return HttpResponseBadRequest(
                "decision must be approve, approve_edited, deny, answer or decline"
            )
        draft = {name: request.POST.get(name, "") for name in ("arguments", "reason", "text")}
        try:
            done = self._decide(request, chat, call, decision, draft)
        except (InvalidArgumentsError, InvalidAnswerError, _Incomplete) as exc:
            # Nothing was written: the page again, the call's form as it was typed.
            problems, drafts = {str(call.pk): str(exc)}, {str(call.pk): draft}
            return self.render(request, problems=problems, drafts=drafts, status=400)
        except ToolCallNotWaitingError as exc:
            admin.message_user(request, self._conflict(call, exc), messages.ERROR)
            return HttpResponseRedirect(back)
        admin.log_change(request, chat, done)
        admin.message_user(request, f"{done} ({chat})", messages.SUCCESS)
        return HttpResponseRedirect(back)

    def _decide(
        self, request: HttpRequest, chat: Any, call: Any, decision: str, draft: dict[str, str]
    ) -> str:
        """Make the decision with the chat's own verb; the line for the chat's history."""
        label = f"{call.name} ({call.call_id})"
        if decision == "approve":
            chat.approve(call.pk, by=request.user)
            return f"Approved tool call {label} from the inbox."
        if decision == "approve_edited":
            try:
                check_json_bounds(draft["arguments"], gettext("The arguments"))
                arguments = json.loads(draft["arguments"])
            except JSONInputError as exc:
                raise _Incomplete(str(exc)) from None
            except ValueError as exc:
                raise _Incomplete(
                    gettext("The arguments are not JSON: %(error)s.") % {"error": exc}
                ) from None
            chat.approve(call.pk, by=request.user, arguments=arguments)
            return f"Approved tool call {label} from the inbox, with edited arguments."
        if decision == "deny":
            reason = draft["reason"].strip()[:2000] or DEFAULT_DENY_REASON
            chat.deny(call.pk, reason=reason, by=request.user)
            return f"Denied tool call {label} from the inbox."
        if decision == "decline":
            chat.decline(call.pk, by=request.user)
            return f"Declined the question of tool call {label} from the inbox."
        text = draft["text"]
        if not text.strip():
            raise _Incomplete(gettext("Type an answer first."))
        chat.answer(call.pk, text, by=request.user)
        return f"Answered tool call {label} from the inbox."

    def _conflict(self, call: Any, error: ToolCallNotWaitingError) -> str:
        """Why the decision lost: who decided the call first, and when, where it is known."""
        fresh = self.tool_calls._default_manager.select_related("decided_by").get(pk=call.pk)
        if isinstance(error, DecisionConflictError) or fresh.decision:
            who = fresh.decided_by or gettext("the system")
            when = (
                date_format(localtime(fresh.decided_at), "DATETIME_FORMAT")
                if fresh.decided_at else "?"
            )  # fmt: skip
            return gettext(
                "Tool call %(call)s was already %(decision)s by %(who)s at %(when)s."
            ) % {"call": f"{fresh.name} ({fresh.call_id})", "decision": fresh.decision or "decided",
                 "who": who, "when": when}  # fmt: skip
        return str(error)

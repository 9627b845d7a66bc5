"""The chat list's filters: what holds a chat, what went wrong, whose it is."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.core.exceptions import ValidationError
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from ..conf import agentloop_settings
from ..django_store.releases import IN_LINE
from ..engine._tool_rounds import BLOCKED_PREFIX
from ..messages import MessageStatus, ToolCallState
from ..models import ChatState
from .relations import related_model

__all__ = ["ModelFilter", "OwnerFilter", "ProblemFilter", "WaitingFilter", "holding"]


def holding(queryset: QuerySet[Any], reason: str | None) -> QuerySet[Any]:
    """The chats with a tool call waiting for ``reason`` (approval, question, subagent; None:
    any of them)."""
    tool_calls = related_model(queryset.model, "tool_calls").objects
    held = tool_calls.filter(chat=OuterRef("pk"), state=ToolCallState.WAITING)
    if reason is not None:
        held = held.filter(wait_reason=reason)
    return queryset.filter(Exists(held))


class WaitingFilter(admin.SimpleListFilter):
    """Chats held by a person or a subagent, or waiting in the background (a rate limit, a
    place of a chats-in-flight quota), by what holds them."""

    title = _("waiting for")
    parameter_name = "waiting_for"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [
            ("approval", _("an approval")),
            ("question", _("an answer")),
            ("subagent", _("a subagent")),
            ("rate_limit", _("a rate limit")),
            ("place", _("a place (chats in flight)")),
            ("any", _("anything")),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        if value is None:
            return None
        queued = queryset.filter(state=ChatState.QUEUED)
        if value == "rate_limit":  # a background step re-sent for when the limit has room
            return queued.exclude(waiting_for="").exclude(waiting_for__endswith=IN_LINE)
        if value == "place":  # in line for a place of a chats-in-flight quota
            return queued.filter(waiting_for__endswith=IN_LINE)
        # By the tool calls, not the chat's state: a chat driven in-process that stopped at
        # an approval keeps its state ("idle") while its call waits.
        return holding(queryset, None if value == "any" else value)


class ProblemFilter(admin.SimpleListFilter):
    """Chats where something went wrong: a provider failure, a stop, a tool, a cancel, a
    guardrail's block."""

    title = _("went wrong")
    parameter_name = "problem"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [
            ("failed", _("failed (provider error)")),
            ("stopped", _("stopped")),
            ("tool_failed", _("a tool failed")),
            ("cancelled", _("cancelled")),
            ("blocked", _("blocked by a guardrail")),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        model = queryset.model
        tool_calls = related_model(model, "tool_calls").objects.filter(chat=OuterRef("pk"))
        if value == "failed":
            return queryset.filter(state=ChatState.FAILED)
        if value == "stopped":
            return queryset.filter(state=ChatState.STOPPED)
        if value == "tool_failed":
            failed = tool_calls.filter(state=ToolCallState.FAILED).exclude(decision="denied")
            return queryset.filter(Exists(failed))
        if value == "blocked":
            messages_ = related_model(model, "messages").objects.filter(chat=OuterRef("pk"))
            # A blocked message or answer, a stop for a block, or a tool call's blocked result
            # (its fixed wording: JSON containment is not portable).
            return queryset.filter(
                Exists(messages_.filter(status=MessageStatus.BLOCKED))
                | Q(stop_reason__startswith="guardrail ")
                | Exists(
                    messages_.filter(role="tool", is_error=True, content__startswith=BLOCKED_PREFIX)
                )
            )
        if value == "cancelled":
            messages_ = related_model(model, "messages").objects.filter(chat=OuterRef("pk"))
            return queryset.filter(
                Exists(messages_.filter(status=MessageStatus.CANCELLED))
                | Exists(tool_calls.filter(state=ToolCallState.CANCELLED))
            )
        return None


class ModelFilter(admin.SimpleListFilter):
    """The models chats run on, the default model included.

    A chat on the default model stores no model (``""``): Django's own filter of the field
    would offer an empty choice, or none, where the chat list shows the default model's name.
    Here that name is a choice, and it selects the chats that name it and those that store
    none.
    """

    title = _("model")
    parameter_name = "model"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        default = agentloop_settings.DEFAULT_MODEL
        stored = model_admin.get_queryset(request).order_by().values_list("model", flat=True)
        names = set(stored.exclude(model="").distinct())
        choices: list[tuple[str, Any]] = []
        for name in sorted(names | {default}):
            choices.append((name, _("%s (default)") % name if name == default else name))
        return choices

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        if value is None:
            return None
        if value == agentloop_settings.DEFAULT_MODEL:
            return queryset.filter(model__in=[value, ""])
        return queryset.filter(model=value)


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

"""Plain lists of tool calls, usage and messages, for finding one row across chats."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern

from ..json_input import ADMIN_JSON_FIELDS
from ..models import Message, ToolCall, Usage
from .routes import admin_path
from .usage_charts import charts_view

__all__ = ["MessageAdmin", "ToolCallAdmin", "UsageAdmin"]


@admin.register(ToolCall)
class ToolCallAdmin(admin.ModelAdmin):
    list_display = ("id", "chat", "name", "call_id", "state", "wait_reason", "decision",
                    "started_at", "finished_at")  # fmt: skip
    list_filter = ("state", "wait_reason", "decision", "name")
    list_select_related = ("chat",)
    search_fields = ("name", "call_id")
    raw_id_fields = ("chat", "message", "decided_by")
    formfield_overrides = ADMIN_JSON_FIELDS  # JSON typed in: bounded, a form error past it
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
    change_list_template = "admin/agentloop/usage/change_list.html"

    def get_urls(self) -> list[URLPattern]:
        """The list's URLs and ``charts/`` (cost and tokens per day, top owners)."""
        return [admin_path(self, "charts/", self.charts_view, "charts"), *super().get_urls()]

    def charts_view(self, request: HttpRequest) -> HttpResponse:
        """The usage charts page (``agentloop.admin.usage_charts``)."""
        return charts_view(self, request)


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = ("id", "chat", "role", "status", "created_at")
    list_filter = ("role", "status")
    list_select_related = ("chat",)
    raw_id_fields = ("chat", "tool_call")
    formfield_overrides = ADMIN_JSON_FIELDS
    show_full_result_count = False

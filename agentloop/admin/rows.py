"""Plain lists of tool calls, usage and messages, for finding one row across chats."""

from __future__ import annotations

from django.contrib import admin

from ..models import Message, ToolCall, Usage

__all__ = ["MessageAdmin", "ToolCallAdmin", "UsageAdmin"]


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

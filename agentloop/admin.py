"""Admin registration: chats with their transcript as a read-only inline."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from .models import Chat, Message, ToolCall, Usage


class MessageInline(admin.TabularInline):
    model = Message
    fields = ("id", "role", "status", "content", "tool_call", "is_error", "model", "created_at")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True
    ordering = ("id",)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_queryset(self, request: HttpRequest) -> QuerySet[Message]:
        return super().get_queryset(request).select_related("tool_call")


@admin.action(description=_("Cancel the running step"), permissions=["change"])
def cancel_chats(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    chats = list(queryset)
    for chat in chats:
        chat.cancel()  # also wakes a run in this process, or any worker when Redis is set
    modeladmin.message_user(request, _("Cancellation requested for %d chat(s).") % len(chats))


@admin.action(description=_("Resume in the background"), permissions=["change"])
def resume_chats(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    chats = list(queryset)
    for chat in chats:
        chat.complete_later()
    modeladmin.message_user(request, _("%d chat(s) queued.") % len(chats))


@admin.register(Chat)
class ChatAdmin(admin.ModelAdmin):
    actions = [cancel_chats, resume_chats]
    list_display = ("id", "title", "owner", "model", "state", "stop_reason", "created_at")
    list_filter = ("state", "model")
    search_fields = ("title", "model", "owner__username")
    list_select_related = ("owner",)
    raw_id_fields = ("owner",)
    readonly_fields = (
        "cancel_requested_at", "lease_expires_at", "stop_reason", "error", "created_at",
        "updated_at",
    )  # fmt: skip
    inlines = [MessageInline]


@admin.register(ToolCall)
class ToolCallAdmin(admin.ModelAdmin):
    list_display = ("id", "chat", "name", "call_id", "state", "started_at", "finished_at")
    list_filter = ("state", "name")
    search_fields = ("name", "call_id")
    raw_id_fields = ("chat", "message")


@admin.register(Usage)
class UsageAdmin(admin.ModelAdmin):
    list_display = (
        "id", "chat", "owner", "model", "status", "input_tokens", "output_tokens", "cost",
        "created_at",
    )  # fmt: skip
    list_filter = ("status", "provider", "model")
    raw_id_fields = ("chat", "message", "owner")


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = ("id", "chat", "role", "status", "created_at")
    list_filter = ("role", "status")
    raw_id_fields = ("chat", "tool_call")

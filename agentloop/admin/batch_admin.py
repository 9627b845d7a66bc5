"""Admin for batches: the list shows each batch's status and request counts, the change page
its items (one per chat) and what became of each; actions poll or cancel batches now.

The list costs the same number of queries whatever the number of batches (the count of
items still pending is an annotation); the change page reads the items with their chats and
answers joined.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import Count, Q, QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from ..batches import cancel, refresh
from ..evals.batch_rounds import refresh as refresh_eval_batch
from ..exceptions import AgentloopError
from ..models import Batch, BatchItem, BatchItemStatus

__all__ = ["BatchAdmin", "BatchItemInline"]


class BatchItemInline(admin.TabularInline):
    model = BatchItem
    fields = ("custom_id", "chat", "model", "status", "error", "message", "cancelled_at",
              "finished_at")  # fmt: skip
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).select_related("chat", "message")


@admin.action(description=_("Poll the provider now"), permissions=["change"])
def poll_now(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    for batch in queryset.filter(collected_at__isnull=True):
        try:
            if batch.eval_run_id is not None:
                refresh_eval_batch(batch)  # into its eval run's cases
            else:
                refresh(batch)
        except AgentloopError as exc:
            modeladmin.message_user(request, f"Batch #{batch.pk}: {exc}", messages.ERROR)


@admin.action(description=_("Cancel at the provider"), permissions=["change"])
def cancel_at_provider(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet
) -> None:
    for batch in queryset.filter(collected_at__isnull=True):
        try:
            cancel(batch)
        except AgentloopError as exc:
            modeladmin.message_user(request, f"Batch #{batch.pk}: {exc}", messages.ERROR)


@admin.register(Batch)
class BatchAdmin(admin.ModelAdmin):
    list_display = ("id", "provider", "model", "status", "request_count", "succeeded_count",
                    "failed_count", "pending", "created_at", "collected_at",
                    "provider_batch_id")  # fmt: skip
    list_filter = ("status", "provider", "auto_continue")
    search_fields = ("provider_batch_id",)
    readonly_fields = ("provider", "model", "provider_batch_id", "status", "auto_continue",
                       "previous", "eval_run", "request_count", "processing_count",
                       "succeeded_count", "failed_count", "error", "provider_data", "created_at",
                       "submitted_at", "polled_at", "ended_at", "collected_at")  # fmt: skip
    exclude = ("claim_token", "claimed_until")
    inlines = [BatchItemInline]
    actions = [poll_now, cancel_at_provider]
    show_full_result_count = False

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        pending = Count("items", filter=Q(items__status=BatchItemStatus.PENDING))
        return super().get_queryset(request).annotate(pending_items=pending)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # batches are made with agentloop.batch(chats)

    @admin.display(description=_("pending"), ordering="pending_items")
    def pending(self, batch: Any) -> int:
        return int(batch.pending_items)

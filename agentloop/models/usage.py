"""Usage: one row per provider attempt, and the queryset that totals them."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Count, Q, Sum
from django.db.models.functions import TruncDay, TruncMonth, TruncWeek
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from ..django_store.fields import StorableCharField, StorableTextField, optional_link
from .chat import Chat
from .indexes import IncludingOnPostgres
from .message import Message


class UsageStatus(models.TextChoices):
    SUCCEEDED = "succeeded", _("succeeded")
    FAILED = "failed", _("failed")
    CANCELLED = "cancelled", _("cancelled")


#: each token count of usage rows, summed (0 over no rows).
TOKEN_SUMS: dict[str, Any] = {
    name: Sum(name, default=0)
    for name in (
        "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens",
        "reasoning_tokens",
    )
}  # fmt: skip

_TOTALS: dict[str, Any] = {
    **TOKEN_SUMS,
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
            **_TOTALS,
            failed=Count("id", filter=Q(status=UsageStatus.FAILED)),
            cancelled=Count("id", filter=Q(status=UsageStatus.CANCELLED)),
        )


class AbstractUsage(models.Model):
    """One provider attempt: tokens, cost when the price is known, and how it ended."""

    provider = StorableCharField(_("provider"), max_length=100, blank=True)
    model = StorableCharField(_("model"), max_length=200, blank=True)
    status = StorableCharField(_("status"), max_length=20, choices=UsageStatus.choices)
    input_tokens = models.PositiveIntegerField(_("input tokens"), default=0)
    output_tokens = models.PositiveIntegerField(_("output tokens"), default=0)
    #: prompt tokens read from the provider's cache (part of ``input_tokens``).
    cache_read_tokens = models.PositiveIntegerField(_("cache read tokens"), default=0)
    #: prompt tokens written to the provider's cache (part of ``input_tokens``).
    cache_write_tokens = models.PositiveIntegerField(_("cache write tokens"), default=0)
    reasoning_tokens = models.PositiveIntegerField(_("reasoning tokens"), default=0)
    cost = models.DecimalField(_("cost"), max_digits=14, decimal_places=8, null=True, blank=True)
    error = StorableTextField(_("error"), blank=True)
    duration_ms = models.PositiveIntegerField(_("duration (ms)"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), default=timezone.now, editable=False)

    objects = UsageQuerySet.as_manager()

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"{self.model} {self.status} ({self.input_tokens}+{self.output_tokens} tokens)"

    @property
    def cached_tokens(self) -> int:
        """The older name of ``cache_read_tokens``."""
        return self.cache_read_tokens


class Usage(AbstractUsage):
    # No index of their own: (chat, created_at) and (owner, created_at) below serve them.
    chat = optional_link(Chat, _("chat"), "usage_records", db_index=False)
    message = optional_link(Message, _("message"), "usage_records")
    owner = optional_link(settings.AUTH_USER_MODEL, _("owner"), "agentloop_usage", db_index=False)

    class Meta(AbstractUsage.Meta):
        verbose_name = _("usage")
        verbose_name_plural = _("usage")
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["owner", "created_at"], name="agentloop_usage_owner_idx"),
            models.Index(fields=["chat", "created_at"], name="agentloop_usage_chat_idx"),
            # The admin's usage charts: a range of days, grouped by model or owner, read
            # from the index alone on PostgreSQL (INCLUDE; elsewhere a plain created_at index).
            IncludingOnPostgres(
                fields=["created_at"],
                postgres_include=(
                    "provider",
                    "model",
                    "owner",
                    "cost",
                    "input_tokens",
                    "output_tokens",
                ),
                name="agentloop_usage_day_idx",
            ),  # fmt: skip
        ]

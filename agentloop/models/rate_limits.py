"""Rate-limit buckets in the database (when no Redis is configured): one row per bucket."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from ..django_store.fields import StorableCharField


class RateLimitBucket(models.Model):
    """One token bucket of ``AGENTLOOP["RATE_LIMITS"]`` ("openai/requests"): its level, and
    when it had it (seconds since the epoch, by the database's clock on PostgreSQL)."""

    key = StorableCharField(_("bucket"), max_length=255, unique=True)
    level = models.FloatField(_("level"))
    stamp = models.FloatField(_("level at (epoch seconds)"))

    class Meta:
        verbose_name = _("rate-limit bucket")
        verbose_name_plural = _("rate-limit buckets")

    def __str__(self) -> str:
        return self.key

"""Embedding attempts as usage rows: each written with its cost, charged to the budgets of
the owner's subject (or the chat's subjects) in the same transaction, so the admin's usage
charts and ``AGENTLOOP["BUDGETS"]`` count embeddings as they count model calls.

This is the Django layer of :mod:`agentloop.embeddings` (it reads the ORM's models), imported
when ``embed()`` first records a row.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.db import router, transaction

from ..budgets import counters
from ..budgets.limits import budgets_on, units
from ..budgets.subjects import Subject, owner_subject, subjects_of
from ..engine.rate_limiting import RateLimiter
from ..engine.store import UsageRecord
from ..rate_limits import fleet_limiter

__all__ = ["UsageRows"]


class UsageRows:
    """Writes an ``embed()`` call's usage rows: for ``chat`` (its usage model, its owner,
    its budget subjects) or for ``owner`` (the owner's subject), or for nobody."""

    def __init__(self, *, owner: Any = None, chat: Any = None) -> None:
        self.chat = chat
        if chat is not None:
            self.model = chat.usage_records.model
            self.owner_id = chat.owner_id if owner is None else owner.pk
        else:
            self.model = apps.get_model("agentloop", "Usage")
            self.owner_id = None if owner is None else owner.pk
        self.using = router.db_for_write(self.model)

    def limiter(self) -> RateLimiter | None:
        """The fleet's rate limiter (the buckets every process shares)."""
        return fleet_limiter()

    def subjects(self) -> list[Subject]:
        """Whose budgets the rows count against: the chat's subjects (``BUDGET_SUBJECT``),
        else the owner's; none when budgets are off."""
        if not budgets_on():
            return []
        if self.chat is not None:
            return subjects_of(self.chat)
        subject = owner_subject(self)  # the default subject, read off ``owner_id``
        return [] if subject is None else [subject]

    def __call__(self, usage: UsageRecord) -> None:
        with transaction.atomic(using=self.using):
            self.model._default_manager.using(self.using).create(
                chat=self.chat,
                owner_id=self.owner_id,
                provider=usage.provider,
                model=usage.model,
                status=usage.status,
                input_tokens=usage.usage.input_tokens,
                cost=usage.cost,
                error=usage.error,
                duration_ms=usage.duration_ms,
            )
            subjects = self.subjects()
            if subjects:
                tokens = usage.usage.input_tokens
                counters.charge(subjects, units(usage.cost), tokens, None, self.using)

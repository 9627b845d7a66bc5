"""Budgets: one row per budget subject (its limits and its counters), the reservations of the
model calls in flight, and the chats holding a place of a chats-in-flight quota.

Costs in the counters are whole units of 1e-8 US dollars (the precision of ``Usage.cost``):
integers add up exactly on every database. ``agentloop.budgets`` reads and writes them.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from ..django_store.fields import StorableCharField


def _limit(verbose_name: Any, help_text: Any) -> models.DecimalField:
    return models.DecimalField(
        verbose_name,
        max_digits=14,
        decimal_places=8,
        null=True,
        blank=True,
        validators=[MinValueValidator(Decimal(0))],
        help_text=help_text,
    )


_DEFAULT = _("Empty: AGENTLOOP['BUDGETS'] applies.")


class Budget(models.Model):
    """A budget subject (an owner, or what ``BUDGET_SUBJECT`` chooses): the limits set for it
    here (each empty one: ``AGENTLOOP["BUDGETS"]``'s) and what it spent this day and month.

    A row is made the first time the subject's chats call a model; edit one (the admin) to
    give a subject limits of its own."""

    #: the subject's key: "auth.user:42", "teams.team:7", or the string a hook returned.
    subject = StorableCharField(_("subject"), max_length=255, unique=True)
    #: how the subject is shown: "owner 42", "team 7".
    label = StorableCharField(_("label"), max_length=200, blank=True)
    cost_per_day = _limit(_("cost per day (USD)"), _DEFAULT)
    cost_per_month = _limit(_("cost per month (USD)"), _DEFAULT)
    tokens_per_day = models.PositiveBigIntegerField(
        _("tokens per day"), null=True, blank=True, help_text=_DEFAULT
    )
    tokens_per_month = models.PositiveBigIntegerField(
        _("tokens per month"), null=True, blank=True, help_text=_DEFAULT
    )
    chats_in_flight = models.PositiveIntegerField(
        _("chats in flight"),
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text=_DEFAULT,
    )
    #: the day ``day_cost`` and ``day_tokens`` count (a charge on a later day starts anew).
    day = models.DateField(_("day"), null=True, blank=True, editable=False)
    day_cost = models.BigIntegerField(_("cost this day (1e-8 USD)"), default=0, editable=False)
    day_tokens = models.BigIntegerField(_("tokens this day"), default=0, editable=False)
    #: the first day of the month ``month_cost`` and ``month_tokens`` count.
    month = models.DateField(_("month"), null=True, blank=True, editable=False)
    month_cost = models.BigIntegerField(_("cost this month (1e-8 USD)"), default=0, editable=False)
    month_tokens = models.BigIntegerField(_("tokens this month"), default=0, editable=False)
    #: what the model calls in flight reserved and have not settled yet.
    reserved_cost = models.BigIntegerField(_("reserved cost (1e-8 USD)"), default=0, editable=False)
    reserved_tokens = models.BigIntegerField(_("reserved tokens"), default=0, editable=False)
    updated_at = models.DateTimeField(_("updated at"), default=timezone.now, editable=False)

    class Meta:
        verbose_name = _("budget")
        verbose_name_plural = _("budgets")
        ordering = ["subject"]

    def __str__(self) -> str:
        return self.label or self.subject


def _budget_link(related_name: str) -> Any:
    """The budget a row counts against, by its subject (deleted with it)."""
    return models.ForeignKey(
        Budget,
        verbose_name=_("budget"),
        on_delete=models.CASCADE,
        to_field="subject",
        related_name=related_name,
    )


class BudgetReservation(models.Model):
    """What one model call in flight reserved against one subject's budget; its usage row's
    write deletes it. One that outlives ``expires_at`` (its process died) stops counting."""

    budget = _budget_link("reservations")
    #: the call's reservation (one per subject it counts against).
    token = StorableCharField(_("token"), max_length=32)
    #: the chat making the call: "agentloop.chat:42".
    chat = StorableCharField(_("chat"), max_length=200)
    cost = models.BigIntegerField(_("cost (1e-8 USD)"), default=0)
    tokens = models.BigIntegerField(_("tokens"), default=0)
    expires_at = models.DateTimeField(_("expires at"))

    class Meta:
        verbose_name = _("budget reservation")
        verbose_name_plural = _("budget reservations")
        indexes = [models.Index(fields=["expires_at"], name="agentloop_reserve_expiry_idx")]

    def __str__(self) -> str:
        return f"{self.budget_id}: {self.chat}"


class BudgetSlot(models.Model):
    """A chat holding a place of its subject's ``chats_in_flight`` quota, or waiting in line
    for one (``waiting_since`` set; the line is in the order of the rows' keys). The place is
    free again once the chat no longer runs (taken back by the next chat in line)."""

    budget = _budget_link("slots")
    #: the chat's model label and key ("agentloop.chat", "42").
    chat_label = StorableCharField(_("chat model"), max_length=100)
    chat_key = StorableCharField(_("chat key"), max_length=64)
    taken_at = models.DateTimeField(_("taken at"), default=timezone.now)
    #: when a background chat found every place taken and queued for one; null: it holds one.
    waiting_since = models.DateTimeField(_("waiting since"), null=True, blank=True)

    class Meta:
        verbose_name = _("chat in flight")
        verbose_name_plural = _("chats in flight")
        constraints = [
            models.UniqueConstraint(
                fields=["budget", "chat_label", "chat_key"], name="agentloop_budget_slot_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.budget_id}: {self.chat_label}:{self.chat_key}"

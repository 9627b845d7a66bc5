"""``BudgetAdmin``: spend against budget per subject (an owner, a team...), and each subject's
own limits to edit.

The list shows, per subject, what it spent this day and this month and the tokens it used
against its limits (its row's, else ``AGENTLOOP["BUDGETS"]``'s), what its calls in flight
hold, and its chats running against its chats-in-flight quota. A page of rows costs a
constant number of queries (the rows, the places of the quota, one per chat model).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _

from ..budgets.limits import shown
from ..budgets.spend import Spend, spends
from ..models import Budget

__all__ = ["BudgetAdmin"]


def _amount(name: str, value: Any) -> str:
    return shown(Decimal(value)) if name.startswith("cost") else f"{int(value):,}"


def _against(spend: Spend | None, name: str) -> str:
    """ "$3.20 of $20.00", marked when nothing is left; "$3.20" with no limit."""
    if spend is None:
        return "—"
    used, limit = spend.used(name), spend.limits.value(name)
    if limit is None:
        return _amount(name, used)
    return format_html(
        '<span class="{}">{}</span> <span class="agentloop-quiet">{} {}</span>',
        "agentloop-budget-reached" if used >= limit else "agentloop-budget",
        _amount(name, used),
        _("of"),
        _amount(name, limit),
    )


def _spend(obj: Any) -> Spend | None:
    spend: Spend | None = getattr(obj, "spend", None)
    if spend is None and obj.pk is not None:
        spend = obj.spend = spends([obj])[0]  # the change page: one row
    return spend


def _spend_column(name: str, description: Any) -> Any:
    """A column of the list (and a field of the change page): the row's spend of ``name``
    against its limit."""

    @admin.display(description=description)
    def column(model_admin: admin.ModelAdmin, obj: Any) -> str:
        return _against(_spend(obj), name)

    return column


class _SpendList(ChangeList):
    """The list's page of rows, each with its spend worked out for the whole page at once."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        rows = list(self.result_list)
        for row, spend in zip(rows, spends(rows), strict=True):
            row.spend = spend


class BudgetAdmin(admin.ModelAdmin):
    """Budgets: a subject's spend against its limits; its own limits on the change page."""

    list_display = (
        "subject_label", "spent_today", "spent_this_month", "tokens_today", "running",
        "reserved",
    )  # fmt: skip
    search_fields = ("subject", "label")
    readonly_fields = ("subject", "spent_today", "spent_this_month", "tokens_today",
                       "tokens_this_month", "running", "reserved")  # fmt: skip
    fieldsets = (
        (None, {"fields": ("subject", "label")}),
        (
            _("Limits (empty: AGENTLOOP['BUDGETS'])"),
            {
                "fields": (
                    "cost_per_day",
                    "cost_per_month",
                    "tokens_per_day",
                    "tokens_per_month",
                    "chats_in_flight",
                )
            },  # fmt: skip
        ),
        (
            _("Spend"),
            {
                "fields": (
                    "spent_today",
                    "spent_this_month",
                    "tokens_today",
                    "tokens_this_month",
                    "running",
                    "reserved",
                )
            },  # fmt: skip
        ),
    )
    show_full_result_count = False

    class Media:
        css = {"all": ["agentloop/admin/chat_list.css"]}

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # rows are made when a subject's chats first call a model

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return _SpendList

    @admin.display(description=_("subject"), ordering="label")
    def subject_label(self, obj: Any) -> str:
        return format_html(
            '<span class="agentloop-cut">{}</span><span class="agentloop-cut agentloop-quiet">'
            "{}</span>",
            obj.label or obj.subject,
            obj.subject,
        )

    spent_today = _spend_column("cost_per_day", _("cost today"))
    spent_this_month = _spend_column("cost_per_month", _("cost this month"))
    tokens_today = _spend_column("tokens_per_day", _("tokens today"))
    tokens_this_month = _spend_column("tokens_per_month", _("tokens this month"))
    running = _spend_column("chats_in_flight", _("chats in flight"))

    @admin.display(description=_("held by calls in flight"))
    def reserved(self, obj: Any) -> str:
        spend = _spend(obj)
        if spend is None:
            return "—"
        return format_html(
            '{} <span class="agentloop-quiet">{}</span>',
            _amount("cost", spend.reserved_cost),
            _("(%(tokens)s tokens)") % {"tokens": f"{spend.reserved_tokens:,}"},
        )


admin.site.register(Budget, BudgetAdmin)

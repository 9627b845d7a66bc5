"""The admin's usage charts: cost and tokens per day by model, and the top owners, for a range.

``admin/agentloop/usage/charts/`` (a link on the usage list). Each chart is one grouped
query over the range (``daily_by_model``, ``top_owners``), served by the covering index
``agentloop_usage_day_idx`` (created_at, with the summed columns included on PostgreSQL: an
index-only scan); the SVG is drawn on the server (``svg_charts``). Days are those of the
current time zone. See docs/usage-charts.md for the queries' plans and timings.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from django import forms
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.db.models import Count, F, QuerySet, Sum
from django.db.models.functions import TruncDay
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from .svg_charts import Series, horizontal_bars, stacked_bars

__all__ = [
    "MAX_DAYS",
    "RangeForm",
    "charts_view",
    "daily_by_model",
    "daily_by_model_query",
    "top_owners",
    "top_owners_query",
]

#: the longest range one page draws (a bar per day).
MAX_DAYS = 400
#: models drawn apart; the others are summed into one "other models" stack.
MODELS_SHOWN = 8
TOP_OWNERS = 10
PRESETS = (7, 30, 90, 365)


class RangeForm(forms.Form):
    """The chosen range: first and last day, both included."""

    start = forms.DateField(label=_("From"), widget=forms.DateInput(attrs={"type": "date"}))
    end = forms.DateField(label=_("To"), widget=forms.DateInput(attrs={"type": "date"}))

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        start, end = cleaned.get("start"), cleaned.get("end")
        if start and end:
            if end < start:
                raise forms.ValidationError(_("The last day comes before the first."))
            if (end - start).days + 1 > MAX_DAYS:
                raise forms.ValidationError(_("Choose at most %(days)d days.") % {"days": MAX_DAYS})
        return cleaned


def bounds(start: date, end: date) -> tuple[datetime, datetime]:
    """The instants from the start of ``start`` to the end of ``end`` (current time zone)."""
    first = datetime.combine(start, time.min)
    after = datetime.combine(end + timedelta(days=1), time.min)
    if settings.USE_TZ:
        first, after = timezone.make_aware(first), timezone.make_aware(after)
    return first, after


def in_range(usage: QuerySet[Any], start: date, end: date) -> QuerySet[Any]:
    first, after = bounds(start, end)
    return usage.filter(created_at__gte=first, created_at__lt=after)


def daily_by_model(usage: QuerySet[Any], start: date, end: date) -> list[dict[str, Any]]:
    """One grouped query: per day and provider/model, the cost, tokens and attempts."""
    return list(daily_by_model_query(usage, start, end))


def daily_by_model_query(usage: QuerySet[Any], start: date, end: date) -> QuerySet[Any]:
    """The query of :func:`daily_by_model` (to explain it, or run it yourself)."""
    return (
        in_range(usage, start, end)
        .annotate(day=TruncDay("created_at"))
        .values("day", "provider", "model")
        .annotate(
            cost=Sum("cost", default=Decimal(0)),
            input_tokens=Sum("input_tokens", default=0),
            output_tokens=Sum("output_tokens", default=0),
            attempts=Count("*"),
        )
        .order_by("day", "provider", "model")
    )


def top_owners(usage: QuerySet[Any], start: date, end: date) -> list[dict[str, Any]]:
    """One grouped query: the owners with the highest cost (then tokens) in the range; their
    names come from one primary-key lookup of those few users."""
    rows = list(top_owners_query(usage, start, end))
    users = get_user_model()._default_manager.in_bulk(
        [row["owner_id"] for row in rows if row["owner_id"] is not None]
    )
    for row in rows:
        user = users.get(row["owner_id"])
        row["owner"] = user.get_username() if user is not None else str(_("(no owner)"))
    return rows


def top_owners_query(usage: QuerySet[Any], start: date, end: date) -> QuerySet[Any]:
    """The grouped query of :func:`top_owners` (owner primary keys, not names)."""
    return (
        in_range(usage, start, end)
        .values("owner_id")
        .annotate(
            cost=Sum("cost", default=Decimal(0)),
            tokens=Sum(F("input_tokens") + F("output_tokens"), default=0),
            attempts=Count("*"),
        )
        .order_by("-cost", "-tokens", "owner_id")[:TOP_OWNERS]
    )


@dataclass
class _Daily:
    days: list[date]
    cost: list[Series]
    tokens: list[Series]
    models: list[dict[str, Any]]


def _label(row: dict[str, Any]) -> str:
    return f"{row['provider']}:{row['model']}" if row["provider"] else row["model"] or "?"


def _daily(rows: list[dict[str, Any]], start: date, end: date) -> _Daily:
    """The rows of ``daily_by_model`` as one series per model (the largest first)."""
    days = [start + timedelta(days=n) for n in range((end - start).days + 1)]
    index = {day: n for n, day in enumerate(days)}
    per_model: dict[str, dict[str, Any]] = {}
    for row in rows:
        label = _label(row)
        found = per_model.setdefault(
            label,
            {"label": label, "cost": [Decimal(0)] * len(days), "tokens": [0] * len(days),
             "input_tokens": 0, "output_tokens": 0, "attempts": 0, "total_cost": Decimal(0)},
        )  # fmt: skip
        day = row["day"]
        day = timezone.localtime(day).date() if isinstance(day, datetime) else day
        n = index.get(day)
        if n is None:
            continue
        found["cost"][n] += row["cost"]
        found["tokens"][n] += row["input_tokens"] + row["output_tokens"]
        found["input_tokens"] += row["input_tokens"]
        found["output_tokens"] += row["output_tokens"]
        found["attempts"] += row["attempts"]
        found["total_cost"] += row["cost"]
    ranked = sorted(
        per_model.values(),
        key=lambda m: (-m["total_cost"], -(m["input_tokens"] + m["output_tokens"]), m["label"]),
    )
    shown, rest = ranked[:MODELS_SHOWN], ranked[MODELS_SHOWN:]
    stacks = list(shown)
    if rest:
        stacks.append(
            {
                "label": str(_("%(count)d other models") % {"count": len(rest)}),
                "cost": [sum(m["cost"][n] for m in rest) for n in range(len(days))],
                "tokens": [sum(m["tokens"][n] for m in rest) for n in range(len(days))],
            }
        )
    return _Daily(
        days=days,
        cost=[Series(m["label"], m["cost"]) for m in stacks],
        tokens=[Series(m["label"], m["tokens"]) for m in stacks],
        models=ranked,
    )


def money(value: float) -> str:
    if value == 0:
        return "$0"
    return f"${value:,.2f}" if value >= 1 else f"${value:.4f}".rstrip("0")


def count(value: float) -> str:
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= size:
            return f"{value / size:.1f}".rstrip("0").rstrip(".") + suffix
    return f"{value:.0f}"


def default_range(today: date | None = None, days: int = 30) -> tuple[date, date]:
    today = today or timezone.localdate()
    return today - timedelta(days=days - 1), today


def charts_view(model_admin: Any, request: HttpRequest) -> HttpResponse:
    """The charts page: a GET form for the range, then the charts and their tables."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    start, end = default_range()
    form = RangeForm(request.GET or None, initial={"start": start, "end": end})
    if request.GET.get("days", "").isdigit():
        start, end = default_range(days=max(1, min(MAX_DAYS, int(request.GET["days"]))))
        form = RangeForm(initial={"start": start, "end": end})
    elif form.is_bound and form.is_valid():
        start, end = form.cleaned_data["start"], form.cleaned_data["end"]
    usage = model_admin.get_queryset(request).order_by()
    daily = _daily(daily_by_model(usage, start, end), start, end)
    owners = top_owners(usage, start, end)
    span = f"{start:%Y-%m-%d} – {end:%Y-%m-%d}"
    total_cost = sum((m["total_cost"] for m in daily.models), Decimal(0))
    total_tokens = sum(m["input_tokens"] + m["output_tokens"] for m in daily.models)
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.opts,
        "title": _("Usage charts"),
        "form": form,
        "presets": PRESETS,
        "start": start,
        "end": end,
        "has_usage": bool(daily.models),
        "models": daily.models,
        "owners": owners,
        "total_cost": total_cost,
        "total_tokens": f"{total_tokens:,}",
        "total_attempts": sum(m["attempts"] for m in daily.models),
        "cost_chart": stacked_bars(
            daily.days, daily.cost, title=f"Cost per day by model, {span}", formatter=money
        ),
        "tokens_chart": stacked_bars(
            daily.days,
            daily.tokens,
            title=f"Tokens (input + output) per day by model, {span}",
            formatter=count,
        ),
        "owners_chart": horizontal_bars(
            [(row["owner"], row["cost"], f"{count(row['tokens'])} tokens") for row in owners],
            title=f"Top {len(owners)} owners by cost, {span}",
            formatter=money,
        ),
    }
    return TemplateResponse(request, "admin/agentloop/usage/charts.html", context)

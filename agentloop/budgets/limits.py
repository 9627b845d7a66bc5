"""A subject's limits: its ``Budget`` row's own, else ``AGENTLOOP["BUDGETS"]``'s; and the
line a chat shows when one is reached."""

from __future__ import annotations

from dataclasses import dataclass, fields
from decimal import Decimal
from typing import Any

from ..conf import agentloop_settings
from .money import shown

__all__ = ["LIMITS", "Limits", "budgets_on", "limits_of", "reached"]

#: every limit, in the order they are checked.
LIMITS = ("cost_per_day", "cost_per_month", "tokens_per_day", "tokens_per_month",
          "chats_in_flight")  # fmt: skip


@dataclass(frozen=True)
class Limits:
    """What a subject may use; None: no limit."""

    cost_per_day: Decimal | None = None
    cost_per_month: Decimal | None = None
    tokens_per_day: int | None = None
    tokens_per_month: int | None = None
    chats_in_flight: int | None = None

    def value(self, name: str) -> Any:
        return getattr(self, name)


def budgets_on() -> bool:
    """Budgets count spend: ``AGENTLOOP["BUDGETS"]`` is set (``{}`` included)."""
    return agentloop_settings.BUDGETS is not None


def limits_of(row: Any) -> Limits:
    """The limits of a subject whose ``Budget`` row (or a dict of its columns, or None: no
    row yet) sets those it has, the settings' the others."""
    defaults = agentloop_settings.BUDGETS
    values = {}
    for field in fields(Limits):
        own = row.get(field.name) if isinstance(row, dict) else getattr(row, field.name, None)
        values[field.name] = own if own is not None else getattr(defaults, field.name, None)
    return Limits(**values)


def reached(limit: str, value: Any, label: str) -> str:
    """The chat's stop reason: "budget: $20.00/day reached for owner 42"."""
    if limit == "chats_in_flight":
        what = f"{value} chat{'s' if value != 1 else ''} in flight"
    else:
        kind, _, period = limit.partition("_per_")
        tokens = f"{int(value):,} token{'s' if int(value) != 1 else ''}"
        amount = shown(Decimal(value)) if kind == "cost" else tokens
        what = f"{amount}/{period}"
    return f"budget: {what} reached for {label}"

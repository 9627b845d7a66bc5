"""Helpers of the budget and rate-limit tests: a scripted model with a price, a subject hook
that counts a chat against its owner and their team, and a look at a subject's counters."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from agentloop.budgets import Subject
from agentloop.messages import TokenUsage
from agentloop.models import Budget
from agentloop.testing import ScriptedProvider

#: what a token costs on the priced models, input or output (US dollars).
PRICE_PER_TOKEN = Decimal("0.001")


class PricedProvider(ScriptedProvider):
    """A ScriptedProvider whose every token costs :data:`PRICE_PER_TOKEN`."""

    def cost(self, model: str, usage: TokenUsage) -> Decimal | None:
        return (usage.input_tokens + usage.output_tokens) * PRICE_PER_TOKEN


def owner_and_team(chat: Any) -> list[Any]:
    """``BUDGET_SUBJECT`` of the tests: the owner, and the team named by the chat's title
    ("team:<name>"), when it has one."""
    subjects: list[Any] = [chat.owner] if chat.owner_id else []
    if chat.title.startswith("team:"):
        subjects.append(Subject(chat.title, f"team {chat.title[5:]}"))
    return subjects


def no_subject(chat: Any) -> None:
    """``BUDGET_SUBJECT`` that counts no chat."""
    return None


def counters(subject: str) -> dict[str, Any]:
    """A subject's counters (costs in dollars)."""
    row = Budget.objects.get(subject=subject)
    unit = Decimal("0.00000001")
    return {
        "day_cost": row.day_cost * unit,
        "day_tokens": row.day_tokens,
        "month_cost": row.month_cost * unit,
        "reserved_cost": row.reserved_cost * unit,
        "reserved_tokens": row.reserved_tokens,
    }

"""Budgets across real OS processes: two of them racing for the last cent of one owner's
budget spend it exactly once (tests/processes/budget_racer.py), on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from django.db.models import Sum

from agentloop.models import Budget, BudgetReservation, Chat, Usage
from tests.processes import start_script, summary

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]

LIMIT = "0.37"  # 37 calls of exactly $0.01: the last one takes the last cent


def finish(process, timeout=120):
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err
    return summary(out)


def test_two_processes_racing_for_the_last_cent_spend_it_exactly_once(user, tmp_path, settings):
    budgets = {"BUDGETS": {"cost_per_day": LIMIT}}
    settings.AGENTLOOP = {**settings.AGENTLOOP, **budgets}
    chats = [Chat.objects.create(model="priced:test", owner=user) for _ in range(2)]
    go = tmp_path / "go"
    racers = [
        start_script(
            "budget_racer.py", chat.pk, go, env={"AGENTLOOP_TEST_SETTINGS": json.dumps(budgets)}
        )
        for chat in chats
    ]
    go.touch()
    results = [finish(racer) for racer in racers]

    assert sum(result["spent"] for result in results) == 37
    reason = f"budget: $0.37/day reached for owner {user.pk}"
    assert [result["refused"] for result in results] == [reason, reason]
    row = Budget.objects.get(subject=f"auth.user:{user.pk}")
    ledger = Usage.objects.filter(owner=user).aggregate(total=Sum("cost"))["total"]
    assert row.day_cost * Decimal("0.00000001") == Decimal(LIMIT) == ledger
    assert (row.reserved_cost, row.reserved_tokens, BudgetReservation.objects.count()) == (0, 0, 0)

"""Budgets on the database's clock (issue 41, defect 8): a reservation's expiry is set and
judged by the database, as a lease's is, so a process whose clock is behind or ahead neither
makes reservations that expire at once nor gives back live ones; and the day and month a
charge counts in are the database's, so a process behind just after midnight doesn't count
today's spend into yesterday (starting the day's counters again from nothing)."""

from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db.models.functions import Now
from django.utils import timezone

from agentloop import BudgetExceededError
from agentloop.budgets import release_expired, spend_of
from agentloop.engine.rate_limiting import CallEstimate
from agentloop.models import Budget, BudgetReservation, Chat
from tests.budget_helpers import counters
from tests.processes import run_script, summary

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]

TWENTY_MINUTES = 20 * 60
BUDGETS = {"BUDGETS": {"cost_per_day": "1.00"}, "BUDGET_RESERVATION_SECONDS": 900}


@pytest.fixture
def budgets(settings):
    settings.AGENTLOOP = {**settings.AGENTLOOP, **BUDGETS}


def skewed(action: str, chat_pk: int, offset: float, dollars: str = "0") -> dict:
    """Run tests/processes/skewed_budget.py with its clock ``offset`` seconds off."""
    done = run_script(
        "skewed_budget.py", action, chat_pk, offset, dollars,
        env={"AGENTLOOP_TEST_SETTINGS": json.dumps(BUDGETS)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return summary(done.stdout)


def tenth(user) -> Chat:
    return Chat.objects.create(model="priced:test", owner=user)


def reserve_dimes(chat: Chat, count: int) -> int:
    """Reserve $0.10 ``count`` times from this process; how many were granted."""
    granted = 0
    for _ in range(count):
        try:
            chat.conversation.store.budgets.reserve(
                CallEstimate("priced", "test", 5, 5, Decimal("0.1"))
            )
        except BudgetExceededError:
            break
        granted += 1
    return granted


def test_a_reservation_by_a_process_twenty_minutes_behind_is_not_given_back_at_once(budgets, user):
    chat = tenth(user)
    assert skewed("reserve", chat.pk, -TWENTY_MINUTES, "0.10")["reserved"] == 1

    # The sweeper, on a good clock: the reservation is fifteen minutes from expiry.
    assert release_expired() == 0
    # Nine more dimes fill the $1.00; the tenth would put $1.10 in flight.
    assert reserve_dimes(tenth(user), 10) == 9
    assert counters(f"auth.user:{user.pk}")["reserved_cost"] == Decimal("1.00")


def test_a_sweeper_twenty_minutes_ahead_gives_back_no_live_reservation(budgets, user):
    assert reserve_dimes(tenth(user), 3) == 3

    assert skewed("sweep", 0, TWENTY_MINUTES)["released"] == 0
    assert BudgetReservation.objects.count() == 3
    assert counters(f"auth.user:{user.pk}")["reserved_cost"] == Decimal("0.30")


def test_an_expired_reservation_is_given_back_by_the_database_clock(budgets, user):
    chat = tenth(user)
    assert reserve_dimes(chat, 2) == 2
    # One of them outlived its expiry (its process died long ago), by the database's clock.
    aged = BudgetReservation.objects.order_by("pk").first()
    BudgetReservation.objects.filter(pk=aged.pk).update(expires_at=Now() - timedelta(seconds=1))
    fresh = BudgetReservation.objects.exclude(pk=aged.pk).get()

    assert release_expired() == 1
    assert list(BudgetReservation.objects.values_list("pk", flat=True)) == [fresh.pk]
    assert counters(f"auth.user:{user.pk}")["reserved_cost"] == Decimal("0.10")


def test_a_process_behind_just_after_midnight_counts_its_spend_today(budgets, user):
    chat = tenth(user)
    reserve_dimes(chat, 3)  # reservations only: the counters' day is set by a charge
    assert skewed("spend", chat.pk, 0, "0.20")["reserved"] == 1
    row = Budget.objects.get(subject=f"auth.user:{user.pk}")
    assert row.day_cost == 20_000_000  # $0.20 today

    # Ten minutes before this (UTC) day began, by its clock.
    now = timezone.now()
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    behind = -((now - midnight).total_seconds() + 600)
    assert skewed("spend", chat.pk, behind, "0.10")["reserved"] == 1

    row.refresh_from_db()
    assert (row.day, row.day_cost) == (now.date(), 30_000_000)  # $0.30, today
    assert spend_of(user).cost_per_day == Decimal("0.30")

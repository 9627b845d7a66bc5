"""Budgets on real ``celery worker`` processes: two workers racing for the last cent of an
owner's budget make one model call between them, and the chat that found no room continues
once the limit is raised; a quota of chats in flight holds across workers, the chats past it
waiting in line until a place frees.

The "priced" model is the Celery tests' ``rules`` provider at $0.001 a token
(tests/settings.py): "Hi a" is answered "echo: Hi a" (10 input and 3 output tokens, $0.013)
after an estimate of 1 input and 10 output tokens ($0.011). Workers, queues and the fixture
are the Celery tests' (tests/workers.py, tests/conftest.py).
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db.models import Sum

from agentloop.models import Budget, BudgetReservation, BudgetSlot, Chat, ChatState, Usage
from tests.tools import wait_for_flag

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]


def priced_chat(user, text, *tools):
    chat = Chat.objects.create(model="priced:test", owner=user).with_max_output_tokens(10)
    if tools:
        chat.with_tools(*tools)
    return chat.ask_later(text)


def settled_or_stopped(*chats):
    states = dict(Chat.objects.filter(pk__in=[c.pk for c in chats]).values_list("pk", "state"))
    return all(states[c.pk] in (ChatState.IDLE, ChatState.STOPPED) for c in chats) and not (
        Chat.objects.filter(pk__in=[c.pk for c in chats]).exclude(lease_token="").exists()
    )


def spend_matches_ledger(user) -> Decimal:
    row = Budget.objects.get(subject=f"auth.user:{user.pk}")
    ledger = Usage.objects.filter(owner=user).aggregate(total=Sum("cost"))["total"]
    assert row.day_cost * Decimal("0.00000001") == ledger
    assert (row.reserved_cost, BudgetReservation.objects.count()) == (0, 0)
    return Decimal(ledger)


def test_two_workers_racing_for_the_last_cent_make_one_call_and_a_raised_limit_resumes(
    background, user
):
    budgets = {"BUDGETS": {"cost_per_day": "0.015"}}
    background.start_worker("w1", **budgets)
    background.start_worker("w2", **budgets)
    chats = [priced_chat(user, "Hi a"), priced_chat(user, "Hi b")]
    for chat in chats:
        chat.complete_later()

    background.wait(lambda: settled_or_stopped(*chats), "both chats to settle or stop")

    assert len(background.model_calls()) == 1
    by_state = {Chat.objects.get(pk=chat.pk).state: chat for chat in chats}
    assert set(by_state) == {ChatState.IDLE, ChatState.STOPPED}
    stopped = Chat.objects.get(pk=by_state[ChatState.STOPPED].pk)
    assert stopped.stop_reason == f"budget: $0.015/day reached for owner {user.pk}"
    assert [m.role for m in stopped.messages.all()] == ["user"]  # no call, nothing written
    assert spend_matches_ledger(user) == Decimal("0.013")

    Budget.objects.filter(subject=f"auth.user:{user.pk}").update(cost_per_day=Decimal("1"))
    stopped.complete_later()
    background.wait(lambda: settled_or_stopped(stopped), "the resumed chat to settle")

    stopped.refresh_from_db()
    assert (stopped.state, stopped.stop_reason) == (ChatState.IDLE, "")
    assert stopped.messages.last().content.startswith("echo: Hi ")
    assert len(background.model_calls()) == 2
    assert spend_matches_ledger(user) == Decimal("0.026")


def in_line(chat) -> bool:
    """Queued for a place of the quota: no job holds it, and it says what it waits for."""
    row = Chat.objects.get(pk=chat.pk)
    return (
        row.state == ChatState.QUEUED
        and row.lease_token == ""
        and row.waiting_for.endswith("(waiting for a place)")
    )


def test_a_quota_of_chats_in_flight_queues_chats_across_workers_in_order(background, user):
    """Issue 41, defect 11: the second chat waited stopped, and stayed stopped once the
    first was done. Now it waits queued in line, and goes (then the third) on its own."""
    quota = {"BUDGETS": {"chats_in_flight": 1}}
    background.start_worker("w1", flag=True, **quota)
    background.start_worker("w2", flag=True, **quota)
    first = priced_chat(user, "tools:wait_for_flag", wait_for_flag).complete_later()
    background.wait(lambda: "wait_for_flag" in background.runs(), "the first chat's tool to run")

    second = priced_chat(user, "Hi b").complete_later()
    background.wait(lambda: in_line(second), "the second chat to queue for a place")
    third = priced_chat(user, "Hi c").complete_later()
    background.wait(lambda: in_line(third), "the third chat to queue behind it")

    second_row = Chat.objects.get(pk=second.pk)
    assert (second_row.state, second_row.stop_reason) == (ChatState.QUEUED, "")
    assert second_row.waiting_for == (
        f"budget: 1 chat in flight reached for owner {user.pk} (waiting for a place)"
    )
    line = BudgetSlot.objects.filter(waiting_since__isnull=False).order_by("pk")
    assert list(line.values_list("chat_key", flat=True)) == [str(second.pk), str(third.pk)]
    assert [m.role for m in second_row.messages.all()] == ["user"]  # no call made, no job

    (background.tmp / "never-created").touch()  # the first chat's tool finishes
    background.wait(lambda: settled_or_stopped(first, second, third), "the three to settle")

    for chat in (first, second, third):
        row = Chat.objects.get(pk=chat.pk)
        assert (row.state, row.stop_reason, row.waiting_for) == (ChatState.IDLE, "", "")
    assert Chat.objects.get(pk=second.pk).messages.last().content == "echo: Hi b"
    assert Chat.objects.get(pk=third.pk).messages.last().content == "echo: Hi c"
    # One at a time, in the order they came: each turn's model calls after the one before.
    calls = list(Usage.objects.order_by("pk").values_list("chat_id", flat=True))
    assert calls == [first.pk, first.pk, second.pk, third.pk]
    # Every place given back: a run leaves its place just after its release made it idle.
    background.wait(lambda: not BudgetSlot.objects.exists(), "every place to be given back")

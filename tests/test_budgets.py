"""Budgets and quotas per subject (docs/budgets.md), in process, on SQLite and PostgreSQL.

The priced model (tests/budget_helpers.py) charges $0.001 a token. A scripted "ok" uses 10
input and 1 output tokens: $0.011. Chats set ``max_output_tokens`` to 10, so a call's
estimate is 10 output tokens plus a quarter of a token per character of its transcript:
$0.010 for the first "Hi", growing with the history.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from decimal import Decimal

import pytest
from asgiref.sync import async_to_sync
from django.db import connection, connections
from django.db.models import Sum
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext

from agentloop import BudgetExceededError, CancelledError, providers, signals
from agentloop.budgets import Subject, release_expired, spend_of
from agentloop.engine.rate_limiting import CallEstimate
from agentloop.exceptions import RateLimitError
from agentloop.messages import TokenUsage
from agentloop.models import Budget, BudgetReservation, BudgetSlot, Chat, ChatState, Usage
from agentloop.testing import FunctionProvider, ScriptedProvider, reply, stream
from tests.budget_helpers import counters

pytestmark = pytest.mark.django_db


@pytest.fixture
def budgets(settings):
    """``budgets(cost_per_day="0.03", ...)`` sets AGENTLOOP["BUDGETS"] (and other keys)."""

    def set_budgets(*, others=None, **limits):
        settings.AGENTLOOP = {**settings.AGENTLOOP, "BUDGETS": limits, **(others or {})}

    return set_budgets


def new_chat(user, **fields):
    return Chat.objects.create(model="priced:test", owner=user, **fields).with_max_output_tokens(10)


def owner_key(user) -> str:
    return f"auth.user:{user.pk}"


def ledger(user) -> dict:
    """The usage rows' totals: what the counters must equal."""
    rows = Usage.objects.filter(owner=user)
    total = rows.aggregate(cost=Sum("cost", default=Decimal(0)))["cost"]
    tokens = sum(row.input_tokens + row.output_tokens for row in rows)
    return {"cost": Decimal(total), "tokens": tokens}


def test_a_chat_past_its_owners_daily_budget_stops_before_the_call_with_the_reason(
    priced, budgets, user
):
    budgets(cost_per_day="0.03")
    priced.add("ok", "ok", "never sent")
    sent = []
    signals.budget_exceeded.connect(lambda sender, **kw: sent.append(("budget", kw)), weak=False)
    signals.chat_stopped.connect(lambda sender, **kw: sent.append(("stopped", kw)), weak=False)
    chat = new_chat(user)
    try:
        chat.ask("Hi")
        chat.ask("Hi")  # $0.022 spent; the third call's estimate ($0.012) has no room

        with pytest.raises(BudgetExceededError) as raised:
            chat.ask("Hi")
    finally:
        signals.budget_exceeded.receivers.clear()
        signals.chat_stopped.receivers.clear()

    reason = f"budget: $0.03/day reached for owner {user.pk}"
    assert (raised.value.reason, raised.value.subject, raised.value.limit) == (
        reason, f"owner {user.pk}", "cost_per_day",
    )  # fmt: skip
    assert len(priced.requests) == 2
    chat.refresh_from_db()
    assert (chat.state, chat.stop_reason) == (ChatState.STOPPED, reason)
    assert [(kind, kw["reason"]) for kind, kw in sent] == [("budget", reason), ("stopped", reason)]
    assert (sent[0][1]["subject"], sent[0][1]["limit"]) == (f"owner {user.pk}", "cost_per_day")
    assert counters(owner_key(user)) == {
        "day_cost": Decimal("0.022"), "day_tokens": 22, "month_cost": Decimal("0.022"),
        "reserved_cost": 0, "reserved_tokens": 0,
    }  # fmt: skip


def test_the_async_verbs_are_held_to_the_same_budgets(priced, budgets, user):
    budgets(cost_per_day="0.015")
    priced.add("ok")
    chat = new_chat(user)
    async_to_sync(chat.aask)("Hi")

    with pytest.raises(BudgetExceededError) as raised:
        async_to_sync(chat.aask)("Hi again")

    assert raised.value.reason == f"budget: $0.015/day reached for owner {user.pk}"
    assert counters(owner_key(user))["day_cost"] == ledger(user)["cost"] == Decimal("0.011")


def test_a_raised_limit_lets_the_stopped_chat_continue_its_turn(priced, budgets, user):
    budgets(cost_per_day="0.015")
    priced.add("ok", "answered at last")
    chat = new_chat(user)
    chat.ask("Hi")
    with pytest.raises(BudgetExceededError):
        chat.ask("Hi again")

    Budget.objects.filter(subject=owner_key(user)).update(cost_per_day=Decimal("1.00"))
    answer = chat.complete()  # resume: the same turn goes on

    assert answer.content == "answered at last"
    chat.refresh_from_db()
    assert (chat.state, chat.stop_reason) == (ChatState.IDLE, "")
    assert [m.role for m in chat.messages.all()] == ["user", "assistant", "user", "assistant"]


def test_the_next_day_a_daily_budget_starts_again(priced, budgets, user):
    budgets(cost_per_day="0.015")
    priced.add("ok", "a new day")
    chat = new_chat(user)
    chat.ask("Hi")
    with pytest.raises(BudgetExceededError):
        chat.ask("Hi again")

    # A day passes, by the database's clock (which counts the days): the spend so far is
    # yesterday's. Moving this process's clock changes nothing.
    row = Budget.objects.get(subject=owner_key(user))
    yesterday = row.day - timedelta(days=1)
    Budget.objects.filter(pk=row.pk).update(day=yesterday, month=yesterday.replace(day=1))
    assert chat.complete().content == "a new day"
    found = counters(owner_key(user))

    assert found["day_cost"] == Decimal("0.013")  # today's only: 10 + 3 tokens
    same_month = yesterday.month == row.day.month
    assert found["month_cost"] == (Decimal("0.024") if same_month else Decimal("0.013"))


def test_a_call_in_flight_when_the_budget_is_reached_is_kept_and_charged_exactly(
    priced, budgets, user
):
    budgets(cost_per_day="0.015")
    big = reply("a long answer", usage=TokenUsage(input_tokens=10, output_tokens=10))
    priced.add(big)
    chat = new_chat(user)

    assert chat.ask("Hi").content == "a long answer"  # estimated $0.010, cost $0.020
    with pytest.raises(BudgetExceededError):
        chat.ask("Hi again")

    assert counters(owner_key(user))["day_cost"] == Decimal("0.02") == ledger(user)["cost"]
    assert len(priced.requests) == 1


def test_tokens_per_day_count_every_token_and_hold_models_of_unknown_price(budgets, user):
    """A cost budget can't count a model whose price nobody knows; a tokens budget can."""
    model = ScriptedProvider("ok", "ok", "never sent")
    providers.register("unpriced", model)
    try:
        budgets(cost_per_day="0.001", tokens_per_day=28)
        chat = Chat.objects.create(model="unpriced:test", owner=user).with_max_output_tokens(5)
        chat.ask("Hi")  # 11 tokens, no cost: the cost budget has room still
        chat.ask("Hi")  # 22 tokens
        with pytest.raises(BudgetExceededError) as raised:
            chat.ask("Hi")  # 22 + an estimate of 2 + 5 tokens: over 28
    finally:
        providers.unregister("unpriced")

    assert raised.value.reason == f"budget: 28 tokens/day reached for owner {user.pk}"
    assert counters(owner_key(user))["day_tokens"] == 22 == ledger(user)["tokens"]
    assert counters(owner_key(user))["day_cost"] == 0


def test_a_monthly_budget_counts_the_days_of_the_month(priced, budgets, user):
    budgets(cost_per_month="0.02")
    priced.add("ok")
    chat = new_chat(user)
    chat.ask("Hi")

    with pytest.raises(BudgetExceededError) as raised:
        chat.ask("Hi")

    assert raised.value.reason == f"budget: $0.02/month reached for owner {user.pk}"


def test_each_subject_the_hook_returns_holds_its_own_budget(priced, budgets, user):
    budgets(cost_per_day="1.00", others={"BUDGET_SUBJECT": "tests.budget_helpers.owner_and_team"})
    priced.add("ok", "ok")
    chat = new_chat(user, title="team:red")
    chat.ask("Hi")
    Budget.objects.filter(subject="team:red").update(cost_per_day=Decimal("0.012"))

    with pytest.raises(BudgetExceededError) as raised:
        chat.ask("Hi")

    assert raised.value.reason == "budget: $0.012/day reached for team red"
    # The refused call reserved nothing, for the team nor for the owner.
    for subject in (owner_key(user), "team:red"):
        assert counters(subject)["day_cost"] == Decimal("0.011")
        assert counters(subject)["reserved_cost"] == 0
    assert Budget.objects.get(subject="team:red").label == "team red"


def test_a_chat_no_subject_counts_is_not_held(priced, budgets, user):
    budgets(cost_per_day="0", others={"BUDGET_SUBJECT": "tests.budget_helpers.no_subject"})
    priced.add("ok")
    chat = new_chat(user)

    assert chat.ask("Hi").content == "ok"
    assert not Budget.objects.exists()


def test_a_chat_without_owner_counts_against_no_budget(priced, budgets):
    budgets(cost_per_day="0")
    priced.add("ok")
    chat = Chat.objects.create(model="priced:test")

    assert chat.ask("Hi").content == "ok"
    assert not Budget.objects.exists()


def test_failed_and_cancelled_attempts_are_charged_and_their_reservations_given_back(
    priced, budgets, user, settings
):
    budgets(cost_per_day="5.00", others={"RETRY_BACKOFF": 0, "PARTIAL_SAVE_INTERVAL": 0})
    chat = new_chat(user)
    priced.add(RateLimitError("slow down", status=429), "recovered")
    assert chat.ask("Hi").content == "recovered"

    def cancel_mid_stream(chunk):
        chat.cancel()

    priced.add(stream("a", "b", "c"))
    with pytest.raises(CancelledError):
        chat.ask("Stream", stream=cancel_mid_stream)

    statuses = sorted(Usage.objects.filter(owner=user).values_list("status", flat=True))
    assert statuses == ["cancelled", "failed", "succeeded"]
    found, exact = counters(owner_key(user)), ledger(user)
    assert (found["day_cost"], found["day_tokens"]) == (exact["cost"], exact["tokens"])
    assert (found["reserved_cost"], found["reserved_tokens"]) == (0, 0)
    assert not BudgetReservation.objects.exists()


def expire_reservations() -> None:
    """Every reservation past its expiry, as the database's clock (which judges it) will
    see them once ``BUDGET_RESERVATION_SECONDS`` have passed; moving this process's clock
    expires nothing."""
    BudgetReservation.objects.update(expires_at=Now() - timedelta(seconds=1))


def test_a_reservation_left_by_a_dead_process_expires(priced, budgets, user, settings):
    budgets(cost_per_day="0.015", others={"BUDGET_RESERVATION_SECONDS": 60})
    chat = new_chat(user)
    estimate = CallEstimate("priced", "test", 0, 10, Decimal("0.010"))
    chat.conversation.store.budgets.reserve(estimate)  # the process "dies" before its usage row
    priced.add("ok")
    with pytest.raises(BudgetExceededError):
        chat.ask("Hi")  # the dead call's $0.010 leaves no room for this one's
    assert counters(owner_key(user))["reserved_cost"] == Decimal("0.01")

    expire_reservations()  # 61 s later, by the database's clock
    assert chat.complete().content == "ok"  # the reservation had expired: given back

    assert counters(owner_key(user))["reserved_cost"] == 0
    assert release_expired() == 0  # nothing left for the sweeper


def test_the_sweeper_gives_back_expired_reservations(budgets, user):
    budgets(cost_per_day="1.00", others={"BUDGET_RESERVATION_SECONDS": 60})
    chat = new_chat(user)
    chat.conversation.store.budgets.reserve(CallEstimate("priced", "test", 5, 10, Decimal("0.5")))

    expire_reservations()
    assert release_expired() == 1

    assert (counters(owner_key(user))["reserved_cost"], BudgetReservation.objects.count()) == (0, 0)


@pytest.mark.django_db(transaction=True)
def test_a_quota_of_chats_in_flight_stops_a_chat_while_another_runs(budgets, user):
    budgets(chats_in_flight=1)
    holding, held = threading.Event(), threading.Event()

    def answer(request):
        if request.messages[-1].content == "hold":
            held.set()
            holding.wait(30)
        return "ok"

    providers.register("priced", FunctionProvider(answer))
    first, second = new_chat(user), new_chat(user)
    errors = []
    runner = threading.Thread(target=lambda: _ask(first, "hold", errors))
    runner.start()
    try:
        assert held.wait(30)
        with pytest.raises(BudgetExceededError) as raised:
            second.ask("Hi")  # the first chat runs: its place is taken
    finally:
        holding.set()
        runner.join(30)
        providers.unregister("priced")
    providers.register("priced", FunctionProvider(answer))
    try:
        assert second.complete().content == "ok"  # the first one's place is free again
    finally:
        providers.unregister("priced")

    assert errors == []
    assert raised.value.reason == f"budget: 1 chat in flight reached for owner {user.pk}"
    # A verb in-process can't wait in line: it stopped (and queued for nothing). Each run
    # gave its place back when it ended.
    assert not BudgetSlot.objects.exists()


def _ask(chat, text, errors):
    try:
        chat.ask(text)
    except Exception as exc:  # pragma: no cover - reported by the test
        errors.append(exc)
    finally:
        connections.close_all()  # this thread's own


@pytest.mark.django_db(transaction=True)
def test_budgets_off_cost_no_statement_and_on_a_constant_few(priced, settings, user):
    """A job's model step, outside any transaction (tests/test_query_counts.py counts it):
    on PostgreSQL the reservation is one statement and the charge rides in the step's
    one-statement write; elsewhere the reservation is three (the row read, its UPDATE, the
    reservation's INSERT) and the charge two more in the answer's transaction."""
    priced.add("ok", "ok", "ok", "ok")
    chat = new_chat(user)
    chat.ask("warm up")  # statements compiled, tools loaded
    chat.ask_later("Hi")
    with CaptureQueriesContext(connection) as off:
        chat.generate()

    settings.AGENTLOOP = {**settings.AGENTLOOP, "BUDGETS": {"cost_per_day": "5"}}
    chat = Chat.objects.get(pk=chat.pk)
    chat.ask("make the budget row")
    chat.ask_later("Hi")
    with CaptureQueriesContext(connection) as on:
        chat.generate()

    assert not [q for q in off.captured_queries if "agentloop_budget" in q["sql"]]
    budget_sql = [
        q["sql"].split()[0] for q in on.captured_queries if "agentloop_budget" in q["sql"]
    ]
    if connection.vendor == "postgresql":
        assert budget_sql == ["WITH", "WITH"]  # the reservation; the step's write
        assert len(on.captured_queries) == len(off.captured_queries) + 1
    else:
        assert budget_sql == ["SELECT", "UPDATE", "INSERT", "DELETE", "UPDATE"]
        # ... and the reservation's transaction: BEGIN IMMEDIATE, COMMIT.
        assert len(on.captured_queries) == len(off.captured_queries) + 7
    charged = Usage.objects.order_by("-id")[:2]  # the calls made with budgets on
    assert counters(owner_key(user))["day_cost"] == sum(row.cost for row in charged)
    assert counters(owner_key(user))["reserved_cost"] == 0


def test_spend_of_a_subject_says_what_it_used_against_its_limits(priced, budgets, user):
    budgets(cost_per_day="0.02", tokens_per_month=1000)
    priced.add("ok")
    new_chat(user).ask("Hi")

    spend = spend_of(user)

    assert (spend.subject, spend.label) == (owner_key(user), f"owner {user.pk}")
    assert (spend.cost_per_day, spend.tokens_per_month, spend.chats_in_flight) == (
        Decimal("0.011"), 11, 0,
    )  # fmt: skip
    assert spend.limits.cost_per_day == Decimal("0.02")
    assert spend.reached() == []
    assert spend_of(Subject("nobody")).cost_per_day == 0


def test_the_admin_shows_spend_against_budget_per_owner(priced, budgets, user, admin_client):
    budgets(cost_per_day="0.022", chats_in_flight=3)
    priced.add("ok", "ok")
    new_chat(user).ask("Hi")
    new_chat(user).ask("Hi")  # $0.022: the day's budget is reached

    with CaptureQueriesContext(connection) as queries:
        page = admin_client.get("/admin/agentloop/budget/")

    html = page.content.decode()
    assert page.status_code == 200
    assert f"owner {user.pk}" in html
    assert 'class="agentloop-budget-reached">$0.022</span>' in html
    assert "of $0.022" in html and "of 3" in html
    few = len(queries.captured_queries)
    for number in range(4):
        Budget.objects.create(subject=f"team:{number}", label=f"team {number}")
    with CaptureQueriesContext(connection) as more:
        assert admin_client.get("/admin/agentloop/budget/").status_code == 200
    assert len(more.captured_queries) == few  # not a query per row

    row = Budget.objects.get(subject=owner_key(user))
    change = admin_client.get(f"/admin/agentloop/budget/{row.pk}/change/")
    assert change.status_code == 200 and "$0.022" in change.content.decode()


def test_a_call_is_estimated_only_when_a_budget_or_a_rate_limit_counts_it(
    priced, budgets, user, settings, monkeypatch
):
    from agentloop.engine import _model_calls

    estimated = []
    real = _model_calls.estimate_call
    monkeypatch.setattr(
        _model_calls, "estimate_call", lambda *args: estimated.append(args[1]) or real(*args)
    )
    priced.add("one", "two", "three")
    chat = new_chat(user)
    assert chat.conversation.store.budgets is None  # no AGENTLOOP["BUDGETS"]: no part
    assert chat.ask("Hi").content == "one"
    assert estimated == []  # nothing counts the call: the request isn't read for an estimate

    limits = {"priced": {"requests_per_minute": 1000}}
    settings.AGENTLOOP = {**settings.AGENTLOOP, "RATE_LIMITS": limits}
    chat = Chat.objects.get(pk=chat.pk)
    assert chat.ask("Hi").content == "two"
    assert len(estimated) == 1  # its buckets take the estimate

    settings.AGENTLOOP = {k: v for k, v in settings.AGENTLOOP.items() if k != "RATE_LIMITS"}
    budgets(cost_per_day="10")
    chat = Chat.objects.get(pk=chat.pk)
    assert chat.conversation.store.budgets is not None
    assert chat.ask("Hi").content == "three"
    assert len(estimated) == 2  # the budget reserves it
    assert Usage.objects.filter(chat=chat).count() == 3

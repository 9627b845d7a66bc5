"""Usage (docs/design.md §5): a row per provider attempt, charged to the chat's owner, subagent
usage charged to the root chat's owner, and totals per owner, model and period."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest
import time_machine
from django.test import override_settings

from agentloop import providers
from agentloop.exceptions import AuthenticationError, RateLimitError
from agentloop.messages import TokenUsage
from agentloop.models import Chat, Usage
from agentloop.testing import ScriptedProvider, reply, tool_call
from tests.agents import Director, Lead, Writer

pytestmark = pytest.mark.django_db

NO_WAITING = {"RETRY_BACKOFF": 0, "RETRY_BACKOFF_MAX": 0}


class PricedProvider(ScriptedProvider):
    """A scripted provider that knows its price: 1 per 1000 input, 2 per 1000 output tokens."""

    def cost(self, model, usage):
        return (Decimal(usage.input_tokens) + 2 * Decimal(usage.output_tokens)) / 1000


@pytest.fixture
def priced():
    provider = PricedProvider()
    providers.register("priced", provider)
    yield provider
    providers.unregister("priced")


@pytest.fixture
def other(django_user_model):
    return django_user_model.objects.create_user(username="grace")


def tokens(input_tokens, output_tokens, cached=0, reasoning=0):
    return TokenUsage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cached_tokens=cached,
        reasoning_tokens=reasoning,
    )


# -- a row per attempt ------------------------------------------------------------------------
def test_each_answer_records_a_usage_row_with_its_tokens_owner_chat_and_message(scripted, user):
    chat = Chat.objects.create(model="scripted:test", owner=user)
    scripted.add(reply("Hello", usage=tokens(12, 3, cached=4, reasoning=2)))

    answer = chat.ask("Hi")

    (usage,) = Usage.objects.all()
    assert (usage.owner, usage.chat, usage.message) == (user, chat, answer)
    assert (usage.provider, usage.model, usage.status) == ("scripted", "test", "succeeded")
    assert (usage.input_tokens, usage.output_tokens) == (12, 3)
    assert (usage.cached_tokens, usage.reasoning_tokens) == (4, 2)
    assert usage.cost is None  # the scripted provider knows no price
    assert usage.duration_ms is not None


def test_a_known_price_is_recorded_as_the_cost(priced, user):
    chat = Chat.objects.create(model="priced:test", owner=user)
    priced.add(reply("Hello", usage=tokens(1000, 500)))

    chat.ask("Hi")

    assert Usage.objects.get().cost == Decimal("2")


@override_settings(AGENTLOOP=NO_WAITING)
def test_every_attempt_is_a_row_failed_retries_included(scripted, user):
    chat = Chat.objects.create(model="scripted:test", owner=user)
    scripted.add(RateLimitError("slow down", status=429), reply("Hello", usage=tokens(5, 1)))

    chat.ask("Hi")

    failed, succeeded = Usage.objects.order_by("id")
    assert (failed.status, failed.owner, failed.message) == ("failed", user, None)
    assert "RateLimitError: slow down" in failed.error
    assert (failed.input_tokens, failed.output_tokens) == (0, 0)
    assert (succeeded.status, succeeded.owner) == ("succeeded", user)


def test_a_permanent_failure_is_a_failed_row_too(scripted, user):
    chat = Chat.objects.create(model="scripted:test", owner=user)
    scripted.add(AuthenticationError("bad key", status=401))

    with pytest.raises(AuthenticationError):
        chat.ask("Hi")

    assert [(u.status, u.owner) for u in Usage.objects.all()] == [("failed", user)]


def test_a_chat_without_an_owner_records_usage_without_one(scripted):
    chat = Chat.objects.create(model="scripted:test")
    scripted.add("Hello")

    chat.ask("Hi")

    assert Usage.objects.get().owner is None


# -- subagents: charged to the root chat's owner -------------------------------------------------
@pytest.fixture
def project(brains, user):
    """A Director chat whose Lead child hands research to a grandchild (3 chats)."""
    brains.script(
        "You are DIRECTOR.",
        reply("", tool_call("lead", {"task": "Study owls"}), usage=tokens(100, 10)),
        reply("Project done.", usage=tokens(200, 20)),
    )
    brains.script(
        "You are LEAD.",
        reply("", tool_call("research", {"task": "Owls?", "topic": "owls"}), usage=tokens(30, 3)),
        reply("Owls done.", usage=tokens(40, 4)),
    )
    brains.script("You are RESEARCH.", reply("Owls are birds.", usage=tokens(5, 1)))
    root = Director.create(owner=user)
    root.ask("Run the owl project")
    return root


def test_usage_of_subagents_is_charged_to_the_root_chats_owner(project, user):
    lead = Chat.objects.get(parent=project)
    research = Chat.objects.get(parent=lead)

    by_chat = {
        chat.pk: [u.owner for u in Usage.objects.filter(chat=chat)]
        for chat in (project, lead, research)
    }
    assert by_chat == {project.pk: [user, user], lead.pk: [user, user], research.pk: [user]}


def test_totals_for_an_owner_cover_the_parent_and_child_chats(project, user, other, scripted):
    Chat.objects.create(model="scripted:test", owner=other).ask_later("Hi")
    scripted.add(reply("Hello", usage=tokens(1000, 1000)))
    Chat.objects.get(owner=other).complete()

    totals = Usage.objects.for_owner(user).totals()

    assert totals == {
        "input_tokens": 100 + 200 + 30 + 40 + 5,
        "output_tokens": 10 + 20 + 3 + 4 + 1,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
        "reasoning_tokens": 0,
        "cost": Decimal(0),
        "attempts": 5,
        "failed": 0,
        "cancelled": 0,
    }
    assert Usage.objects.for_owner(other).totals()["attempts"] == 1


# -- totals ------------------------------------------------------------------------------------
@override_settings(AGENTLOOP=NO_WAITING)
def test_totals_count_failed_attempts_and_sum_only_known_costs(priced, scripted, user):
    Chat.objects.create(model="priced:test", owner=user).ask_later("Hi")
    priced.add(RateLimitError("slow", status=429), reply("Hello", usage=tokens(1000, 0)))
    Chat.objects.get(model="priced:test").complete()
    scripted.add(reply("Hello", usage=tokens(1000, 0)))
    Chat.objects.create(model="scripted:test", owner=user).ask("Hi")

    totals = Usage.objects.for_owner(user).totals()

    assert (totals["attempts"], totals["failed"], totals["cancelled"]) == (3, 1, 0)
    assert totals["cost"] == Decimal("1")  # the unpriced attempt adds nothing
    assert totals["input_tokens"] == 2000


def test_totals_of_an_owner_without_usage_are_zero(other):
    totals = Usage.objects.for_owner(other).totals()

    assert (totals["attempts"], totals["input_tokens"], totals["cost"]) == (0, 0, Decimal(0))


def test_by_model_totals_each_provider_and_model(brains, user):
    brains.script("You are LEAD.", reply("Lead.", usage=tokens(10, 1)))
    brains.script(
        "You are WRITER.",
        reply("Draft.", usage=tokens(20, 2)),
        reply("Final.", usage=tokens(30, 3)),
    )
    Lead.create(owner=user).ask("Lead")
    writer = Writer.create(owner=user)
    writer.ask("Write")
    writer.ask("Again")

    rows = list(Usage.objects.for_owner(user).by_model())

    assert [
        (r["provider"], r["model"], r["attempts"], r["input_tokens"], r["output_tokens"])
        for r in rows
    ] == [("agents", "small", 2, 50, 5), ("agents", "test", 1, 10, 1)]


def test_by_period_totals_each_day_week_and_month(scripted, user):
    chat = Chat.objects.create(model="scripted:test", owner=user)
    days = [datetime(2025, 3, 3, 9, tzinfo=UTC), datetime(2025, 3, 3, 17, tzinfo=UTC)]
    days += [datetime(2025, 3, 5, 12, tzinfo=UTC), datetime(2025, 4, 1, 12, tzinfo=UTC)]
    for when in days:
        scripted.add(reply("ok", usage=tokens(10, 1)))
        with time_machine.travel(when, tick=False):
            chat.ask("again")

    mine = Usage.objects.for_owner(user)

    def summary(period):
        return [(r["period"].date().isoformat(), r["attempts"]) for r in mine.by_period(period)]

    assert summary("day") == [("2025-03-03", 2), ("2025-03-05", 1), ("2025-04-01", 1)]
    assert summary("week") == [("2025-03-03", 3), ("2025-03-31", 1)]
    assert summary("month") == [("2025-03-01", 3), ("2025-04-01", 1)]
    assert [r["input_tokens"] for r in mine.by_period("month")] == [30, 10]

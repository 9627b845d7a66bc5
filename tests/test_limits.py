"""Per-turn limits on the in-memory chat: each stops the turn before the next model call."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import time_machine

import agentloop
from agentloop import ConfigurationError, LimitReachedError, providers
from agentloop.engine import Limits
from agentloop.engine._transcript_reading import TOOL_LIMIT_RESULT
from agentloop.testing import ScriptedProvider, tool_call
from tests.tools import add


def add_call(a: int = 1, b: int = 1):
    return tool_call("add", {"a": a, "b": b})


@pytest.fixture
def chat(scripted):
    return agentloop.chat("scripted:test", tools=[add])


class PricedProvider(ScriptedProvider):
    """A scripted provider that knows its price: every answer costs 0.50."""

    def cost(self, model, usage):
        return Decimal("0.50")


@pytest.fixture
def priced():
    provider = PricedProvider()
    providers.register("priced", provider)
    yield provider
    providers.unregister("priced")


# -- max_model_calls ----------------------------------------------------------------------------
def test_max_model_calls_stops_before_the_next_model_call(chat, scripted):
    chat.with_limits(max_model_calls=2)
    scripted.add(add_call(), add_call(), "never sent")
    chat.ask_later("keep adding")
    with pytest.raises(LimitReachedError, match="max_model_calls") as error:
        chat.complete()
    assert len(scripted.requests) == 2
    assert scripted.remaining == 1
    assert error.value.reason == "max_model_calls reached (2 of 2)"


def test_the_turn_stops_after_the_current_tool_results(chat, scripted):
    chat.with_limits(max_model_calls=1)
    scripted.add([add_call(1, 2), add_call(3, 4)], "never sent")
    with pytest.raises(LimitReachedError):
        chat.ask("add both")
    assert [m.role for m in chat.messages] == ["user", "assistant", "tool", "tool"]
    assert [m.content for m in chat.messages if m.role == "tool"] == ["3", "7"]


def test_the_stop_reason_is_recorded(chat, scripted):
    chat.with_limits(max_model_calls=1)
    scripted.add(add_call())
    with pytest.raises(LimitReachedError):
        chat.ask("go")
    assert chat.store.stop_reason == "max_model_calls reached (1 of 1)"


def test_the_stopped_event_gets_the_reason(chat, scripted):
    reasons = []
    chat.on("stopped", reasons.append).with_limits(max_model_calls=1)
    scripted.add(add_call())
    with pytest.raises(LimitReachedError):
        chat.ask("go")
    assert reasons == ["max_model_calls reached (1 of 1)"]


def test_a_new_user_message_starts_a_new_turn_and_clears_the_stop_reason(chat, scripted):
    chat.with_limits(max_model_calls=1)
    scripted.add(add_call(), "second turn answer")
    with pytest.raises(LimitReachedError):
        chat.ask("go")

    chat.ask_later("just answer")
    assert chat.store.stop_reason == ""
    answer = chat.complete()
    assert answer.content == "second turn answer"
    assert len(scripted.requests) == 2


def test_stepping_a_stopped_turn_again_raises_again_without_a_model_call(chat, scripted):
    chat.with_limits(max_model_calls=1)
    scripted.add(add_call(), "never sent")
    with pytest.raises(LimitReachedError):
        chat.ask("go")
    with pytest.raises(LimitReachedError):
        chat.step()
    assert len(scripted.requests) == 1


def test_a_limit_that_is_not_reached_does_not_stop_the_turn(chat, scripted):
    chat.with_limits(max_model_calls=2, max_tool_calls=5)
    scripted.add(add_call(), "done")
    assert chat.ask("go").content == "done"
    assert chat.store.stop_reason == ""


# -- max_tool_calls -------------------------------------------------------------------------------
def test_max_tool_calls_stops_before_the_next_model_call(chat, scripted):
    chat.with_limits(max_tool_calls=2)
    scripted.add(add_call(), add_call(), "never sent")
    with pytest.raises(LimitReachedError, match=r"max_tool_calls reached \(2 of 2\)"):
        chat.ask("keep adding")
    assert len(scripted.requests) == 2
    assert chat.store.stop_reason.startswith("max_tool_calls")


def test_max_tool_calls_holds_before_every_tool_call_of_a_round(chat, scripted):
    chat.with_limits(max_tool_calls=2)
    scripted.add([add_call(1, n) for n in range(6)], "never sent")
    with pytest.raises(LimitReachedError, match=r"max_tool_calls reached \(2 of 2\)"):
        chat.ask("six at once")
    results = [(m.content, m.is_error) for m in chat.messages if m.role == "tool"]
    assert results == [("1", False), ("2", False)] + [(TOOL_LIMIT_RESULT, True)] * 4
    assert TOOL_LIMIT_RESULT == "not run: the tool call limit was reached"
    assert len(scripted.requests) == 1
    assert chat.store.stop_reason == "max_tool_calls reached (2 of 2)"


def test_calls_kept_from_running_by_the_limit_do_not_count_once_it_is_raised(chat, scripted):
    chat.with_limits(max_tool_calls=2)
    scripted.add([add_call(1, n) for n in range(4)], "Done.")
    with pytest.raises(LimitReachedError):
        chat.ask("four at once")
    chat.with_limits(max_tool_calls=3)
    assert chat.complete().content == "Done."
    assert len(scripted.requests) == 2


def test_the_tool_call_limit_counts_calls_of_earlier_rounds(chat, scripted):
    chat.with_limits(max_tool_calls=3)
    scripted.add([add_call(), add_call()], [add_call(2, 2), add_call(3, 3)], "never sent")
    with pytest.raises(LimitReachedError, match=r"\(3 of 3\)"):
        chat.ask("two rounds")
    assert [m.content for m in chat.messages if m.role == "tool"] == [
        "2",
        "2",
        "4",
        TOOL_LIMIT_RESULT,
    ]
    assert len(scripted.requests) == 2


def test_the_tool_call_limit_holds_on_tool_threads(chat, scripted):
    chat.with_limits(max_tool_calls=2).with_tool_options(concurrency="threads")
    scripted.add([add_call(1, n) for n in range(4)], "never sent")
    with pytest.raises(LimitReachedError):
        chat.ask("four at once")
    contents = sorted(m.content for m in chat.messages if m.role == "tool")
    assert contents == ["1", "2", TOOL_LIMIT_RESULT, TOOL_LIMIT_RESULT]


# -- max_seconds --------------------------------------------------------------------------------
def test_max_seconds_stops_the_turn_once_that_much_time_has_passed(chat, scripted):
    chat.with_limits(max_seconds=60)
    scripted.add(add_call(), "never sent")
    with time_machine.travel(datetime(2030, 1, 1, 12, tzinfo=UTC), tick=False) as clock:
        chat.ask_later("slow work")
        chat.step()  # the model asks for a tool
        chat.step()  # the tool runs
        clock.shift(timedelta(seconds=61))
        with pytest.raises(LimitReachedError, match="max_seconds"):
            chat.step()
    assert len(scripted.requests) == 1
    assert chat.store.stop_reason.startswith("max_seconds reached (61.0s of 60")


def test_max_seconds_not_yet_reached_lets_the_model_answer(chat, scripted):
    chat.with_limits(max_seconds=60)
    scripted.add(add_call(), "in time")
    with time_machine.travel(datetime(2030, 1, 1, 12, tzinfo=UTC), tick=False) as clock:
        chat.ask_later("work")
        chat.step()
        chat.step()
        clock.shift(timedelta(seconds=59))
        assert chat.step().content == "in time"


def test_max_seconds_counts_from_the_latest_user_message(chat, scripted):
    chat.with_limits(max_seconds=60)
    scripted.add("first", "second")
    with time_machine.travel(datetime(2030, 1, 1, 12, tzinfo=UTC), tick=False) as clock:
        chat.ask("one")
        clock.shift(timedelta(hours=1))
        assert chat.ask("two").content == "second"


# -- max_cost -----------------------------------------------------------------------------------
def test_max_cost_stops_once_the_turns_cost_reaches_it(priced):
    chat = agentloop.chat("priced:test", tools=[add]).with_limits(max_cost=Decimal("1.00"))
    priced.add(add_call(), add_call(), "never sent")
    with pytest.raises(LimitReachedError, match=r"max_cost reached \(1.00 of 1.00\)"):
        chat.ask("spend")
    assert len(priced.requests) == 2
    assert [record.cost for _, record in chat.store.usage] == [Decimal("0.50")] * 2
    assert chat.store.stop_reason.startswith("max_cost")


def test_max_cost_counts_only_the_current_turn(priced):
    chat = agentloop.chat("priced:test", tools=[add]).with_limits(max_cost=Decimal("0.60"))
    priced.add("first", "second")
    chat.ask("one")
    assert chat.ask("two").content == "second"
    assert len(priced.requests) == 2


def test_max_cost_ignores_unpriced_usage(chat, scripted):
    chat.with_limits(max_cost=Decimal("0.01"))
    scripted.add(add_call(), add_call(), "done")
    assert chat.ask("free").content == "done"
    assert [record.cost for _, record in chat.store.usage] == [None, None, None]


# -- configuring limits ---------------------------------------------------------------------------
def test_with_limits_merges_with_earlier_limits(chat):
    chat.with_limits(max_model_calls=3).with_limits(max_tool_calls=4, max_cost="2.5")
    assert chat.store.config.get_config().limits == Limits(
        max_model_calls=3, max_tool_calls=4, max_cost=Decimal("2.5")
    )


def test_with_limits_none_removes_a_limit(chat):
    chat.with_limits(max_model_calls=3, max_seconds=10).with_limits(max_model_calls=None)
    assert chat.store.config.get_config().limits == Limits(max_seconds=10)


@pytest.mark.parametrize(
    "limits",
    [
        {"max_model_calls": 0},
        {"max_tool_calls": 0},
        {"max_seconds": 0},
        {"max_cost": Decimal("-1")},
        {"max_model_calls": "many"},
        {"max_tokens": 100},
    ],
    ids=["zero-model-calls", "zero-tool-calls", "zero-seconds", "negative-cost", "nan", "x"],
)
def test_invalid_limits_raise_configuration_error(chat, limits):
    with pytest.raises(ConfigurationError, match="Invalid limits"):
        chat.with_limits(**limits)
    assert chat.store.config.get_config().limits == Limits()

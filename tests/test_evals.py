"""Evals (docs/evals.md): sets of stored turns, replay with recorded tool results, scorers,
cases claimed once, and the reports; in this process (the Celery path: test_evals_celery)."""

from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from agentloop import providers
from agentloop.evals import NO_RECORDING, Outcome, check_scorers, score_outcome
from agentloop.evals.reports import compare, percentile, summarize
from agentloop.evals.runs import run_case, start_run
from agentloop.evals.sets import set_from_chats, set_from_jsonl
from agentloop.exceptions import ConfigurationError
from agentloop.messages import ModelRequest
from agentloop.models import Budget, Chat, EvalCase, EvalCaseState, EvalRun, EvalSet, Usage
from agentloop.testing import FunctionProvider, reply, tool_call
from tests.eval_helpers import LOOKED_UP, EvalModel, lookup_order

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def evalmodel() -> Any:
    providers.register("evalmodel", EvalModel())
    LOOKED_UP.clear()
    yield
    providers.unregister("evalmodel")


def stored_chat(user: Any, question: str) -> Chat:
    chat = Chat.objects.create(model="evalmodel:v1", owner=user).with_tools(lookup_order)
    chat.ask(question)
    return chat


# -- sets -------------------------------------------------------------------------------------
def test_a_set_from_chats_keeps_each_turn_and_its_recorded_answer(user):
    first = stored_chat(user, "Where is order 7?")
    first.ask("thanks")
    second = stored_chat(user, "hello")

    last = set_from_chats("last", Chat.objects.filter(pk__in=[first.pk, second.pk]).order_by("pk"))
    every = set_from_chats("all", [first], turns="all")

    assert [(i["chat"], i["input"], i["reference"]) for i in last.items] == [
        (first.pk, "thanks", "answer: thanks"),
        (second.pk, "hello", "answer: hello"),
    ]
    assert [(i["input"], i["reference"]) for i in every.items] == [
        ("Where is order 7?", "Order 7: order 7: shipped"),
        ("thanks", "answer: thanks"),
    ]


def test_a_jsonl_set_replays_at_the_last_user_message(tmp_path):
    conversation = [
        {"role": "user", "content": "Where is order 9?"},
        {"role": "assistant", "tool_calls": [
            {"id": "c1", "name": "lookup_order", "arguments": {"order": "9"}}]},
        {"role": "tool", "tool_call_id": "c1", "tool_name": "lookup_order",
         "content": "order 9: lost"},
        {"role": "assistant", "content": "Order 9: order 9: lost"},
    ]  # fmt: skip
    path = tmp_path / "set.jsonl"
    path.write_text(
        json.dumps({"messages": conversation, "tools": ["tests.eval_helpers.lookup_order"]})
        + "\n\n"
        + json.dumps({"messages": [{"role": "user", "content": "hi"}], "expected": "answer: hi"})
    )

    eval_set = set_from_jsonl("jsonl", path)
    run = start_run(eval_set, "evalmodel:v2")

    cases = list(run.cases.order_by("position"))
    assert [(c.input, c.reference, c.state) for c in cases] == [
        ("Where is order 9?", "Order 9: order 9: lost", EvalCaseState.PASSED),
        ("hi", "", EvalCaseState.PASSED),  # scored against its "expected"
    ]
    assert cases[0].tool_calls == [
        {"name": "lookup_order", "arguments": {"order": "9"}, "result": "order 9: lost",
         "is_error": False, "source": "recorded"},
    ]  # fmt: skip
    assert LOOKED_UP == []  # the recording answered: the tool's body never ran


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("not json", "line 2 of the eval set: Expecting value"),
        ('{"messages": "no"}', "line 2 of the eval set: a line is a JSON object"),
        ('{"messages": [{"role": "wizard"}]}', "line 2 of the eval set: 1 validation error"),
        (
            '{"messages": [{"role": "assistant", "content": "x"}]}',
            "line 2 of the eval set has no user",
        ),
    ],
)
def test_a_bad_jsonl_line_is_named_and_nothing_is_saved(line, error):
    good = json.dumps({"messages": [{"role": "user", "content": "hi"}]})

    with pytest.raises(ConfigurationError, match="^" + error.replace("(", r"\(")):
        set_from_jsonl("bad", [good, line])

    assert not EvalSet.objects.exists()


# -- replay -----------------------------------------------------------------------------------
def test_recorded_results_answer_matching_calls_and_the_tool_never_runs(user):
    stored_chat(user, "Where is order 7?")
    LOOKED_UP.clear()

    run = start_run(set_from_chats("s", Chat.objects.all()), "evalmodel:v2")

    case = run.cases.get()
    assert case.state == EvalCaseState.PASSED
    assert case.answer == case.reference == "Order 7: order 7: shipped"
    assert case.tool_calls[0]["source"] == "recorded"
    assert case.unmatched_calls == 0
    assert LOOKED_UP == []


def test_an_unmatched_call_gets_no_recording_and_is_counted(user):
    stored_chat(user, "Where is order 7?")
    LOOKED_UP.clear()

    def other_order(request: ModelRequest) -> Any:
        if request.messages[-1].role == "user":
            return tool_call("lookup_order", {"order": "8"})
        return reply(f"it says: {request.messages[-1].content}")

    providers.register("other", FunctionProvider(other_order))
    try:
        run = start_run(set_from_chats("s", Chat.objects.all()), "other:any")
    finally:
        providers.unregister("other")

    case = run.cases.get()
    expected_result = NO_RECORDING.format(name="lookup_order")
    assert case.tool_calls == [
        {"name": "lookup_order", "arguments": {"order": "8"}, "result": expected_result,
         "is_error": True, "source": "no recording"},
    ]  # fmt: skip
    assert case.unmatched_calls == 1
    assert case.answer == f"it says: {expected_result}"
    assert case.state == EvalCaseState.FAILED
    assert LOOKED_UP == []


def test_a_tool_opted_in_runs_for_real(user):
    stored_chat(user, "Where is order 7?")
    LOOKED_UP.clear()

    run = start_run(
        set_from_chats("s", Chat.objects.all()), "evalmodel:v2", live_tools=["lookup_order"]
    )

    assert run.cases.get().tool_calls[0]["source"] == "ran"
    assert LOOKED_UP == ["7"]


def test_the_candidates_instructions_replace_the_recorded_ones(user):
    chat = Chat.objects.create(model="evalmodel:v1", owner=user).with_instructions("Be old.")
    chat.ask("hi")
    seen: list[list[tuple[str, str]]] = []

    def record(request: ModelRequest) -> Any:
        seen.append([(m.role, m.content) for m in request.messages])
        return reply("hello")

    providers.register("seeing", FunctionProvider(record))
    try:
        start_run(set_from_chats("s", [chat]), "seeing:x", instructions="Be new.")
    finally:
        providers.unregister("seeing")

    assert seen == [[("system", "Be new."), ("user", "hi")]]


def test_eval_rows_never_reach_owners_chats_usage_or_budgets(user, settings):
    settings.AGENTLOOP = {**settings.AGENTLOOP, "BUDGETS": {"cost_per_month": "100"}}
    chat = stored_chat(user, "Where is order 7?")
    counters = ("day_cost", "day_tokens", "month_cost", "month_tokens", "reserved_cost")
    before = (
        list(Chat.objects.values_list("pk", flat=True)),
        list(Usage.objects.values_list("pk", "cost")),
        list(Budget.objects.values_list(*counters)),
    )
    assert before[2][0][2] > 0  # the owner's own chat did count

    run = start_run(set_from_chats("s", [chat]), "evalmodel:v2")

    case = run.cases.get()
    assert case.cost == Decimal("0.030")  # two model calls of 15 tokens at $0.001
    assert (case.input_tokens, case.output_tokens) == (20, 10)
    after = (
        list(Chat.objects.values_list("pk", flat=True)),
        list(Usage.objects.values_list("pk", "cost")),
        list(Budget.objects.values_list(*counters)),
    )
    assert after == before

"""Evals (docs/evals.md): sets of stored turns, replay with recorded tool results, scorers,
cases claimed once, and the reports; in this process (the Celery path: test_evals_celery)."""

from __future__ import annotations

import io
import json
import time
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from agentloop import providers
from agentloop.admin.usage_charts import daily_by_model, top_owners
from agentloop.budgets import spend_of
from agentloop.evals import NO_RECORDING, Outcome, check_scorers, score_outcome
from agentloop.evals.outcomes import EVAL_SUBJECT
from agentloop.evals.reports import compare, percentile, summarize
from agentloop.evals.running import run_case, start_run
from agentloop.evals.sets import set_from_chats, set_from_jsonl
from agentloop.exceptions import ConfigurationError
from agentloop.messages import ModelRequest
from agentloop.models import Batch, Budget, Chat, EvalCase, EvalCaseState, EvalRun, EvalSet, Usage
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


def replayed_to(user, **candidate: Any) -> tuple[list[list[tuple[str, str]]], Any]:
    """What a candidate model is sent when a chat told "Be old." is replayed with
    ``candidate`` (``start_run``'s options), and the run."""
    chat = Chat.objects.create(model="evalmodel:v1", owner=user).with_instructions("Be old.")
    chat.ask("hi")
    seen: list[list[tuple[str, str]]] = []

    def record(request: ModelRequest) -> Any:
        seen.append([(m.role, m.content) for m in request.messages])
        return reply("hello")

    providers.register("seeing", FunctionProvider(record))
    try:
        run = start_run(set_from_chats("s", [chat]), "seeing:x", **candidate)
    finally:
        providers.unregister("seeing")
    return seen, run


def test_the_candidates_instructions_replace_the_recorded_ones(user):
    seen, _ = replayed_to(user, instructions="Be new.")

    assert seen == [[("system", "Be new."), ("user", "hi")]]


def test_an_agent_as_candidate_brings_its_instructions(user):
    seen, run = replayed_to(user, agent_path="tests.agents.Writer")

    assert seen == [[("system", "You are WRITER."), ("user", "hi")]]  # the run's model, though
    assert run.cases.get().answer == "hello"


def test_eval_rows_never_reach_owners_chats_usage_or_budgets(user, settings):
    settings.AGENTLOOP = {**settings.AGENTLOOP, "BUDGETS": {"cost_per_month": "100"}}
    chat = stored_chat(user, "Where is order 7?")
    counters = ("day_cost", "day_tokens", "month_cost", "month_tokens", "reserved_cost")
    owners = Budget.objects.exclude(subject=EVAL_SUBJECT.key)
    today = timezone.localdate()

    def charts() -> tuple[Any, Any]:  # what the admin's usage charts draw
        return daily_by_model(Usage.objects.all(), today, today), top_owners(
            Usage.objects.all(), today, today
        )

    before = (
        list(Chat.objects.values_list("pk", flat=True)),
        list(Usage.objects.values_list("pk", "cost")),
        list(owners.values_list(*counters)),
        charts(),
    )
    assert before[2][0][2] > 0  # the owner's own chat did count
    assert before[3][0] and before[3][1]  # and is drawn in the usage charts

    run = start_run(set_from_chats("s", [chat]), "evalmodel:v2")

    case = run.cases.get()
    assert case.cost == Decimal("0.030")  # two model calls of 15 tokens at $0.001
    assert (case.input_tokens, case.output_tokens) == (20, 10)
    after = (
        list(Chat.objects.values_list("pk", flat=True)),
        list(Usage.objects.values_list("pk", "cost")),
        list(owners.values_list(*counters)),
        charts(),
    )
    assert after == before
    assert Budget.objects.count() == 2  # the owner's, and the evals' own (below)


def test_eval_cost_counts_against_the_evals_own_budget_subject(user, settings):
    settings.AGENTLOOP = {**settings.AGENTLOOP, "BUDGETS": {}}
    chat = stored_chat(user, "Where is order 7?")

    run = start_run(set_from_chats("s", [chat]), "evalmodel:v2")

    spend = spend_of(EVAL_SUBJECT.key)
    assert (spend.cost_per_day, spend.cost_per_month) == (Decimal("0.030"), Decimal("0.030"))
    assert spend.tokens_per_day == 30
    assert spend.cost_per_day == run.spent()
    assert spend_of(user).cost_per_day == Decimal("0.030")  # the owner's own chat, only


def test_no_eval_case_starts_once_the_evals_budget_is_reached(user, settings):
    settings.AGENTLOOP = {**settings.AGENTLOOP, "BUDGETS": {"cost_per_day": "100"}}
    Budget.objects.create(subject=EVAL_SUBJECT.key, label="evals", cost_per_day=Decimal("0.01"))
    for n in range(2):
        stored_chat(user, f"hello {n}")

    run = start_run(set_from_chats("s", Chat.objects.order_by("pk")), "evalmodel:v2")

    first, second = run.cases.order_by("position")
    assert first.state == EvalCaseState.PASSED  # $0.015: the limit is reached after it
    assert (second.state, second.error) == (
        EvalCaseState.SKIPPED, "not run: budget: $0.01/day reached for evals",
    )  # fmt: skip
    assert spend_of(user).reached() == []  # owners' budgets are theirs: $100/day


# -- scorers ----------------------------------------------------------------------------------
def outcome(answer: str, **more: Any) -> Outcome:
    return Outcome(input="Where is order 7?", reference="Order 7: shipped", answer=answer, **more)


@pytest.mark.parametrize(
    ("spec", "answer", "passed", "reason"),
    [
        ({"kind": "exact"}, " Order 7: shipped ", True, "the answer is the expected one"),
        ({"kind": "exact"}, "Order 7", False, "expected 'Order 7: shipped'"),
        ({"kind": "exact", "value": "ORDER 7", "ignore_case": True}, "order 7", True, ""),
        ({"kind": "contains", "value": ["7", "shipped"]}, "7 shipped", True, "contains every"),
        ({"kind": "contains", "value": ["lost"]}, "7 shipped", False, "missing ['lost']"),
        ({"kind": "regex", "pattern": r"^Order \d+"}, "Order 12", True, "matches"),
        ({"kind": "regex", "pattern": r"^Order \d+"}, "order 12", False, "no match"),
        ({"kind": "json_schema", "schema": {"type": "object", "required": ["id"]}},
         '{"id": 1}', True, "valid"),
        ({"kind": "json_schema", "schema": {"type": "object", "required": ["id"]}},
         '{"x": 1}', False, "not valid: 'id' is a required property"),
        ({"kind": "json_schema", "schema": {}}, "plain", False, "not JSON"),
        ({"kind": "function", "path": "tests.eval_helpers.says_shipped"}, "shipped", True,
         "says shipped"),
        ({"kind": "function", "path": "tests.eval_helpers.says_shipped"}, "lost", False,
         "no 'shipped'"),
    ],
)  # fmt: skip
def test_text_scorers(spec, answer, passed, reason):
    (score,) = score_outcome(check_scorers([spec]), outcome(answer))

    assert (score.name, score.passed, score.score) == (spec["kind"], passed, float(passed))
    assert reason in score.reason


def test_contains_scores_the_share_of_values_found():
    (score,) = score_outcome([{"kind": "contains", "value": ["a", "b", "c", "d"]}], outcome("ab"))

    assert (score.score, score.passed) == (0.5, False)


CALLS = [{"name": "lookup_order", "arguments": {"order": "7", "verbose": True}}]


@pytest.mark.parametrize(
    ("spec", "passed", "reason"),
    [
        ({"kind": "tool_call", "tool": "lookup_order"}, True, "called lookup_order"),
        ({"kind": "tool_call", "tool": "lookup_order", "arguments": {"order": "7"}}, True,
         "called lookup_order with {'order': '7'}"),
        ({"kind": "tool_call", "tool": "lookup_order", "arguments": {"order": "8"}}, False,
         "called lookup_order, not with {'order': '8'}"),
        ({"kind": "tool_call", "tool": "refund"}, False, "never called refund"),
        ({"kind": "tool_call", "tool": "refund", "called": False}, True, "did not call refund"),
        ({"kind": "tool_call", "tool": "lookup_order", "called": False}, False, "should not"),
    ],
)  # fmt: skip
def test_tool_call_expectations(spec, passed, reason):
    (score,) = score_outcome([spec], outcome("", tool_calls=CALLS))

    assert score.passed is passed
    assert reason in score.reason


def test_cost_and_latency_ceilings():
    specs = check_scorers(
        [{"kind": "max_cost", "dollars": "0.01"}, {"kind": "max_latency", "ms": 500}]
    )

    cheap_fast = score_outcome(specs, outcome("", cost=Decimal("0.01"), latency_ms=500))
    dear_slow = score_outcome(specs, outcome("", cost=Decimal("0.02"), latency_ms=501))

    assert [s.passed for s in cheap_fast] == [True, True]
    assert [(s.passed, s.reason) for s in dear_slow] == [
        (False, "cost $0.02 > $0.01"),
        (False, "501 ms > 500 ms"),
    ]


def test_the_judge_reads_the_rubric_and_its_reasoning_is_kept():
    asked: list[ModelRequest] = []

    def judge(request: ModelRequest) -> Any:
        asked.append(request)
        return reply('Looks right. {"reasoning": "names the order and its state", "score": 0.8}')

    providers.register("judge", FunctionProvider(judge))
    try:
        (passing,) = score_outcome(
            [{"kind": "judge", "model": "judge:x", "rubric": "Says where the order is."}],
            outcome("Order 7 shipped yesterday"),
        )
        (strict,) = score_outcome(
            [{"kind": "judge", "model": "judge:x", "threshold": 0.9, "name": "strict"}],
            outcome("Order 7 shipped yesterday"),
        )
    finally:
        providers.unregister("judge")

    assert (passing.name, passing.score, passing.passed) == ("judge (judge:x)", 0.8, True)
    assert passing.reason == "names the order and its state"
    assert (strict.name, strict.passed) == ("strict", False)
    system, user = asked[0].messages
    assert "Rubric: Says where the order is." in system.content
    assert "Order 7 shipped yesterday" in user.content and "Order 7: shipped" in user.content


def test_a_judge_that_gives_no_score_fails_saying_what_it_said():
    providers.register("judge", FunctionProvider(lambda request: reply("I like it.")))
    try:
        (score,) = score_outcome([{"kind": "judge", "model": "judge:x"}], outcome("x"))
    finally:
        providers.unregister("judge")

    assert (score.passed, score.reason) == (False, "the judge gave no score: I like it.")


@pytest.mark.parametrize(
    ("specs", "error"),
    [
        ({"kind": "exact"}, "An eval run's scorers are a list"),
        ([{"kind": "fuzzy"}], "scorer 1 must be a dict whose 'kind' is one of exact"),
        ([{"kind": "exact"}, {"kind": "regex"}], "scorer 2 (regex) needs pattern"),
        ([{"kind": "regex", "pattern": "("}], "scorer 1: 'pattern' is not a regex"),
        ([{"kind": "exact", "valeu": "x"}], "scorer 1 (exact) has unknown keys ['valeu']"),
        ([{"kind": "max_cost", "dollars": "lots"}], "scorer 1: 'dollars' must be a number"),
        ([{"kind": "function", "path": "tests.nowhere.f"}], "tests.nowhere.f"),
    ],
)
def test_bad_scorers_are_refused_before_any_case_runs(specs, error, user):
    eval_set = set_from_jsonl("s", [json.dumps({"messages": [{"role": "user", "content": "x"}]})])

    with pytest.raises(ConfigurationError) as raised:
        start_run(eval_set, "evalmodel:v2", scorers=specs)

    assert error in str(raised.value)
    assert not EvalRun.objects.exists()


def test_a_case_passes_only_when_every_scorer_passes(user):
    stored_chat(user, "Where is order 7?")
    scorers = [
        {"kind": "contains", "value": "shipped"},
        {"kind": "tool_call", "tool": "lookup_order", "arguments": {"order": "7"}},
        {"kind": "max_cost", "dollars": "0.001"},  # it costs $0.03
    ]

    run = start_run(set_from_chats("s", Chat.objects.all()), "evalmodel:v2", scorers=scorers)

    case = run.cases.get()
    assert case.state == EvalCaseState.FAILED
    assert [s["passed"] for s in case.scores] == [True, True, False]
    assert case.score == pytest.approx(2 / 3)


# -- claims -----------------------------------------------------------------------------------
def pending_case(user: Any) -> EvalCase:
    stored_chat(user, "hello")
    run = start_run(set_from_chats("s", Chat.objects.all()), "evalmodel:v2", send=False)
    return run.cases.get()


def test_a_finished_case_is_never_run_again(user):
    case = pending_case(user)

    assert run_case(case.pk).action == "done"
    assert run_case(case.pk).action == "finished"

    case.refresh_from_db()
    assert (case.state, case.attempts, case.lease_token) == (EvalCaseState.PASSED, 1, "")


def test_a_case_held_by_a_live_lease_is_left_to_its_job(user):
    case = pending_case(user)
    expires = timezone.now() + timedelta(seconds=20)
    EvalCase.objects.filter(pk=case.pk).update(
        state=EvalCaseState.RUNNING, lease_token="other", lease_expires_at=expires
    )

    outcome = run_case(case.pk)

    assert outcome.action == "held"
    assert 19 < outcome.retry_in <= 21
    case.refresh_from_db()
    assert (case.state, case.lease_token, case.answer) == (EvalCaseState.RUNNING, "other", "")


def test_a_case_whose_lease_expired_is_taken_over_and_run_once_more(user):
    case = pending_case(user)
    expired = timezone.now() - timedelta(seconds=1)
    EvalCase.objects.filter(pk=case.pk).update(
        state=EvalCaseState.RUNNING, lease_token="dead", lease_expires_at=expired, attempts=1
    )

    assert run_case(case.pk).action == "done"

    case.refresh_from_db()
    assert (case.state, case.attempts, case.answer) == (EvalCaseState.PASSED, 2, "answer: hello")


@pytest.mark.django_db(transaction=True)
def test_the_lease_is_renewed_while_the_candidate_answers(user, settings):
    settings.AGENTLOOP = {**settings.AGENTLOOP, "LEASE_SECONDS": 0.3}
    case = pending_case(user)
    meanwhile: list[str] = []

    def slow(request: ModelRequest) -> Any:
        time.sleep(0.9)  # three leases long: renewed every 0.1 s meanwhile
        meanwhile.append(run_case(case.pk).action)  # another job, now
        return reply("answer: hello")

    providers.register("slow", FunctionProvider(slow))
    try:
        EvalRun.objects.filter(pk=case.run_id).update(model="slow:x")
        assert run_case(case.pk).action == "done"
    finally:
        providers.unregister("slow")

    assert meanwhile == ["held"]
    case.refresh_from_db()
    assert (case.state, case.attempts) == (EvalCaseState.PASSED, 1)


def test_a_job_that_lost_its_lease_writes_nothing(user, monkeypatch):
    case = pending_case(user)
    from agentloop.evals import running as runs

    real = runs.replay

    def taken_over_meanwhile(*args: Any) -> Any:
        attempt = real(*args)
        EvalCase.objects.filter(pk=case.pk).update(lease_token="another job")
        return attempt

    monkeypatch.setattr(runs, "replay", taken_over_meanwhile)

    assert run_case(case.pk).action == "lost"

    case.refresh_from_db()
    assert (case.state, case.lease_token, case.answer) == (EvalCaseState.RUNNING, "another job", "")


def test_no_case_starts_once_the_run_cost_its_limit(user):
    for n in range(3):
        stored_chat(user, f"hello {n}")
    eval_set = set_from_chats("s", Chat.objects.order_by("pk"))

    run = start_run(eval_set, "evalmodel:v2", max_cost="0.01")  # one case costs $0.015

    states = list(run.cases.order_by("position").values_list("state", flat=True))
    assert states == [EvalCaseState.PASSED, EvalCaseState.SKIPPED, EvalCaseState.SKIPPED]
    assert run.progress() == {
        "pending": 0, "running": 0, "passed": 1, "failed": 0, "error": 0, "skipped": 2,
        "total": 3,
    }  # fmt: skip


def test_a_case_whose_chat_is_gone_is_an_error(user):
    case = pending_case(user)
    Chat.objects.all().delete()

    run_case(case.pk)

    case.refresh_from_db()
    assert case.state == EvalCaseState.ERROR
    assert "The case can't be replayed: chat" in case.error


def test_a_run_of_a_set_whose_chat_was_deleted_makes_its_case_an_error(user):
    chat = stored_chat(user, "hello")
    eval_set = set_from_chats("s", Chat.objects.all())
    Chat.objects.all().delete()

    run = start_run(eval_set, "evalmodel:v2")

    case = run.cases.get()
    assert (case.source_chat_id, case.input, case.reference) == (chat.pk, "hello", "answer: hello")
    assert case.state == EvalCaseState.ERROR


# -- reports ----------------------------------------------------------------------------------
def hand_made_run(
    eval_set: EvalSet, name: str, cases: list[tuple[str, float, str, int]]
) -> EvalRun:
    run = EvalRun.objects.create(eval_set=eval_set, name=name, model="x:y")
    EvalCase.objects.bulk_create(
        EvalCase(
            run=run, position=n, state=state, score=score, cost=Decimal(cost), latency_ms=latency
        )  # fmt: skip
        for n, (state, score, cost, latency) in enumerate(cases)
    )
    return run


def test_compare_is_right_on_a_hand_made_pair_of_runs():
    eval_set = EvalSet.objects.create(name="pair", items=[{}] * 4)
    a = hand_made_run(eval_set, "a", [
        ("passed", 1.0, "0.01", 100), ("passed", 1.0, "0.01", 200),
        ("failed", 0.5, "0.01", 300), ("failed", 0.0, "0.01", 400),
    ])  # fmt: skip
    b = hand_made_run(eval_set, "b", [
        ("passed", 1.0, "0.02", 50), ("failed", 0.5, "0.02", 60),
        ("passed", 1.0, "0.02", 70), ("passed", 1.0, "0.02", 1000),
    ])  # fmt: skip

    comparison = compare(a, b)

    assert (comparison.a.pass_rate, comparison.b.pass_rate) == (0.5, 0.75)
    assert (comparison.a.mean_score, comparison.b.mean_score) == (0.625, 0.875)
    assert (comparison.a.cost, comparison.b.cost) == (Decimal("0.04"), Decimal("0.08"))
    assert (comparison.a.p50_ms, comparison.a.p95_ms) == (200, 400)
    assert (comparison.b.p50_ms, comparison.b.p95_ms) == (60, 1000)
    assert comparison.changed == [(1, "passed", "failed"), (2, "failed", "passed"),
                                  (3, "failed", "passed")]  # fmt: skip
    assert comparison.table("a", "b").splitlines() == [
        "                               a        b",
        "cases                          4        4",
        "pass rate                  50.0%    75.0%",
        "mean score                 0.625    0.875",
        "cost                     $0.0400  $0.0800",
        "p50 latency               200 ms    60 ms",
        "p95 latency               400 ms  1000 ms",
        "errors                         0        0",
        "calls with no recording        0        0",
        "",
        "cases that changed: 3 (2 now pass, 1 no longer pass)",
        "  case 1: passed -> failed",
        "  case 2: failed -> passed",
        "  case 3: failed -> passed",
    ]


def test_percentiles_are_nearest_rank():
    assert percentile([], 0.5) is None
    assert percentile([5], 0.95) == 5
    assert percentile(list(range(1, 101)), 0.5) == 50
    assert percentile(list(range(1, 101)), 0.95) == 95


def test_summarize_leaves_out_skipped_cases():
    eval_set = EvalSet.objects.create(name="s", items=[{}] * 2)
    run = hand_made_run(eval_set, "r", [("passed", 1.0, "0.01", 10), ("skipped", None, "0", 0)])

    summary = summarize(run)

    assert (summary.total, summary.finished, summary.pass_rate) == (2, 1, 1.0)


# -- the command ------------------------------------------------------------------------------
def agentloop_command(*args: str) -> tuple[int, str, str]:
    """``manage.py agentloop ARGS``: the exit status the shell sees (a CommandError's
    ``returncode``), the output and the error line."""
    out = io.StringIO()
    try:
        call_command("agentloop", *args, stdout=out)
    except CommandError as exc:
        return exc.returncode, out.getvalue(), str(exc)
    return 0, out.getvalue(), ""


def two_chat_set(user: Any) -> EvalSet:
    stored_chat(user, "Where is order 7?")
    stored_chat(user, "hello")
    status, out, _ = agentloop_command("eval", "set", "support", "--latest", "2")
    assert (status, out) == (0, "Eval set 'support' (pk 1): 2 cases.\n".replace(
        "pk 1", f"pk {EvalSet.objects.get().pk}"))  # fmt: skip
    return EvalSet.objects.get()


def test_eval_run_exits_zero_at_or_over_the_threshold(user):
    two_chat_set(user)
    contains = '{"kind": "contains", "value": "shipped"}'

    ok = agentloop_command("eval", "run", "support", "--model", "evalmodel:v2", "--fail-under", "1")
    half = agentloop_command(
        "eval", "run", "support", "--model", "evalmodel:v2", "--scorer", contains,
        "--fail-under", "0.5",
    )  # fmt: skip

    assert ok[0] == 0
    assert "Pass rate 100.0% (2/2)" in ok[1]
    assert half[0] == 0
    assert "Pass rate 50.0% (1/2)" in half[1]


def test_eval_run_exits_one_under_the_threshold(user):
    two_chat_set(user)
    contains = '{"kind": "contains", "value": "shipped"}'

    status, out, err = agentloop_command(
        "eval", "run", "support", "--model", "evalmodel:v2", "--scorer", contains,
        "--fail-under", "0.9",
    )  # fmt: skip

    assert status == 1
    run = EvalRun.objects.get()
    assert f"Eval run {run.pk} failed: pass rate 50.0% is under 90.0%." in err
    assert "contains: missing ['shipped']" in out


def test_eval_run_with_a_judge(user):
    two_chat_set(user)
    providers.register(
        "judge", FunctionProvider(lambda r: reply('{"score": 1, "reasoning": "ok"}'))
    )
    try:
        status, out, _ = agentloop_command(
            "eval", "run", "support", "--model", "evalmodel:v2", "--judge", "judge:x",
            "--rubric", "Polite.", "--scorer", '{"kind": "regex", "pattern": "."}',
        )  # fmt: skip
    finally:
        providers.unregister("judge")

    assert status == 0
    run = EvalRun.objects.get()
    assert run.scorers == [
        {"kind": "regex", "pattern": "."},
        {"kind": "judge", "model": "judge:x", "rubric": "Polite."},
    ]
    assert [s["reason"] for s in run.cases.first().scores] == ["matches '.'", "ok"]


def test_eval_compare_prints_the_table(user):
    two_chat_set(user)
    agentloop_command("eval", "run", "support", "--model", "evalmodel:v2", "--name", "old")
    agentloop_command(
        "eval", "run", "support", "--model", "evalmodel:v2", "--name", "new",
        "--instructions", "Be new.",
    )  # fmt: skip
    old, new = EvalRun.objects.order_by("pk")

    status, out, _ = agentloop_command("eval", "compare", str(old.pk), str(new.pk))

    assert status == 0
    assert out.splitlines()[:3] == [
        "                             old      new",
        "cases                          2        2",
        "pass rate                 100.0%   100.0%",
    ]
    assert "cases that changed: 0" in out


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["eval", "run", "nope", "--model", "x:y"], "No eval set named 'nope'."),
        (["eval", "run", "support", "--model", "x:y", "--scorer", "{"], "is not JSON"),
        (["eval", "run", "support", "--model", "x:y", "--scorer", '{"kind": "f"}'],
         "scorer 1 must be a dict whose 'kind' is one of"),
        (["eval", "run", "support", "--model", "x:y", "--fail-under", "2"],
         "fail_under is a pass rate from 0 to 1, not 2.0"),
        (["eval", "run", "support", "--model", "x:y", "--max-cost", "lots"],
         "--max-cost must be a number of dollars"),
        (["eval", "compare", "98", "99"], "No eval run with the primary key 98."),
        (["eval", "set", "support", "--latest", "1"], "An eval set named 'support' exists"),
        (["eval", "set", "other", "--jsonl", "/nonexistent.jsonl"], "Can't read /nonexistent"),
        (["eval", "set", "other", "--chat", "9999"], "No chat with the primary key 9999."),
    ],
)  # fmt: skip
def test_eval_command_errors_are_one_line(user, args, error):
    two_chat_set(user)

    status, _, err = agentloop_command(*args)

    assert status == 1
    assert error in err
    assert len(err.strip().splitlines()) == 1
    assert EvalRun.objects.count() == 0


# -- the admin --------------------------------------------------------------------------------
def test_the_chat_lists_action_makes_an_eval_set(user, admin_client):
    chats = [stored_chat(user, "Where is order 7?"), stored_chat(user, "hello")]

    response = admin_client.post(
        "/admin/agentloop/chat/",
        {"action": "make_eval_set", "_selected_action": [c.pk for c in chats]},
        follow=True,
    )

    eval_set = EvalSet.objects.get()
    assert [item["chat"] for item in eval_set.items] == [c.pk for c in chats]
    assert f"/admin/agentloop/evalset/{eval_set.pk}/change/" in response.content.decode()


def test_the_action_needs_the_permission_to_add_eval_sets(user, viewer):
    chat = stored_chat(user, "hello")

    response = viewer.post(
        "/admin/agentloop/chat/",
        {"action": "make_eval_set", "_selected_action": [chat.pk]},
        follow=True,
    )

    assert "You may not add eval sets: nothing was made." in response.content.decode()
    assert not EvalSet.objects.exists()


def test_a_runs_page_shows_each_case_beside_its_baseline_with_a_diff(user, admin_client):
    stored_chat(user, "hello <b>there</b>")
    eval_set = set_from_chats("s", Chat.objects.all())
    baseline = start_run(eval_set, "evalmodel:v2", name="before")
    providers.register("other", FunctionProvider(lambda r: reply("answer: hello <i>you</i>")))
    try:
        run = start_run(eval_set, "other:x", baseline=baseline, name="after")
    finally:
        providers.unregister("other")

    listed = admin_client.get("/admin/agentloop/evalrun/").content.decode()
    page = admin_client.get(f"/admin/agentloop/evalrun/{run.pk}/change/").content.decode()

    assert "1/1 (0 passed, 1 failed, 0 errors, 0 running)" in listed
    assert "1/1 (1 passed, 0 failed" in listed
    assert "<del>&lt;b&gt;there&lt;/b&gt;</del> <ins>&lt;i&gt;you&lt;/i&gt;</ins>" in page
    assert "<b>there</b>" not in page and "<i>you</i>" not in page  # model text is escaped
    assert "baseline run" in page
    assert page.count('class="agentloop-chart"') == 2  # cost and latency, this run and before
    assert "after p95" in page and "before p50" in page
    assert (
        admin_client.get(f"/admin/agentloop/evalcase/{run.cases.get().pk}/change/").status_code
        == 200
    )
    assert admin_client.get(f"/admin/agentloop/evalset/{eval_set.pk}/change/").status_code == 200


def test_the_runs_page_compares_with_a_baseline_run_as_the_command_does(admin_client):
    eval_set = EvalSet.objects.create(name="pair", items=[{}] * 4)
    a = hand_made_run(eval_set, "a", [
        ("passed", 1.0, "0.01", 100), ("passed", 1.0, "0.01", 200),
        ("failed", 0.5, "0.01", 300), ("failed", 0.0, "0.01", 400),
    ])  # fmt: skip
    b = hand_made_run(eval_set, "b", [
        ("passed", 1.0, "0.02", 50), ("failed", 0.5, "0.02", 60),
        ("passed", 1.0, "0.02", 70), ("passed", 1.0, "0.02", 1000),
    ])  # fmt: skip
    b.baseline = a
    b.save(update_fields=["baseline"])
    a.cases.filter(position=1).update(
        answer="Order <7>", scores=[{"name": "exact", "passed": True, "reason": "same <b>"}]
    )
    b.cases.filter(position=1).update(
        answer="Order 8", scores=[{"name": "exact", "passed": False, "reason": "expected 7"}]
    )

    page = admin_client.get(f"/admin/agentloop/evalrun/{b.pk}/change/").content.decode()

    # the figures of `eval compare`, baseline first
    for what, before, after in compare(a, b).rows():
        assert f"<tr><th>{what}</th><td>{before}</td><td>{after}</td></tr>" in page
    assert "<th>p50 latency</th><td>200 ms</td><td>60 ms</td>" in page
    assert "<th>p95 latency</th><td>400 ms</td><td>1000 ms</td>" in page
    assert "Cases that changed: 3 (2 now pass, 1 no longer pass)." in page
    # each case: the baseline's answer and outcome (scores and reasons) beside this run's
    assert page.count('class="agentloop-eval-changed"') == 3
    assert "<del>&lt;7&gt;</del> <ins>8</ins>" in page
    assert "<li>exact: pass — same &lt;b&gt;</li>" in page
    assert "<li>exact: fail — expected 7</li>" in page
    assert page.count('class="agentloop-chart"') == 2  # cost, and p50/p95 latency of both
    assert "a p95" in page and "b p50" in page


def test_a_batched_runs_progress_names_its_open_batches(admin_client):
    eval_set = EvalSet.objects.create(name="s", items=[{}])
    run = EvalRun.objects.create(eval_set=eval_set, model="anthropic:x", batched=True)
    batch = Batch.objects.create(provider="anthropic", eval_run=run, status="in_progress")
    EvalCase.objects.create(run=run, position=0, state="running", batch=batch)

    listed = admin_client.get("/admin/agentloop/evalrun/").content.decode()

    assert f"0/1 (0 passed, 0 failed, 0 errors, 1 running); through batches, open: #{batch.pk}" in (
        listed
    )


def test_a_candidate_that_keeps_calling_tools_is_stopped_as_an_error(user):
    stored_chat(user, "Where is order 7?")
    forever = FunctionProvider(lambda request: tool_call("lookup_order", {"order": "7"}))
    providers.register("forever", forever)
    try:
        run = start_run(
            set_from_chats("s", Chat.objects.all()), "forever:x",
            settings={"limits": {"max_model_calls": 3}},
        )  # fmt: skip
    finally:
        providers.unregister("forever")

    case = run.cases.get()
    assert case.state == EvalCaseState.ERROR
    assert case.error == "max_model_calls reached (3 of 3)"
    assert len(case.tool_calls) == 3

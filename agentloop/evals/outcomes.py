"""What the two ways of running a case share: a run's candidate, a case's row values once
its replay is over and scored (the job path, ``running``, and the batch path,
``batch_rounds``, both write these), and the evals' own budget subject.

Evals spend against one budget subject of their own, :data:`EVAL_SUBJECT` (never an
owner's): with ``AGENTLOOP["BUDGETS"]`` set, each case's cost and tokens are charged to it
as the case's row is written, and no case starts while one of its limits is reached (its
``Budget`` row's limits, else the settings' defaults; docs/budgets.md).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from ..budgets import counters
from ..budgets.limits import budgets_on, reached, units
from ..budgets.spend import spend_of
from ..budgets.subjects import Subject
from ..models import EvalCase, EvalCaseState, EvalRun
from .replay import Attempt, Candidate
from .scorers import Outcome, score_outcome

__all__ = [
    "EVAL_SUBJECT",
    "candidate_of",
    "case_values",
    "charge_evals",
    "charge_written",
    "evals_budget_reached",
]

#: the budget subject of every eval's spend (a ``Budget`` row with this subject sets its limits).
EVAL_SUBJECT = Subject("agentloop:evals", "evals")


def charge_evals(cost: Decimal | None, tokens: int, using: str = "default") -> None:
    """Charge ``cost`` and ``tokens`` of eval cases to :data:`EVAL_SUBJECT` (when budgets
    count spend); in the transaction that writes the cases."""
    if budgets_on() and (cost or tokens):
        counters.charge([EVAL_SUBJECT], units(cost), tokens, None, using)


def evals_budget_reached(using: str = "default") -> str:
    """Why no eval case may start now ("budget: $5.00/day reached for evals"), or ""."""
    if not budgets_on():
        return ""
    spend = spend_of(EVAL_SUBJECT, using)
    for limit in spend.reached():
        if limit != "chats_in_flight":  # a replay is no chat
            return reached(limit, spend.limits.value(limit), EVAL_SUBJECT.label)
    return ""


def charge_written(case: EvalCase, values: dict[str, Any]) -> None:
    """Charge what writing ``values`` over ``case`` adds to its cost and tokens."""
    cost = values.get("cost", case.cost)
    added = (cost or Decimal(0)) - (case.cost or Decimal(0))
    tokens = values.get("input_tokens", case.input_tokens) + values.get(
        "output_tokens", case.output_tokens
    )
    charge_evals(added, tokens - case.input_tokens - case.output_tokens)


def candidate_of(run: EvalRun) -> Candidate:
    """The candidate ``run`` replays its cases with."""
    return Candidate(
        model=run.model, provider=run.provider or None, instructions=run.instructions,
        tools=list(run.tools), agent_path=run.agent_path, settings=dict(run.settings),
        live_tools=list(run.live_tools),
    )  # fmt: skip


def case_values(case: EvalCase, run: EvalRun, attempt: Attempt) -> dict[str, Any]:
    """The case's row values for ``attempt``, scored by the run's scorers (an attempt with
    an error is not scored: the case is an error). A judge's cost is added to the case's."""
    outcome = Outcome(
        input=case.input, reference=case.reference, answer=attempt.answer,
        expected=case.item.get("expected"), tool_calls=attempt.tool_calls, cost=attempt.cost,
        latency_ms=attempt.latency_ms, error=attempt.error,
    )  # fmt: skip
    scores = [] if attempt.error else score_outcome(run.scorers, outcome)
    extra = [s.cost for s in scores if s.cost is not None]
    cost = attempt.cost
    if extra:
        cost = (cost or Decimal(0)) + sum(extra, Decimal(0))
    mean = sum(s.score for s in scores) / len(scores) if scores else None
    if attempt.error:
        state, mean = EvalCaseState.ERROR, 0.0
    else:
        state = EvalCaseState.PASSED if all(s.passed for s in scores) else EvalCaseState.FAILED
    return {
        "state": state, "answer": attempt.answer, "tool_calls": attempt.tool_calls,
        "unmatched_calls": attempt.unmatched_calls, "scores": [s.as_dict() for s in scores],
        "score": mean, "cost": cost, "input_tokens": attempt.input_tokens,
        "output_tokens": attempt.output_tokens, "latency_ms": attempt.latency_ms,
        "error": attempt.error,
    }  # fmt: skip

"""What the two ways of running a case share: a run's candidate, and a case's row values
once its replay is over and scored (the job path, ``running``, and the batch path,
``batch_rounds``, both write these)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from ..models import EvalCase, EvalCaseState, EvalRun
from .replay import Attempt, Candidate
from .scorers import Outcome, score_outcome

__all__ = ["candidate_of", "case_values"]


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

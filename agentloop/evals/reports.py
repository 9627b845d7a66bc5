"""What a run came to (pass rate, mean score, cost, latency percentiles) and how two runs of
one set differ, case by case: what ``manage.py agentloop eval`` prints."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from ..models import EvalCaseState, EvalRun

__all__ = ["Comparison", "Summary", "compare", "percentile", "summarize"]


def percentile(values: list[int], fraction: float) -> int | None:
    """The nearest-rank percentile of ``values`` (None for none): p50 is ``fraction=0.5``."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


@dataclass
class Summary:
    """A run's figures over its finished cases (skipped ones left out)."""

    total: int
    finished: int
    passed: int
    errors: int
    mean_score: float | None
    cost: Decimal
    p50_ms: int | None
    p95_ms: int | None
    unmatched_calls: int
    #: each scored case's outcome by position: (state, score).
    cases: dict[int, tuple[str, float | None]] = field(default_factory=dict)

    @property
    def pass_rate(self) -> float:
        """Passed cases over finished ones that ran (0 when none did)."""
        return self.passed / self.finished if self.finished else 0.0


def summarize(run: EvalRun) -> Summary:
    """``run``'s figures (one query)."""
    rows = list(
        run.cases.values_list("position", "state", "score", "cost", "latency_ms", "unmatched_calls")
    )
    ran = [
        row
        for row in rows
        if row[1] in (EvalCaseState.PASSED, EvalCaseState.FAILED, EvalCaseState.ERROR)
    ]
    scores = [row[2] for row in ran if row[2] is not None]
    latencies = [row[4] for row in ran if row[4] is not None]
    return Summary(
        total=len(rows),
        finished=len(ran),
        passed=sum(1 for row in ran if row[1] == EvalCaseState.PASSED),
        errors=sum(1 for row in ran if row[1] == EvalCaseState.ERROR),
        mean_score=sum(scores) / len(scores) if scores else None,
        cost=sum((row[3] for row in ran if row[3] is not None), Decimal(0)),
        p50_ms=percentile(latencies, 0.5),
        p95_ms=percentile(latencies, 0.95),
        unmatched_calls=sum(row[5] for row in ran),
        cases={row[0]: (row[1], row[2]) for row in ran},
    )


@dataclass
class Comparison:
    """Two runs' figures side by side and the cases whose outcome changed (by position:
    ``(position, state in a, state in b)``)."""

    a: Summary
    b: Summary
    changed: list[tuple[int, str, str]]

    def rows(self) -> list[tuple[str, str, str]]:
        """The figures side by side, as text: (what, run a's, run b's), one per row of the
        table (the admin shows the same rows)."""

        def money(value: Decimal) -> str:
            return f"${value:.4f}"

        def number(value: Any, unit: str = "") -> str:
            return "-" if value is None else f"{value}{unit}"

        def score(value: float | None) -> str:
            return "-" if value is None else f"{value:.3f}"

        rows = [
            ("cases", str(self.a.finished), str(self.b.finished)),
            ("pass rate", f"{self.a.pass_rate:.1%}", f"{self.b.pass_rate:.1%}"),
            ("mean score", score(self.a.mean_score), score(self.b.mean_score)),
            ("cost", money(self.a.cost), money(self.b.cost)),
            ("p50 latency", number(self.a.p50_ms, " ms"), number(self.b.p50_ms, " ms")),
            ("p95 latency", number(self.a.p95_ms, " ms"), number(self.b.p95_ms, " ms")),
            ("errors", str(self.a.errors), str(self.b.errors)),
            ("calls with no recording", str(self.a.unmatched_calls), str(self.b.unmatched_calls)),
        ]
        return rows

    def table(self, name_a: str, name_b: str) -> str:
        """The comparison as a plain-text table (what ``eval compare`` prints)."""
        rows = self.rows()
        widths = [max(len(row[i]) for row in [("", name_a, name_b), *rows]) for i in range(3)]
        lines = [f"{'':<{widths[0]}}  {name_a:>{widths[1]}}  {name_b:>{widths[2]}}"]
        lines += [f"{r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:>{widths[2]}}" for r in rows]
        better = sum(1 for _, old, new in self.changed if new == EvalCaseState.PASSED)
        lines.append("")
        lines.append(
            f"cases that changed: {len(self.changed)} ({better} now pass, "
            f"{len(self.changed) - better} no longer pass)"
        )
        lines += [f"  case {position}: {old} -> {new}" for position, old, new in self.changed]
        return "\n".join(lines)


def compare(run_a: EvalRun, run_b: EvalRun) -> Comparison:
    """``run_b`` against ``run_a`` (cases matched by their position in the set)."""
    a, b = summarize(run_a), summarize(run_b)
    changed = [
        (position, a.cases[position][0], b.cases[position][0])
        for position in sorted(set(a.cases) & set(b.cases))
        if (a.cases[position][0] == EvalCaseState.PASSED)
        != (b.cases[position][0] == EvalCaseState.PASSED)
    ]
    return Comparison(a, b, changed)

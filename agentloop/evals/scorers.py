"""Scorers: each looks at one case's answer and gives a score from 0 to 1, whether it
passes, and why. A case passes when every scorer of its run passes (and the replay had no
error).

A run names its scorers as dicts (stored on the row, so any worker can score), each with a
``kind`` and the kind's keys, and optionally a ``name`` to show:

=============== ===========================================================================
``exact``       the answer equals ``value`` (default: the item's expected answer, else the
                recorded one), after stripping surrounding spaces; ``ignore_case``
``contains``    the answer contains ``value`` (a string, or a list: all of them)
``regex``       ``pattern`` is found in the answer
``json_schema`` the answer is JSON valid against ``schema``
``function``    ``path`` names ``function(outcome) -> bool | float | (score, reason)``;
                a float passes at ``threshold`` (default 1.0)
``tool_call``   a call of ``tool`` was made (``called: false``: none was) whose arguments
                include ``arguments`` (each key equal)
``judge``       ``model`` reads the ``rubric``, the input, the recorded answer and the answer
                and gives a score from 0 to 1 with its reasoning; passes at ``threshold``
                (default 0.5); its cost counts to the case's
``max_cost``    the case cost at most ``dollars``
``max_latency`` the candidate answered within ``ms`` milliseconds
=============== ===========================================================================
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from ..exceptions import AgentloopError, ConfigurationError
from ..import_paths import load_by_path
from ..in_memory import chat

__all__ = ["KINDS", "JUDGE_INSTRUCTIONS", "Outcome", "Score", "check_scorers", "score_outcome"]


@dataclass
class Outcome:
    """What a scorer sees of one case."""

    input: str
    reference: str
    answer: str
    #: the item's expected answer, when its set gave one (else scorers use ``reference``).
    expected: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    cost: Decimal | None = None
    latency_ms: int | None = None
    error: str = ""


@dataclass
class Score:
    """One scorer's verdict on one case."""

    name: str
    score: float
    passed: bool
    reason: str = ""
    #: what scoring cost (a judge's model calls), added to the case's cost.
    cost: Decimal | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "score": self.score,
            "passed": self.passed,
            "reason": self.reason,
        }


#: the keys each kind takes (besides ``kind`` and ``name``), required ones first.
KINDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "exact": ((), ("value", "ignore_case")),
    "contains": (("value",), ("ignore_case",)),
    "regex": (("pattern",), ()),
    "json_schema": (("schema",), ()),
    "function": (("path",), ("threshold",)),
    "tool_call": (("tool",), ("arguments", "called")),
    "judge": (("model",), ("rubric", "threshold", "provider")),
    "max_cost": (("dollars",), ()),
    "max_latency": (("ms",), ()),
}

#: the judge's instructions; the rubric follows them.
JUDGE_INSTRUCTIONS = (
    "You grade an assistant's answer. Read the rubric, the user's message, the answer "
    "recorded before (a reference, not always right) and the answer to grade. Reply with one "
    'JSON object and nothing else: {"reasoning": "<why, briefly>", "score": <a number from '
    "0 (fails the rubric) to 1 (fully meets it)>}."
)
DEFAULT_RUBRIC = "The answer is correct, and as helpful as the reference answer."


def check_scorers(specs: Any) -> list[dict[str, Any]]:
    """``specs`` as a list of scorer dicts, or a one-line ConfigurationError naming what is
    wrong (before any case runs)."""
    if not isinstance(specs, list):
        raise ConfigurationError("An eval run's scorers are a list of dicts, each with a 'kind'")
    for n, spec in enumerate(specs):
        where = f"scorer {n + 1}"
        if not isinstance(spec, dict) or spec.get("kind") not in KINDS:
            raise ConfigurationError(
                f"{where} must be a dict whose 'kind' is one of {', '.join(KINDS)}: {spec!r}"
            )
        required, optional = KINDS[spec["kind"]]
        missing = [key for key in required if key not in spec]
        unknown = set(spec) - {"kind", "name", *required, *optional}
        if missing:
            raise ConfigurationError(f"{where} ({spec['kind']}) needs {', '.join(missing)}")
        if unknown:
            raise ConfigurationError(
                f"{where} ({spec['kind']}) has unknown keys {sorted(unknown)} "
                f"(known: {', '.join((*required, *optional)) or 'none'})"
            )
        if spec["kind"] == "regex":
            try:
                re.compile(spec["pattern"])
            except (re.error, TypeError) as exc:
                raise ConfigurationError(f"{where}: 'pattern' is not a regex: {exc}") from exc
        if spec["kind"] == "max_cost":
            _dollars(spec["dollars"], where)
        if spec["kind"] == "function":
            function = load_by_path(spec["path"])
            if not callable(function):
                raise ConfigurationError(f"{where}: {spec['path']!r} is not callable")
    return specs


def _dollars(value: Any, where: str) -> Decimal:
    try:
        dollars = Decimal(str(value))
    except InvalidOperation as exc:
        raise ConfigurationError(f"{where}: 'dollars' must be a number") from exc
    if not dollars.is_finite() or dollars < 0:
        raise ConfigurationError(f"{where}: 'dollars' must be a number >= 0")
    return dollars


def _text(value: str, spec: dict[str, Any]) -> str:
    return value.strip().casefold() if spec.get("ignore_case") else value.strip()


def _exact(spec: dict[str, Any], outcome: Outcome) -> tuple[float, str]:
    wanted = spec.get("value")
    if wanted is None:
        wanted = outcome.expected if outcome.expected is not None else outcome.reference
    if _text(outcome.answer, spec) == _text(str(wanted), spec):
        return 1.0, "the answer is the expected one"
    return 0.0, f"expected {str(wanted)[:200]!r}"


def _contains(spec: dict[str, Any], outcome: Outcome) -> tuple[float, str]:
    values = spec["value"] if isinstance(spec["value"], list) else [spec["value"]]
    answer = _text(outcome.answer, spec)
    missing = [str(v) for v in values if _text(str(v), spec) not in answer]
    score = 1.0 - len(missing) / len(values) if values else 1.0
    return score, (f"missing {missing!r}" if missing else "contains every value")


def _regex(spec: dict[str, Any], outcome: Outcome) -> tuple[float, str]:
    if re.search(spec["pattern"], outcome.answer):
        return 1.0, f"matches {spec['pattern']!r}"
    return 0.0, f"no match for {spec['pattern']!r}"


def _json_schema(spec: dict[str, Any], outcome: Outcome) -> tuple[float, str]:
    try:
        # Function-local: jsonschema comes with the mcp extra (it has no type stubs); only
        # this scorer needs it.
        import jsonschema  # type: ignore[import-untyped]
    except ImportError as exc:  # pragma: no cover - a dev dependency
        raise ConfigurationError(
            "The json_schema scorer needs jsonschema: pip install jsonschema "
            "(or install agentloop[mcp])"
        ) from exc
    try:
        value = json.loads(outcome.answer)
    except ValueError as exc:
        return 0.0, f"not JSON: {exc}"
    error = jsonschema.exceptions.best_match(
        jsonschema.Draft202012Validator(spec["schema"]).iter_errors(value)
    )
    if error is not None:
        return 0.0, f"not valid: {error.message}"
    return 1.0, "valid against the schema"


def _function(spec: dict[str, Any], outcome: Outcome) -> tuple[float, str, float]:
    verdict = load_by_path(spec["path"])(outcome)
    reason = ""
    if isinstance(verdict, tuple):
        verdict, reason = verdict
    if isinstance(verdict, bool):
        return float(verdict), reason or str(verdict), 1.0
    return float(verdict), reason, float(spec.get("threshold", 1.0))


def _tool_call(spec: dict[str, Any], outcome: Outcome) -> tuple[float, str]:
    wanted = spec.get("arguments") or {}
    calls = [c for c in outcome.tool_calls if c.get("name") == spec["tool"]]
    matching = [
        c for c in calls if all(c.get("arguments", {}).get(k) == v for k, v in wanted.items())
    ]
    if spec.get("called", True):
        if matching:
            return 1.0, f"called {spec['tool']}" + (f" with {wanted}" if wanted else "")
        if calls:
            return 0.0, f"called {spec['tool']}, not with {wanted}: {calls[0].get('arguments')}"
        return 0.0, f"never called {spec['tool']}"
    if matching:
        return 0.0, f"called {spec['tool']}, which it should not"
    return 1.0, f"did not call {spec['tool']}"


def _judge(spec: dict[str, Any], outcome: Outcome) -> Score:
    judge = chat(spec["model"], provider=spec.get("provider"))
    judge.with_instructions(
        JUDGE_INSTRUCTIONS + "\n\nRubric: " + (spec.get("rubric") or DEFAULT_RUBRIC)
    )
    prompt = (
        f"User's message:\n{outcome.input}\n\nRecorded answer (reference):\n{outcome.reference}"
        f"\n\nAnswer to grade:\n{outcome.answer}"
    )
    name = spec.get("name") or f"judge ({spec['model']})"
    threshold = float(spec.get("threshold", 0.5))
    try:
        text = judge.ask(prompt).content
    except AgentloopError as exc:
        return Score(name, 0.0, False, f"the judge failed: {exc}")
    store: Any = judge.store
    costs = [record.cost for _, record in store.usage if record.cost is not None]
    cost = sum(costs, Decimal(0)) if costs else None
    score, reasoning = _judged(text)
    if score is None:
        return Score(name, 0.0, False, f"the judge gave no score: {text[:500]}", cost)
    return Score(name, score, score >= threshold, reasoning, cost)


def _judged(text: str) -> tuple[float | None, str]:
    """The score (clamped to 0..1) and reasoning in a judge's reply; None when it gave none."""
    found = re.search(r"\{.*\}", text, re.DOTALL)
    if found:
        try:
            data = json.loads(found.group(0))
        except ValueError:
            data = None
        if isinstance(data, dict) and isinstance(data.get("score"), int | float):
            return min(max(float(data["score"]), 0.0), 1.0), str(data.get("reasoning", ""))
    plain = re.search(r"score\s*[:=]\s*([0-9]*\.?[0-9]+)", text, re.IGNORECASE)
    if plain:
        return min(max(float(plain.group(1)), 0.0), 1.0), text.strip()
    return None, text


def _max_cost(spec: dict[str, Any], outcome: Outcome) -> tuple[float, str]:
    ceiling = _dollars(spec["dollars"], "max_cost")
    if outcome.cost is None:
        return 1.0, "no cost recorded"
    if outcome.cost <= ceiling:
        return 1.0, f"cost ${outcome.cost} <= ${ceiling}"
    return 0.0, f"cost ${outcome.cost} > ${ceiling}"


def _max_latency(spec: dict[str, Any], outcome: Outcome) -> tuple[float, str]:
    ceiling = float(spec["ms"])
    took = outcome.latency_ms or 0
    if took <= ceiling:
        return 1.0, f"{took} ms <= {ceiling:g} ms"
    return 0.0, f"{took} ms > {ceiling:g} ms"


_PLAIN: dict[str, Callable[[dict[str, Any], Outcome], tuple[float, str]]] = {
    "exact": _exact, "contains": _contains, "regex": _regex, "json_schema": _json_schema,
    "tool_call": _tool_call, "max_cost": _max_cost, "max_latency": _max_latency,
}  # fmt: skip


def score_outcome(specs: list[dict[str, Any]], outcome: Outcome) -> list[Score]:
    """Every scorer's verdict on ``outcome``, in order (a scorer that raises fails, saying
    why; the others still score)."""
    scores = []
    for spec in specs:
        kind = spec["kind"]
        name = spec.get("name") or kind
        try:
            if kind == "judge":
                scores.append(_judge(spec, outcome))
            elif kind == "function":
                value, reason, threshold = _function(spec, outcome)
                scores.append(Score(name, value, value >= threshold, reason))
            else:
                value, reason = _PLAIN[kind](spec, outcome)
                scores.append(Score(name, value, value >= 1.0, reason))
        except Exception as exc:  # a project's function, a bad schema: this scorer fails
            scores.append(Score(name, 0.0, False, f"{type(exc).__name__}: {exc}"))
    return scores

"""System checks of budgets and rate limits: ``BUDGETS`` (agentloop.E012), ``BUDGET_SUBJECT``
(agentloop.E013) and ``RATE_LIMITS`` (agentloop.E014), one error per wrong entry."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, register
from pydantic import BaseModel, ValidationError

from ..conf import BudgetLimits, RateLimit
from ..importing import load_by_path

__all__ = ["check_budgets", "check_rate_limits"]

#: what each budget may hold (check agentloop.E012).
_BUDGET_RULES = {
    "cost_per_day": "an amount of US dollars of at least 0 (a Decimal, a string like "
    "'20.00' or a number)",
    "tokens_per_day": "a whole number of tokens of at least 0",
    "chats_in_flight": "a whole number of chats of at least 1",
}
_BUDGET_RULES["cost_per_month"] = _BUDGET_RULES["cost_per_day"]
_BUDGET_RULES["tokens_per_month"] = _BUDGET_RULES["tokens_per_day"]


def _entry_problems(
    model: type[BaseModel], value: Any, where: str, rules: dict[str, str]
) -> list[str]:
    """One line per wrong entry of ``value`` (a dict validated as ``model``)."""
    if not isinstance(value, dict):
        return [f"{where} must be a dict, not {value!r}."]
    problems = []
    for key in value:
        if key not in model.model_fields:
            problems.append(f"{where} has no {key!r}: choose from {', '.join(model.model_fields)}.")
        else:
            try:
                model.model_validate({key: value[key]})
            except ValidationError:
                problems.append(f"{where}[{key!r}] must be {rules[key]}, not {value[key]!r}.")
    return problems


@register(Tags.compatibility)
def check_budgets(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """BUDGETS must hold limits agentloop can enforce (agentloop.E012); BUDGET_SUBJECT must
    name a function (agentloop.E013)."""
    chosen = getattr(settings, "AGENTLOOP", None)
    if not isinstance(chosen, dict):
        return []
    errors: list[CheckMessage] = []
    budgets = chosen.get("BUDGETS")
    if budgets is not None:
        errors.extend(
            Error(
                problem,
                hint='See "Budgets and quotas" in the agentloop docs.',
                id="agentloop.E012",
            )  # fmt: skip
            for problem in _entry_problems(
                BudgetLimits, budgets, "AGENTLOOP['BUDGETS']", _BUDGET_RULES
            )
        )
    path = chosen.get("BUDGET_SUBJECT")
    if path is not None:
        problem = None
        if not isinstance(path, str) or not path:
            problem = f"must be the import path of a function, not {path!r}"
        else:
            try:
                hook = load_by_path(path)
            except Exception as exc:
                problem = f"= {path!r} can't be imported ({exc})"
            else:
                if not callable(hook):
                    problem = f"= {path!r} is not callable"
        if problem is not None:
            errors.append(
                Error(
                    f"AGENTLOOP['BUDGET_SUBJECT'] {problem}.",
                    hint="Name a function subject(chat) returning a model instance, a string, "
                    "an agentloop.budgets.Subject, a list of them, or None.",
                    id="agentloop.E013",
                )
            )
    return errors


_RATE_RULES = {
    "requests_per_minute": "a whole number of at least 1",
    "tokens_per_minute": "a whole number of at least 1",
}


@register(Tags.compatibility)
def check_rate_limits(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """RATE_LIMITS must map providers and models to paces (agentloop.E014)."""
    chosen = getattr(settings, "AGENTLOOP", None)
    if not isinstance(chosen, dict) or "RATE_LIMITS" not in chosen:
        return []
    limits = chosen["RATE_LIMITS"]
    hint = 'See "Rate limits" in the agentloop docs.'
    if not isinstance(limits, dict):
        return [Error(f"AGENTLOOP['RATE_LIMITS'] must be a dict, not {limits!r}.", hint=hint,
                      id="agentloop.E014")]  # fmt: skip
    problems = []
    for key, entry in limits.items():
        provider, colon, model = str(key).partition(":")
        if not isinstance(key, str) or not provider or (colon and not model) or key == "default":
            problems.append(
                f"AGENTLOOP['RATE_LIMITS'] key {key!r} is not a provider name or 'provider:model'."
            )
            continue
        problems.extend(
            _entry_problems(RateLimit, entry, f"AGENTLOOP['RATE_LIMITS'][{key!r}]", _RATE_RULES)
        )
    return [Error(problem, hint=hint, id="agentloop.E014") for problem in problems]

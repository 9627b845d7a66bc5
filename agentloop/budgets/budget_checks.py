"""System checks of budgets and rate limits: ``BUDGETS`` (agentloop.E012), ``BUDGET_SUBJECT``
(agentloop.E013) and ``RATE_LIMITS`` (agentloop.E014), one error per wrong entry; and a
warning per model with no known price while a cost budget is set (agentloop.W012)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.db import DatabaseError
from django.db.models import Q
from pydantic import BaseModel, ValidationError

from .. import providers
from ..conf import BudgetLimits, RateLimit, get_chat_model
from ..import_paths import load_by_path
from ..messages import TokenUsage
from .budget_models import budget_model

__all__ = ["check_budgets", "check_prices", "check_rate_limits", "unpriced"]

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


#: the models whose chats a database check looks at, at most.
_CHAT_MODELS = 200


def unpriced(model: str) -> str | None:
    """The "provider:model" key of ``model`` ("provider:model", or a model id a provider
    prefix names) when no price is known for it: neither ``AGENTLOOP["PRICES"]``, the
    catalog nor genai-prices has one; None when one is, or when its provider can't be made
    here (its own check says why)."""
    try:
        name, model_id = providers.split_model(model)
        provider = providers.get(name)
        cost = provider.cost(model_id, TokenUsage(input_tokens=1_000_000, output_tokens=1_000_000))
    except Exception:
        return None
    return f"{name}:{model_id}" if cost is None else None


def _configured_models(chosen: dict[str, Any]) -> dict[str, str]:
    """The models the settings name, each with where: ``DEFAULT_MODEL``, and the
    "provider:model" keys of ``RATE_LIMITS`` and ``MODEL_CONCURRENCY``."""
    found = {str(chosen.get("DEFAULT_MODEL") or "gpt-4.1-mini"): "DEFAULT_MODEL"}
    for setting in ("RATE_LIMITS", "MODEL_CONCURRENCY"):
        keys = chosen.get(setting)
        for key in keys if isinstance(keys, dict) else ():
            if isinstance(key, str) and ":" in key.strip(":"):
                found.setdefault(key, setting)
    return found


def _cost_budget(chosen: dict[str, Any]) -> bool:
    """``BUDGETS`` sets a cost limit every subject gets."""
    budgets = chosen.get("BUDGETS")
    return isinstance(budgets, dict) and any(
        budgets.get(limit) is not None for limit in ("cost_per_day", "cost_per_month")
    )


def _unpriced_warning(key: str, where: str) -> Warning:
    return Warning(
        f"A cost budget is set, but model {key!r} ({where}) has no known price: its calls "
        "cost $0 against every cost budget.",
        hint=f'Give its price in AGENTLOOP["PRICES"][{key!r}], install the "prices" extra '
        '(genai-prices), or hold it with a tokens budget: see "Prices" in Budgets and quotas.',
        obj=key,
        id="agentloop.W012",
    )


@register(Tags.compatibility)
def check_prices(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Warn when ``BUDGETS`` sets a cost limit and a model the settings name has no known
    price (agentloop.W012); with ``--database``, also for each model the chats use while a
    cost limit is set there or on a subject's ``Budget`` row."""
    chosen = getattr(settings, "AGENTLOOP", None)
    if not isinstance(chosen, dict):
        return []
    models: dict[str, str] = {}
    if _cost_budget(chosen):
        models.update(_configured_models(chosen))
    databases = kwargs.get("databases") or []
    if databases and "BUDGETS" in chosen:
        for using in databases:
            models.update(_chat_models(chosen, using))
    warnings: list[CheckMessage] = []
    for model, where in models.items():
        key = unpriced(model)
        if key is not None:
            warnings.append(_unpriced_warning(key, where))
    return warnings


def _chat_models(chosen: dict[str, Any], using: str) -> dict[str, str]:
    """The models the chats on ``using`` use, when a cost limit holds there (the settings'
    or a subject's own); none when the tables can't be read yet (before ``migrate``)."""
    try:
        rows = budget_model()._default_manager.using(using)
        own = rows.filter(Q(cost_per_day__isnull=False) | Q(cost_per_month__isnull=False))
        if not (_cost_budget(chosen) or own.exists()):
            return {}
        chats = get_chat_model()._default_manager.using(using).exclude(model="")
        used = chats.order_by().values_list("model", flat=True).distinct()[:_CHAT_MODELS]
        return {str(model): "used by chats" for model in used}
    except DatabaseError:
        return {}

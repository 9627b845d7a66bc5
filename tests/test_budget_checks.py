"""System checks of budgets and rate limits (agentloop.E012 to E014): each fails on a bad
value, with one line per wrong entry, and passes on good ones; ``manage.py check`` fails."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import override_settings

from agentloop.budgets.budget_checks import check_budgets, check_rate_limits
from agentloop.checks import check_settings
from tests.processes import process_env

ROOT = Path(__file__).resolve().parent.parent


def run(**agentloop):
    with override_settings(AGENTLOOP=agentloop):
        return check_settings() + check_budgets() + check_rate_limits()


def messages(errors):
    return [(error.id, error.msg) for error in errors]


# -- E012: BUDGETS ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("budgets", "problem"),
    [
        ({"cost_per_day": "twenty"}, "['cost_per_day'] must be an amount of US dollars of at "
         "least 0 (a Decimal, a string like '20.00' or a number), not 'twenty'."),
        ({"cost_per_month": -5}, "['cost_per_month'] must be an amount of US dollars"),
        ({"cost_per_day": float("inf")}, "['cost_per_day'] must be an amount"),
        ({"cost_per_day": True}, "['cost_per_day'] must be an amount"),
        ({"tokens_per_day": 1.5}, "['tokens_per_day'] must be a whole number of tokens of at "
         "least 0, not 1.5."),
        ({"tokens_per_month": -1}, "['tokens_per_month'] must be a whole number of tokens"),
        ({"chats_in_flight": 0}, "['chats_in_flight'] must be a whole number of chats of at "
         "least 1, not 0."),
        ({"cost_per_week": 3}, " has no 'cost_per_week': choose from cost_per_day, "
         "cost_per_month, tokens_per_day, tokens_per_month, chats_in_flight."),
    ],
)  # fmt: skip
def test_e011_a_budget_with_a_bad_value_fails(budgets, problem):
    errors = run(BUDGETS=budgets)

    assert len(errors) == 1
    assert errors[0].id == "agentloop.E012"
    assert errors[0].msg.startswith("AGENTLOOP['BUDGETS']")
    assert problem in errors[0].msg
    assert "Budgets and quotas" in errors[0].hint


def test_e011_each_bad_budget_is_its_own_error():
    errors = run(BUDGETS={"cost_per_day": "x", "tokens_per_day": -1, "chats_in_flight": 3})

    assert [error.id for error in errors] == ["agentloop.E012", "agentloop.E012"]


def test_e011_budgets_that_are_not_a_dict_fail():
    assert messages(run(BUDGETS=[20])) == [
        ("agentloop.E012", "AGENTLOOP['BUDGETS'] must be a dict, not [20].")
    ]


@pytest.mark.parametrize(
    "budgets",
    [None, {}, {"cost_per_day": "20.00", "cost_per_month": 300, "tokens_per_day": 2_000_000,
                "tokens_per_month": 0, "chats_in_flight": 3}, {"cost_per_day": 0.5}],
)  # fmt: skip
def test_e011_good_budgets_pass(budgets):
    assert run(BUDGETS=budgets) == []


# -- E013: BUDGET_SUBJECT ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("tests.budget_helpers.no_such_hook", "can't be imported"),
        ("tests.budget_helpers.PRICE_PER_TOKEN", "is not callable"),
        (42, "must be the import path of a function, not 42"),
    ],
)
def test_e012_a_subject_hook_that_cannot_be_called_fails(path, problem):
    errors = run(BUDGET_SUBJECT=path)

    assert [error.id for error in errors] == ["agentloop.E013"]
    assert problem in errors[0].msg
    assert errors[0].hint


def test_e012_a_subject_hook_passes():
    assert run(BUDGET_SUBJECT="tests.budget_helpers.owner_and_team") == []


# -- E014: RATE_LIMITS ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("limits", "problem"),
    [
        ({"openai": {"requests_per_minute": 0}}, "AGENTLOOP['RATE_LIMITS']['openai']"
         "['requests_per_minute'] must be a whole number of at least 1, not 0."),
        ({"openai": {"tokens_per_minute": "lots"}}, "['tokens_per_minute'] must be a whole"),
        ({"openai": {"requests_per_second": 5}}, "AGENTLOOP['RATE_LIMITS']['openai'] has no "
         "'requests_per_second': choose from requests_per_minute, tokens_per_minute."),
        ({"openai": 500}, "AGENTLOOP['RATE_LIMITS']['openai'] must be a dict, not 500."),
        ({"default": {"requests_per_minute": 5}}, "key 'default' is not a provider name"),
        ({"openai:": {"requests_per_minute": 5}}, "key 'openai:' is not a provider name"),
        ("500/min", "AGENTLOOP['RATE_LIMITS'] must be a dict, not '500/min'."),
    ],
)  # fmt: skip
def test_e013_a_rate_limit_with_a_bad_value_fails(limits, problem):
    errors = run(RATE_LIMITS=limits)

    assert [error.id for error in errors] == ["agentloop.E014"]
    assert problem in errors[0].msg
    assert "Rate limits" in errors[0].hint


def test_e013_rate_limits_pass():
    limits = {"openai": {"requests_per_minute": 500, "tokens_per_minute": 200_000},
              "anthropic:claude-opus-4": {"requests_per_minute": 50}}  # fmt: skip
    assert run(RATE_LIMITS=limits) == []


def test_manage_py_check_fails_on_a_bad_budget():
    settings = json.dumps({"BUDGETS": {"cost_per_day": "twenty"}})
    result = subprocess.run(  # noqa: S603 - our own interpreter and manage.py
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=process_env(AGENTLOOP_TEST_SETTINGS=settings),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert result.returncode != 0
    assert "agentloop.E012" in result.stderr
    assert "AGENTLOOP['BUDGETS']['cost_per_day'] must be an amount of US dollars" in result.stderr

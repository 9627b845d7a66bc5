"""System checks on the AGENTLOOP setting: each id fails on a bad value and passes on good ones."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.core.checks import Error, run_checks
from django.test import override_settings

from agentloop.checks import check_settings
from agentloop.conf import DEFAULTS


def ids(messages):
    return [message.id for message in messages]


def test_the_test_settings_pass():
    assert check_settings() == []


def test_the_checks_are_registered_with_django():
    with override_settings(AGENTLOOP=["not", "a", "dict"]):
        assert "agentloop.E001" in ids(run_checks())


# -- E001: AGENTLOOP is a dict -----------------------------------------------------------
@pytest.mark.parametrize("value", [["CANCEL_POLL_INTERVAL", 1], "x", None, 3])
def test_e001_agentloop_that_is_not_a_dict_fails(value):
    with override_settings(AGENTLOOP=value):
        errors = check_settings()

    assert ids(errors) == ["agentloop.E001"]
    assert isinstance(errors[0], Error)
    assert errors[0].hint


def test_e001_an_empty_dict_passes():
    with override_settings(AGENTLOOP={}):
        assert check_settings() == []


def test_e001_no_agentloop_setting_at_all_passes():
    with override_settings():
        del settings.AGENTLOOP
        assert check_settings() == []


# -- E002: only known keys ---------------------------------------------------------------
def test_e002_an_unknown_key_fails_and_is_named():
    with override_settings(AGENTLOOP={"CANCEL_POLL_INTERVALL": 1, "TOOL_CONCURENCY": 2}):
        errors = check_settings()

    assert ids(errors) == ["agentloop.E002"]
    assert "CANCEL_POLL_INTERVALL" in errors[0].msg
    assert "TOOL_CONCURENCY" in errors[0].msg
    assert "CANCEL_POLL_INTERVAL" in errors[0].hint


def test_e002_every_known_key_passes():
    with override_settings(AGENTLOOP=dict(DEFAULTS)):
        assert check_settings() == []


# -- E003: intervals and durations are non-negative numbers --------------------------------
NUMBER_KEYS = ["CANCEL_POLL_INTERVAL", "LEASE_SECONDS", "RETRY_BACKOFF", "PARTIAL_SAVE_INTERVAL"]


@pytest.mark.parametrize("key", NUMBER_KEYS)
@pytest.mark.parametrize("value", [-1, -0.5, "0.2", None])
def test_e003_a_negative_or_non_number_fails(key, value):
    with override_settings(AGENTLOOP={key: value}):
        errors = check_settings()

    assert ids(errors) == ["agentloop.E003"]
    assert key in errors[0].msg


@pytest.mark.parametrize("key", NUMBER_KEYS)
@pytest.mark.parametrize("value", [0, 0.05, 30])
def test_e003_a_non_negative_number_passes(key, value):
    with override_settings(AGENTLOOP={key: value}):
        assert check_settings() == []


# -- E004: MODEL_RETRIES is a non-negative integer -----------------------------------------
@pytest.mark.parametrize("value", [-1, 1.5, "2", None])
def test_e004_model_retries_that_is_not_a_non_negative_integer_fails(value):
    with override_settings(AGENTLOOP={"MODEL_RETRIES": value}):
        assert ids(check_settings()) == ["agentloop.E004"]


@pytest.mark.parametrize("value", [0, 5])
def test_e004_a_non_negative_integer_passes(value):
    with override_settings(AGENTLOOP={"MODEL_RETRIES": value}):
        assert check_settings() == []


# -- E005: TOOL_CONCURRENCY is None, "threads" or a positive integer ------------------------
@pytest.mark.parametrize("value", [0, -2, "processes", 1.5])
def test_e005_a_bad_tool_concurrency_fails(value):
    with override_settings(AGENTLOOP={"TOOL_CONCURRENCY": value}):
        errors = check_settings()

    assert ids(errors) == ["agentloop.E005"]
    assert repr(value) in errors[0].msg


@pytest.mark.parametrize("value", [None, "threads", 1, 8])
def test_e005_none_threads_or_a_positive_integer_passes(value):
    with override_settings(AGENTLOOP={"TOOL_CONCURRENCY": value}):
        assert check_settings() == []


def test_several_problems_are_reported_together():
    bad = {"NOPE": 1, "LEASE_SECONDS": -5, "MODEL_RETRIES": -1, "TOOL_CONCURRENCY": 0}
    with override_settings(AGENTLOOP=bad):
        assert ids(check_settings()) == [
            "agentloop.E002",
            "agentloop.E003",
            "agentloop.E004",
            "agentloop.E005",
        ]


# -- W001: the embedded background runner outside DEBUG ------------------------------------
def background_warnings():
    return [m for m in run_checks() if m.id == "agentloop.W001"]


@pytest.fixture
def celery_without_broker():
    """A current Celery app with no broker (another test may have left one that has one)."""
    from celery import Celery, current_app

    previous = current_app._get_current_object()
    Celery("no-broker", set_as_current=False).set_current()
    yield
    previous.set_current()


@override_settings(DEBUG=False, AGENTLOOP={"BACKGROUND": "auto"})
def test_w001_the_embedded_runner_chosen_by_default_without_debug_warns(celery_without_broker):
    from agentloop.background import backend_name

    assert backend_name() == "embedded"

    (warning,) = background_warnings()
    assert warning.hint


@pytest.mark.parametrize(
    "overrides",
    [
        {"DEBUG": True, "AGENTLOOP": {"BACKGROUND": "auto"}},
        {"DEBUG": False, "AGENTLOOP": {"BACKGROUND": "embedded"}},
        {"DEBUG": False, "AGENTLOOP": {"BACKGROUND": "celery"}},
    ],
    ids=["debug", "embedded-chosen", "celery"],
)
def test_w001_debug_an_explicit_embedded_choice_or_celery_pass(overrides):
    with override_settings(**overrides):
        assert background_warnings() == []

"""System checks of agentloop: each id fails on a bad value and passes on good ones."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import django
import pytest
from django.conf import settings
from django.core.checks import Error
from django.core.checks import run_checks as run_django_checks
from django.test import override_settings

from agentloop import providers
from agentloop.checks import check_settings, management_command
from agentloop.conf import DEFAULTS, agentloop_settings
from tests.providers.aws import isolate

ROOT = Path(__file__).resolve().parent.parent


def run_checks():
    """Django's checks, minus the database ones (Django 6 opens every database without this)."""
    return run_django_checks(databases=[])


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
    assert errors[0].hint == (
        "'CANCEL_POLL_INTERVALL': did you mean 'CANCEL_POLL_INTERVAL'?; "
        "'TOOL_CONCURENCY': did you mean 'TOOL_CONCURRENCY'?"
        ' (every key: "Settings" in the agentloop docs).'
    )


def test_e002_a_key_like_none_says_so_instead_of_listing_every_key():
    with override_settings(AGENTLOOP={"XYZZY": 1}):
        (error,) = check_settings()

    assert error.hint == "'XYZZY': no close key (every key: \"Settings\" in the agentloop docs)."


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


@pytest.mark.parametrize("key", [key for key in NUMBER_KEYS if key != "LEASE_SECONDS"])
@pytest.mark.parametrize("value", [0, 0.05, 30])
def test_e003_a_non_negative_number_passes(key, value):
    with override_settings(AGENTLOOP={key: value}):
        assert check_settings() == []


#: keys of seconds with a floor of their own, a value just below it, and one at it.
FLOORS = [
    ("LEASE_SECONDS", 0, 1),
    ("LEASE_SECONDS", 0.99, 1.0),
    ("EVENTS_POLL_INTERVAL", 0, 0.01),
    ("EVENTS_KEEPALIVE", 0, 0.01),
    ("EVENTS_TTL", 0.5, 1),
    ("APPROVAL_TIMEOUT", 0, 0.01),
]


@pytest.mark.parametrize(("key", "below", "at"), FLOORS)
def test_e003_a_key_of_seconds_below_its_floor_fails_with_one_line_and_reads_as_its_default(
    key, below, at
):
    with override_settings(AGENTLOOP={key: below}):
        errors = check_settings()
        agentloop_settings.reload()
        read = getattr(agentloop_settings, key)

    assert ids(errors) == ["agentloop.E003"]
    assert errors[0].msg.startswith(f"AGENTLOOP[{key!r}] must be ") and "\n" not in errors[0].msg
    assert errors[0].msg.endswith(f", not {below!r}.")
    assert read == DEFAULTS[key]  # never the value that makes no sense
    with override_settings(AGENTLOOP={key: at}):
        assert check_settings() == []


def test_e003_lease_seconds_says_why_it_has_a_floor():
    with override_settings(AGENTLOOP={"LEASE_SECONDS": 0}):
        [error] = check_settings()

    assert "at least 1" in error.msg and "two workers run one chat" in error.msg


@pytest.mark.parametrize("key", [*NUMBER_KEYS, "EVENTS_TTL", "APPROVAL_TIMEOUT"])
@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_e003_infinity_and_nan_are_no_number_of_seconds(key, value):
    with override_settings(AGENTLOOP={key: value}):
        assert ids(check_settings()) == ["agentloop.E003"]


@pytest.mark.django_db
@override_settings(AGENTLOOP={**settings.AGENTLOOP, "LEASE_SECONDS": 0})
def test_a_lease_seconds_of_zero_keeps_one_writer_per_chat():
    from agentloop.django_store.leases import Lease  # the models load once Django is set up
    from agentloop.models import Chat

    agentloop_settings.reload()
    chat = Chat.objects.create(model="scripted:test")
    held = Lease.take(Chat, chat.pk)

    assert held is not None
    assert Lease.take(Chat, chat.pk) is None  # a second worker finds the chat held
    assert held.release(state="idle")


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
    from agentloop.runners import runner_name as backend_name

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


# -- W003: a broker in the settings, but Celery's app is not loaded --------------------------
BROKER = "redis://127.0.0.1:6379/15"


def celery_warnings():
    return [m for m in run_checks() if m.id == "agentloop.W003"]


@pytest.fixture
def celery_with_broker():
    """The project's Celery app, loaded and current (what its ``__init__.py`` import does)."""
    from celery import Celery, current_app

    previous = current_app._get_current_object()
    app = Celery("project", set_as_current=False)
    app.conf.broker_url = BROKER
    app.set_current()
    yield app
    previous.set_current()


@override_settings(CELERY_BROKER_URL=BROKER, AGENTLOOP={"BACKGROUND": "auto"})
def test_w003_a_broker_setting_without_the_celery_app_loaded_warns(celery_without_broker):
    from agentloop.runners import runner_name as backend_name

    assert backend_name() == "embedded"  # what complete_later() would do: run in-process

    (warning,) = celery_warnings()
    assert "CELERY_BROKER_URL" in warning.msg
    assert "__init__.py" in warning.hint
    assert "from .celery import app as celery_app" in warning.hint


@override_settings(CELERY_BROKER_URL=BROKER, AGENTLOOP={"BACKGROUND": "celery"})
def test_w003_an_explicit_celery_background_without_the_app_loaded_warns(celery_without_broker):
    assert [m.id for m in celery_warnings()] == ["agentloop.W003"]


@override_settings(CELERY_BROKER_URL=BROKER, AGENTLOOP={"BACKGROUND": "auto"})
def test_w003_the_celery_app_loaded_with_its_broker_passes(celery_with_broker):
    from agentloop.runners import runner_name as backend_name

    assert backend_name() == "celery"
    assert celery_warnings() == []


@pytest.mark.parametrize(
    "overrides",
    [
        {"AGENTLOOP": {"BACKGROUND": "auto"}},
        {"CELERY_BROKER_URL": "", "AGENTLOOP": {}},
        {"CELERY_BROKER_URL": BROKER, "AGENTLOOP": {"BACKGROUND": "embedded"}},
    ],
    ids=["no-broker-setting", "empty-broker-setting", "embedded-chosen"],
)
def test_w003_no_broker_setting_or_an_embedded_choice_passes(overrides, celery_without_broker):
    with override_settings(**overrides):
        assert celery_warnings() == []


# -- W005: Celery runs the steps, but closes the database connection around every job --------
def reuse_warnings():
    return [m for m in run_checks() if m.id == "agentloop.W005"]


@override_settings(CELERY_BROKER_URL=BROKER, AGENTLOOP={"BACKGROUND": "auto"})
def test_w005_celery_without_db_reuse_warns_and_names_the_setting(celery_with_broker):
    (warning,) = reuse_warnings()
    assert "CELERY_DB_REUSE_MAX" in warning.msg and "CELERY_DB_REUSE_MAX" in warning.hint


@override_settings(
    CELERY_BROKER_URL=BROKER, CELERY_DB_REUSE_MAX=1000, AGENTLOOP={"BACKGROUND": "auto"}
)
def test_w005_db_reuse_in_the_settings_celery_reads_passes(celery_with_broker):
    # As a project's celery.py configures its app (docs/install.md): the CELERY_ settings.
    celery_with_broker.config_from_object("django.conf:settings", namespace="CELERY")
    assert reuse_warnings() == []
    assert celery_warnings() == []


@override_settings(CELERY_BROKER_URL=BROKER, AGENTLOOP={"BACKGROUND": "auto"})
def test_w005_a_database_with_djangos_pool_is_not_warned(celery_with_broker, monkeypatch):
    # The fixup's close around each job is then a check-in (docs/running-at-scale.md, choosing
    # a pool); only the settings are read here, no pooled connection is opened.
    from django.db import connection

    options = {**connection.settings_dict.get("OPTIONS", {}), "pool": {"max_size": 4}}
    monkeypatch.setitem(connection.settings_dict, "OPTIONS", options)
    assert reuse_warnings() == []


@override_settings(CELERY_BROKER_URL=BROKER, AGENTLOOP={"BACKGROUND": "embedded"})
def test_w005_the_embedded_runner_is_not_warned_about_celery(celery_with_broker):
    assert reuse_warnings() == []


# -- W002: only the chosen DEFAULT_MODEL's provider, only where a chat could run --------------
@pytest.fixture
def no_anthropic_key(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)


def key_warnings():
    return [m for m in run_checks() if m.id == "agentloop.W002"]


@override_settings(AGENTLOOP={"DEFAULT_MODEL": "anthropic:claude-haiku-4-5"})
def test_w002_a_chosen_default_model_without_its_key_warns_and_names_both(no_anthropic_key):
    (warning,) = key_warnings()

    assert warning.obj == "anthropic"
    assert "anthropic:claude-haiku-4-5" in warning.msg
    assert "ANTHROPIC_API_KEY" in warning.hint


@override_settings(AGENTLOOP={})
def test_w002_a_project_that_never_chose_a_default_model_gets_no_warning(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)

    assert key_warnings() == []


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["manage.py", "migrate", "--noinput"], "migrate"),
        (["/srv/site/manage.py", "check"], "check"),
        (["/venv/bin/django-admin", "runserver"], "runserver"),
        (["/venv/lib/python3.11/site-packages/django/__main__.py", "migrate"], "migrate"),
        (["/venv/bin/celery", "-A", "mysite", "worker"], None),
        (["/venv/bin/pytest", "tests"], None),
        (["manage.py"], None),
    ],
)
def test_management_command_reads_the_command_line_as_django_does(argv, command):
    assert management_command(argv) == command


@pytest.mark.parametrize(
    "command",
    ["migrate", "makemigrations", "createsuperuser", "test", "runserver", "agentloop", "mine"],
)
@override_settings(AGENTLOOP={"DEFAULT_MODEL": "anthropic:claude-haiku-4-5"})
def test_w002_does_not_repeat_on_every_command(command, no_anthropic_key, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["manage.py", command])

    assert key_warnings() == []


@pytest.mark.parametrize(
    "argv", [["manage.py", "check"], ["manage.py", "check", "--deploy"], ["celery", "worker"]]
)
@override_settings(AGENTLOOP={"DEFAULT_MODEL": "anthropic:claude-haiku-4-5"})
def test_w002_warns_on_check_and_outside_management_commands(argv, no_anthropic_key, monkeypatch):
    monkeypatch.setattr(sys, "argv", argv)

    assert [m.obj for m in key_warnings()] == ["anthropic"]


@override_settings(AGENTLOOP={"DEFAULT_MODEL": "anthropic:claude-haiku-4-5"})
def test_w002_says_once_what_to_do_set_the_key_or_use_the_offline_model(no_anthropic_key):
    (warning,) = key_warnings()

    assert warning.msg == (
        "DEFAULT_MODEL 'anthropic:claude-haiku-4-5' needs an API key for provider "
        "'anthropic', and none is configured."
    )
    assert warning.hint.startswith(
        "Set AGENTLOOP['PROVIDERS']['anthropic']['api_key'] or the ANTHROPIC_API_KEY "
        "environment variable; or, to try agentloop with no key, make DEFAULT_MODEL "
        "\"offline:any\" with AGENTLOOP['PROVIDERS']['offline'] = "
        "{'class': 'agentloop.testing.OfflineProvider'}"
    )
    assert "API key" not in warning.hint  # the message says the problem, the hint the fix


@pytest.mark.subprocess
def test_w002_a_real_migrate_or_command_prints_no_key_warning_but_check_does(tmp_path):
    """The example project with an Anthropic DEFAULT_MODEL and no key, as a user runs it."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "example_project.settings",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'fresh.sqlite3'}",
        "AGENTLOOP_MODEL": "anthropic:claude-haiku-4-5",
    }
    for key in ("ANTHROPIC_API_KEY", "AGENTLOOP_TEST_DB_NAME"):
        env.pop(key, None)

    def manage(*args: str) -> str:
        result = subprocess.run(  # noqa: S603 - our own interpreter and manage.py
            [sys.executable, str(ROOT / "manage.py"), *args], env=env, cwd=ROOT,
            capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        return result.stdout + result.stderr

    migrated = manage("migrate", "--noinput")
    checked = manage("check")
    demo = manage("agentloop", "demo", "--model", "demo:rule-based", "Hi")  # checks run first

    assert "Applying agentloop.0001_initial... OK" in migrated
    assert "agentloop.W002" not in migrated
    assert checked.count("agentloop.W002") == 1
    assert "agentloop.W002" not in demo
    assert "ANTHROPIC_API_KEY" in checked


# -- E006: the runner ------------------------------------------------------------------------
@override_settings(AGENTLOOP={"RUNNER": "rq"})
def test_e006_an_unknown_runner_fails():
    assert "agentloop.E006" in [m.id for m in run_checks()]


@pytest.mark.skipif(django.VERSION >= (6, 0), reason="Django 6 has django.tasks")
@override_settings(AGENTLOOP={"RUNNER": "django_tasks"})
def test_e006_the_django_tasks_runner_needs_django_6():
    (message,) = run_checks()
    assert message.id == "agentloop.E006" and "needs Django 6" in message.msg


@pytest.mark.skipif(django.VERSION < (6, 0), reason="django.tasks needs Django 6")
@override_settings(AGENTLOOP={"RUNNER": "django_tasks"})
def test_e006_the_django_tasks_runner_passes_on_django_6():
    assert run_checks() == []


@pytest.mark.parametrize("runner", ["auto", "celery", "embedded"])
def test_e006_a_known_runner_passes(runner):
    with override_settings(DEBUG=True, AGENTLOOP={"RUNNER": runner}):
        assert [m.id for m in run_checks() if m.id == "agentloop.E006"] == []


# -- E007: every other key has a type too (agentloop.conf.Settings) --------------------------
@override_settings(AGENTLOOP={"EMBEDDED_WORKERS": 0, "EVENTS_MAXLEN": "many"})
def test_e007_a_value_of_the_wrong_type_fails_and_reads_as_its_default():
    from agentloop.conf import agentloop_settings

    errors = check_settings()

    assert ids(errors) == ["agentloop.E007", "agentloop.E007"]
    assert "EMBEDDED_WORKERS" in errors[0].msg and "EVENTS_MAXLEN" in errors[1].msg
    agentloop_settings.reload()
    assert (agentloop_settings.EMBEDDED_WORKERS, agentloop_settings.EVENTS_MAXLEN) == (2, 1000)


@override_settings(AGENTLOOP={"LEASE_SECONDS": 30})
def test_settings_are_read_with_their_types():
    from agentloop.conf import agentloop_settings

    agentloop_settings.reload()
    assert agentloop_settings.LEASE_SECONDS == 30.0
    assert isinstance(agentloop_settings.LEASE_SECONDS, float)
    assert isinstance(agentloop_settings.MODEL_RETRIES, int)


# -- W040: a configured Bedrock provider without a region ------------------------------------
def bedrock_warnings():
    try:
        return [m for m in run_checks() if m.id == "agentloop.W040"]
    finally:
        providers.forget_configured()


@override_settings(AGENTLOOP={"PROVIDERS": {"bedrock": {"profile": None}}})
def test_w040_a_configured_bedrock_provider_without_a_region_warns(monkeypatch, tmp_path):
    isolate(monkeypatch, tmp_path)

    (warning,) = bedrock_warnings()

    assert warning.obj == "bedrock"
    assert "AWS_REGION" in warning.hint


@pytest.mark.parametrize("where", ["setting", "AWS_REGION", "AWS_DEFAULT_REGION"])
def test_w040_a_region_from_the_setting_or_the_environment_passes(monkeypatch, tmp_path, where):
    isolate(monkeypatch, tmp_path)
    configured = {"bedrock": {"region": "eu-central-1"} if where == "setting" else {}}
    if where != "setting":
        monkeypatch.setenv(where, "eu-central-1")

    with override_settings(AGENTLOOP={"PROVIDERS": configured}):
        assert bedrock_warnings() == []


@override_settings(
    AGENTLOOP={"PROVIDERS": {"mine": {"class": "agentloop.providers.bedrock.BedrockProvider"}}}
)
def test_w040_names_a_bedrock_provider_configured_under_another_name(monkeypatch, tmp_path):
    isolate(monkeypatch, tmp_path)

    assert [warning.obj for warning in bedrock_warnings()] == ["mine"]

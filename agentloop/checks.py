"""System checks for the ``AGENTLOOP`` setting (ids ``agentloop.E0xx``)."""

from __future__ import annotations

import difflib
import sys
from pathlib import Path
from typing import Any

import django
from django.apps import apps
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, connections

from . import providers
from .agents import Agent
from .budgets.budget_checks import check_budgets, check_rate_limits
from .conf import DEFAULTS, agentloop_settings, get_chat_model, settings_errors
from .engine import tracing
from .exceptions import ConfigurationError
from .import_paths import load_by_path
from .models import AbstractChat, AbstractMessage, AbstractToolCall, AbstractUsage
from .providers.azure import AzureProvider
from .providers.bedrock import BedrockProvider
from .providers.vertex import VertexAIProvider
from .runners import Runner, runner_name
from .runners.enqueueing import BUILTINS as RUNNERS
from .runners.pools import check_database_reuse
from .tools import snake_case


def _closest_keys_hint(unknown: list[str]) -> str:
    """For each unknown key the closest known one (difflib), not the whole list of keys."""
    guesses = []
    for key in unknown:
        close = difflib.get_close_matches(key.upper(), DEFAULTS, n=1, cutoff=0.6)
        guesses.append(
            f"{key!r}: did you mean {close[0]!r}?" if close else f"{key!r}: no close key"
        )
    return "; ".join(guesses) + ' (every key: "Settings" in the agentloop docs).'


@register(Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """AGENTLOOP must be a dict of known keys with sensible values."""
    value = getattr(settings, "AGENTLOOP", {})
    if not isinstance(value, dict):
        return [
            Error(
                "AGENTLOOP must be a dict.",
                hint="Set AGENTLOOP = {...} in your settings.",
                id="agentloop.E001",
            )
        ]
    errors: list[CheckMessage] = []
    unknown = sorted(set(value) - set(DEFAULTS))
    if unknown:
        errors.append(
            Error(
                f"Unknown AGENTLOOP keys: {', '.join(unknown)}.",
                hint=_closest_keys_hint(unknown),
                id="agentloop.E002",
            )
        )
    # The typed settings (agentloop.conf.Settings) say what each key may hold.
    problems = settings_errors({k: v for k, v in value.items() if k in DEFAULTS})
    for key, problem in sorted(problems.items()):
        if key in _CHECKED_APART:
            continue
        given = value.get(key)
        if key in _NON_NEGATIVE_NUMBERS:
            rule = _SECONDS_RULES.get(key, "a finite, non-negative number")
            message, check_id = f"must be {rule}, not {given!r}", "E003"
        elif key == "MODEL_RETRIES":
            message, check_id = f"must be a non-negative integer, not {given!r}", "E004"
        elif key == "RETENTION_DAYS":
            message = f"must be None or a whole number of days of at least 1, not {given!r}"
            check_id = "E011"
        elif key == "TOOL_CONCURRENCY":
            message = f"must be None, 'threads' or a positive integer, not {given!r}"
            check_id = "E005"
        else:
            message, check_id = f"is invalid ({problem}): {given!r}", "E007"
        errors.append(Error(f"AGENTLOOP[{key!r}] {message}.", id=f"agentloop.{check_id}"))
    return errors


#: keys holding seconds (or another non-negative number): check agentloop.E003.
_NON_NEGATIVE_NUMBERS = frozenset(
    {
        "CANCEL_POLL_INTERVAL", "LEASE_SECONDS", "RETRY_BACKOFF", "RETRY_BACKOFF_MAX",
        "RETRY_AFTER_MAX", "PARTIAL_SAVE_INTERVAL", "EVENTS_REAUTH_SECONDS",
        "EVENTS_POLL_INTERVAL", "EVENTS_KEEPALIVE", "STALE_QUEUED_SECONDS", "EVENTS_TTL",
        "APPROVAL_TIMEOUT",
    }
)  # fmt: skip
#: what those keys must hold where it is more than a non-negative number (the bounds are
#: the types of ``agentloop.conf.Settings``; infinity and NaN are never numbers of seconds).
_SECONDS_RULES = {
    "LEASE_SECONDS": "a number of seconds of at least 1 (the heartbeat renews the lease "
    "every third of it; 0 would let two workers run one chat)",
    "EVENTS_POLL_INTERVAL": "a number of seconds greater than 0",
    "EVENTS_KEEPALIVE": "a number of seconds greater than 0",
    "EVENTS_TTL": "None or a number of seconds of at least 1 (Redis expires whole seconds)",
    "APPROVAL_TIMEOUT": "None or a number of seconds greater than 0 (0 would deny every "
    "approval at once)",
}


#: keys with checks of their own, each problem of their entries said apart (agentloop.E012 to
#: E014: ``agentloop.budgets.budget_checks``, registered with these).
_CHECKED_APART = frozenset({"BUDGETS", "BUDGET_SUBJECT", "RATE_LIMITS"})
BUDGET_CHECKS = (check_budgets, check_rate_limits)
#: E020: ``agentloop.runners.pools``, registered with it.
RUNNER_CHECKS = (check_database_reuse,)


@register(Tags.compatibility)
def check_background(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """The embedded runner loses queued steps on restart: warn outside DEBUG."""
    if settings.DEBUG or _chosen_runner() in ("embedded", "django_tasks"):
        return []  # chosen explicitly, or development
    if runner_name() == "embedded":
        return [
            Warning(
                "Background steps run on in-process threads (no Celery broker configured).",
                hint="Configure Celery with a broker (e.g. Redis) for production, or set "
                "AGENTLOOP['RUNNER'] = 'embedded' to accept this.",
                id="agentloop.W001",
            )
        ]
    return []


@register(Tags.compatibility)
def check_mcp_serve(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Each agent ``AGENTLOOP["MCP_SERVE"]`` offers imports, is an Agent, and has a tool name
    of its own: a mistake shows at deploy, not at a client's first call."""
    errors: list[CheckMessage] = []
    named: dict[str, str] = {}
    for path in agentloop_settings.MCP_SERVE.agents:
        try:
            agent = load_by_path(path)
        except ConfigurationError as exc:
            errors.append(Error(f"AGENTLOOP['MCP_SERVE']['agents']: {exc}", id="agentloop.E015"))
            continue
        if not (isinstance(agent, type) and issubclass(agent, Agent)):
            errors.append(
                Error(
                    f"AGENTLOOP['MCP_SERVE']['agents']: {path} is not an agentloop.Agent class.",
                    id="agentloop.E015",
                )
            )
            continue
        name = snake_case(agent.__name__)
        if name in named:
            errors.append(
                Error(
                    f"AGENTLOOP['MCP_SERVE']['agents']: {path} and {named[name]} are both "
                    f"offered as the tool {name!r}.",
                    hint="Offer one of them, or rename one class.",
                    id="agentloop.E015",
                )
            )
        named[name] = path
    return errors


@register(Tags.compatibility)
def check_tracing(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """TRACING without opentelemetry-api traces nothing: say so."""
    if agentloop_settings.TRACING and not tracing.available():
        return [
            Warning(
                "AGENTLOOP['TRACING'] is on, but opentelemetry-api is not installed: "
                "no spans are made.",
                hint="pip install 'django-agentloop[otel]' (and an OpenTelemetry SDK to "
                "export the spans), or set AGENTLOOP['TRACING'] = False.",
                id="agentloop.W004",
            )
        ]
    return []


def _is_runner_path(path: Any) -> bool:
    try:
        found = load_by_path(str(path))
    except Exception:
        return False
    return isinstance(found, type) and issubclass(found, Runner)


def _chosen_runner() -> str:
    """The runner the settings name ("auto" when they leave it to what is configured)."""
    runner = agentloop_settings.RUNNER
    return agentloop_settings.BACKGROUND if runner == "auto" else runner


#: what agentloop reads a chat's rows by: related name -> the abstract model it must build on.
CHAT_RELATIONS = {
    "messages": "AbstractMessage",
    "tool_calls": "AbstractToolCall",
    "usage_records": "AbstractUsage",
}


def chat_model_problems(chat_model: Any) -> list[str]:
    """Why ``chat_model`` can't be driven as a chat (empty when it can)."""
    abstract = {
        "AbstractMessage": AbstractMessage,
        "AbstractToolCall": AbstractToolCall,
        "AbstractUsage": AbstractUsage,
    }
    label = chat_model._meta.label
    if not issubclass(chat_model, AbstractChat):
        return [f"{label} is not built on agentloop.models.AbstractChat."]
    related = {
        relation.get_accessor_name(): relation.related_model
        for relation in chat_model._meta.related_objects
    }
    problems = []
    for name, base in CHAT_RELATIONS.items():
        model = related.get(name)
        if model is None or not issubclass(model, abstract[base]):
            problems.append(
                f"{label} needs a model built on {base} with a foreign key to it whose "
                f"related_name is {name!r} (agentloop reads the chat's rows by that name)."
            )
    return problems


@register(Tags.models)
def check_chat_models(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """CHAT_MODEL names an installed chat model, and every chat model has its rows' models."""
    errors: list[CheckMessage] = []
    try:
        get_chat_model()
    except ImproperlyConfigured as exc:
        errors.append(Error(str(exc), id="agentloop.E008"))
    for model in apps.get_models():
        if issubclass(model, AbstractChat):
            for problem in chat_model_problems(model):
                errors.append(
                    Error(
                        problem,
                        hint='See "A chat model of your own" in the agentloop docs.',
                        obj=model,
                        id="agentloop.E008",
                    )
                )
    return errors


@register(Tags.compatibility)
def check_runner(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """RUNNER must name a runner, and "django_tasks" needs Django 6's tasks framework."""
    runner = agentloop_settings.RUNNER
    if runner not in ("auto", *RUNNERS) and not _is_runner_path(runner):
        return [
            Error(
                f"AGENTLOOP['RUNNER'] must be 'auto', 'celery', 'embedded', 'django_tasks' or "
                f"the import path of a Runner subclass, not {runner!r}.",
                id="agentloop.E006",
            )
        ]
    if runner == "django_tasks" and django.VERSION < (6, 0):
        return [
            Error(
                "AGENTLOOP['RUNNER'] = 'django_tasks' needs Django 6 or later (django.tasks); "
                f"this is Django {django.get_version()}.",
                hint="Upgrade Django, or choose the 'celery' or 'embedded' runner.",
                id="agentloop.E006",
            )
        ]
    return []


@register(Tags.compatibility)
def check_celery_app_loaded(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """A broker in the settings that Celery's current app doesn't have: steps would run here.

    ``complete_later()`` sends jobs to Celery only when Celery's *current* app has a broker
    (``agentloop.runners.runner_name``); the project's app becomes current when the project
    package imports it. Without that import, ``CELERY_BROKER_URL`` is read by nobody.
    """
    broker_url = getattr(settings, "CELERY_BROKER_URL", None)
    if not broker_url or _chosen_runner() in ("embedded", "django_tasks"):
        return []  # no broker meant for Celery, or another runner chosen on purpose
    try:
        from celery import current_app  # local: Celery is an optional dependency
    except ImportError:
        return [
            Warning(
                "CELERY_BROKER_URL is set but Celery is not installed: background steps run "
                "on in-process threads.",
                hint='Install the celery extra: pip install "django-agentloop[celery]".',
                id="agentloop.W003",
            )
        ]
    if current_app.conf.broker_url:
        # Read as Celery's Django fixup reads it: unset, it closes every database connection
        # before and after each task, so each step opens a new one.
        if current_app.conf.get("CELERY_DB_REUSE_MAX") or _pooled():
            return []  # kept between jobs, or closing is a check-in to Django's pool
        return [
            Warning(
                "CELERY_DB_REUSE_MAX is not set: every agentloop job (one step) opens a new "
                "database connection, whatever CONN_MAX_AGE says.",
                hint="Set CELERY_DB_REUSE_MAX = 1000 in the settings Celery reads (see "
                '"Running at scale" in the agentloop docs).',
                id="agentloop.W005",
            )
        ]
    return [
        Warning(
            "CELERY_BROKER_URL is set but no Celery app with a broker is loaded: "
            "complete_later() would run chats in the calling process, not on a worker.",
            hint="Import your Celery app in your project package's __init__.py: "
            '"from .celery import app as celery_app" (see "Installing agentloop in a Django '
            'project" in the agentloop docs).',
            id="agentloop.W003",
        )
    ]


#: the periodic task that applies ``RETENTION_DAYS`` (agentloop.tasks).
RETENTION_TASK = "agentloop.delete_idle_chats"


@register(Tags.compatibility)
def check_retention_scheduled(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """RETENTION_DAYS with Celery, but beat's schedule (in the settings) never runs it."""
    if agentloop_settings.RETENTION_DAYS is None or runner_name() != "celery":
        return []
    from celery import current_app  # local: Celery is an optional dependency

    if current_app.conf.beat_scheduler != "celery.beat:PersistentScheduler":
        return []  # a schedule kept elsewhere (a database scheduler): not ours to read
    schedule = current_app.conf.beat_schedule or {}
    if any(entry.get("task") == RETENTION_TASK for entry in schedule.values()):
        return []
    return [
        Warning(
            "AGENTLOOP['RETENTION_DAYS'] is set, but Celery beat's schedule has no "
            f"{RETENTION_TASK!r} entry: idle chats are never deleted.",
            hint="Use CELERY_BEAT_SCHEDULE = beat_schedule() (from agentloop.tasks), or add "
            f'{{"task": "{RETENTION_TASK}", "schedule": 86400.0}} to yours, or run '
            '"manage.py agentloop retention" daily (see "Data retention and erasure" in the '
            "agentloop docs).",
            id="agentloop.W006",
        )
    ]


def _pooled() -> bool:
    """The default database has Django's connection pool (``OPTIONS["pool"]``)."""
    return bool(connections[DEFAULT_DB_ALIAS].settings_dict.get("OPTIONS", {}).get("pool"))


#: management commands that set up or inspect a project and never run a chat: the provider
#: checks (W040 and after) stay quiet on them (a fresh project's first ``migrate`` needs no
#: provider set up); the key check speaks on ``check`` only (:data:`KEY_CHECK_COMMANDS`).
COMMANDS_WITHOUT_CHATS = frozenset(
    {
        "changepassword", "clearsessions", "collectstatic", "compilemessages",
        "createcachetable", "createsuperuser", "dbshell", "diffsettings", "dumpdata",
        "findstatic", "flush", "inspectdb", "loaddata", "makemessages", "makemigrations",
        "migrate", "optimizemigration", "remove_stale_contenttypes", "sendtestemail",
        "showmigrations", "sqlflush", "sqlmigrate", "sqlsequencereset", "squashmigrations",
        "startapp", "startproject", "test",
    }
)  # fmt: skip


def management_command(argv: list[str] | None = None) -> str | None:
    """The command this process runs (``manage.py migrate`` -> "migrate"), if it is one.

    Django passes checks no word of the command that runs them, so this reads the command
    line the way ``ManagementUtility`` does: ``manage.py``, ``django-admin`` or
    ``python -m django``, then the subcommand.
    """
    argv = sys.argv if argv is None else argv
    if len(argv) < 2:
        return None
    program = Path(argv[0])
    is_django = program.name in ("manage.py", "django-admin", "django-admin.py") or (
        program.name == "__main__.py" and program.parent.name == "django"
    )
    return argv[1] if is_django else None


#: the management commands on which agentloop.W002 speaks: the one that is asked to report.
#: Other commands stay quiet (a chat run without its key fails naming where the key goes),
#: so the warning doesn't come back on every command.
KEY_CHECK_COMMANDS = frozenset({"check"})
#: how to try agentloop without a key, as W002's hint says it.
OFFLINE_ADVICE = (
    'or, to try agentloop with no key, make DEFAULT_MODEL "offline:any" with '
    "AGENTLOOP['PROVIDERS']['offline'] = {'class': 'agentloop.testing.OfflineProvider'} "
    '(see "Check it" in "Installing agentloop in a Django project")'
)


@register(Tags.compatibility)
def check_provider_keys(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Warn when the provider of the chosen ``DEFAULT_MODEL`` needs a key configured nowhere.

    Only a ``DEFAULT_MODEL`` the project set is looked at (a project that never chose one
    names its models per chat), only on ``manage.py check`` (:data:`KEY_CHECK_COMMANDS`) or
    outside management commands (``run_checks()`` in a test). The hint says what to
    do once: where to set the key, or the offline model. The key is never read into a message.
    """
    chosen = getattr(settings, "AGENTLOOP", None)
    command = management_command()
    if (command is not None and command not in KEY_CHECK_COMMANDS) or not isinstance(chosen, dict):
        return []
    default_model = chosen.get("DEFAULT_MODEL")
    if not isinstance(default_model, str) or not default_model:
        return []
    try:
        name = providers.split_model(default_model)[0]
        provider = providers.get(name)
    except Exception:  # unknown or unimportable: that fails when used, with its own message
        return []
    api_key = getattr(provider, "api_key", None)  # HTTP providers, and Azure's two routes
    if not callable(api_key):
        return []  # a provider that takes no key (a test double, a local model)
    try:
        api_key()
    except ConfigurationError as exc:
        # The provider's error says where a key goes after "No API key for provider 'x': ".
        where = str(exc).partition(": ")[2] if str(exc).startswith("No API key") else str(exc)
        where = where.rstrip(".")
        return [
            Warning(
                f"DEFAULT_MODEL {default_model!r} needs an API key for provider {name!r}, "
                "and none is configured.",
                hint=f"{where[:1].upper()}{where[1:]}; {OFFLINE_ADVICE}.",
                obj=name,
                id="agentloop.W002",
            )
        ]
    return []


# Bedrock's checks use ids agentloop.E040-E049 and W040-W049 (a range of their own).
@register(Tags.compatibility)
def check_bedrock_region(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Warn when a configured Bedrock provider (``AGENTLOOP["PROVIDERS"][name]`` of the
    ``bedrock`` built-in, or of a class that is one) finds no AWS region: its every call
    would fail. The region may come from the setting, ``AWS_REGION``, ``AWS_DEFAULT_REGION``
    or the AWS profile; credentials are never read here."""
    if management_command() in COMMANDS_WITHOUT_CHATS:
        return []
    configured = agentloop_settings.PROVIDERS
    warnings: list[CheckMessage] = []
    for name in configured if isinstance(configured, dict) else ():
        provider = _provider_or_none(name)
        if isinstance(provider, BedrockProvider) and not provider.auth.region():
            warnings.append(
                Warning(
                    f"Provider {name!r} (AWS Bedrock) has no AWS region: its calls will fail.",
                    hint=f"Set AGENTLOOP['PROVIDERS'][{name!r}]['region'], or AWS_REGION or "
                    "AWS_DEFAULT_REGION in the environment, or a region in the AWS profile.",
                    obj=name,
                    id="agentloop.W040",
                )
            )
    return warnings


@register(Tags.compatibility)
def check_azure_endpoints(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """An Azure AI Foundry provider that is configured (in ``PROVIDERS``) or used by
    ``DEFAULT_MODEL`` must have an endpoint: Azure has no default one (``agentloop.E009``)."""
    chosen = getattr(settings, "AGENTLOOP", None)
    if management_command() in COMMANDS_WITHOUT_CHATS or not isinstance(chosen, dict):
        return []
    names = (
        set(chosen.get("PROVIDERS") or {}) if isinstance(chosen.get("PROVIDERS"), dict) else set()
    )
    default_model = chosen.get("DEFAULT_MODEL")
    if isinstance(default_model, str) and default_model:
        try:
            names.add(providers.split_model(default_model)[0])
        except ConfigurationError:
            pass  # a model of no known provider fails when used, with its own message
    errors: list[CheckMessage] = []
    for name in sorted(names):
        provider = _provider_or_none(name)
        if isinstance(provider, AzureProvider) and not provider.base_url:
            errors.append(
                Error(
                    f"Provider {name!r} (Azure AI Foundry) has no endpoint.",
                    hint=f"Set AGENTLOOP['PROVIDERS'][{name!r}]['endpoint'] = "
                    "'https://NAME.services.ai.azure.com' (your resource's endpoint) or the "
                    "AZURE_ENDPOINT environment variable.",
                    obj=name,
                    id="agentloop.E009",
                )
            )
    return errors


def _provider_or_none(name: str) -> providers.Provider | None:
    """The provider named ``name``, or None when it is unknown or can't be made (that fails
    when a chat uses it, with its own message)."""
    try:
        return providers.get(name)
    except Exception:
        return None


@register(Tags.compatibility)
def check_vertex_ai(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """A Vertex AI provider that is configured (named in ``PROVIDERS`` or by
    ``DEFAULT_MODEL``) needs a project and a location it can find (agentloop.E010)."""
    chosen = getattr(settings, "AGENTLOOP", None)
    if management_command() in COMMANDS_WITHOUT_CHATS or not isinstance(chosen, dict):
        return []
    names = set(chosen.get("PROVIDERS") or {})
    default_model = chosen.get("DEFAULT_MODEL")
    if isinstance(default_model, str) and ":" in default_model:
        names.add(default_model.partition(":")[0])
    errors: list[CheckMessage] = []
    for name in sorted(names):
        provider = _provider_or_none(name)
        if not isinstance(provider, VertexAIProvider):
            continue
        try:
            problems = provider.configuration_problems()
        except ConfigurationError as exc:  # the credentials themselves (google-auth missing...)
            problems = [str(exc)]
        errors.extend(
            Error(
                problem,
                hint='See "Google Vertex AI" in the agentloop docs (projects and locations).',
                obj=name,
                id="agentloop.E010",
            )
            for problem in problems
        )
    return errors

"""System checks for the ``AGENTLOOP`` setting (ids ``agentloop.E0xx``)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register

from .conf import DEFAULTS


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
                hint=f"Known keys: {', '.join(sorted(DEFAULTS))}.",
                id="agentloop.E002",
            )
        )
    for key in ("CANCEL_POLL_INTERVAL", "LEASE_SECONDS", "RETRY_BACKOFF", "PARTIAL_SAVE_INTERVAL"):
        number = value.get(key, DEFAULTS[key])
        if isinstance(number, bool) or not isinstance(number, int | float) or number < 0:
            errors.append(
                Error(
                    f"AGENTLOOP[{key!r}] must be a non-negative number, not {number!r}.",
                    id="agentloop.E003",
                )
            )
    retries = value.get("MODEL_RETRIES", DEFAULTS["MODEL_RETRIES"])
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        errors.append(
            Error(
                f"AGENTLOOP['MODEL_RETRIES'] must be a non-negative integer, not {retries!r}.",
                id="agentloop.E004",
            )
        )
    concurrency = value.get("TOOL_CONCURRENCY", DEFAULTS["TOOL_CONCURRENCY"])
    if not (concurrency is None or concurrency == "threads" or
            (isinstance(concurrency, int) and not isinstance(concurrency, bool)
             and concurrency >= 1)):  # fmt: skip
        errors.append(
            Error(
                f"AGENTLOOP['TOOL_CONCURRENCY'] must be None, 'threads' or a positive integer, "
                f"not {concurrency!r}.",
                id="agentloop.E005",
            )
        )
    return errors


@register(Tags.compatibility)
def check_background(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """The embedded runner loses queued steps on restart: warn outside DEBUG."""
    from .background import backend_name
    from .conf import agentloop_settings

    if settings.DEBUG or agentloop_settings.BACKGROUND == "embedded":
        return []  # chosen explicitly, or development
    if backend_name() == "embedded":
        return [
            Warning(
                "Background steps run on in-process threads (no Celery broker configured).",
                hint="Configure Celery with a broker (e.g. Redis) for production, or set "
                "AGENTLOOP['BACKGROUND'] = 'embedded' to accept this.",
                id="agentloop.W001",
            )
        ]
    return []


@register(Tags.compatibility)
def check_provider_keys(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Warn when a provider the settings name needs an API key that is configured nowhere.

    The providers looked at: the one serving ``DEFAULT_MODEL`` and every name in
    ``PROVIDERS``. The key itself is never read into a message (there is none to show).
    """
    from . import providers
    from .conf import agentloop_settings
    from .exceptions import ConfigurationError
    from .providers.http import HTTPProvider

    names: list[str] = []
    default_model = agentloop_settings.DEFAULT_MODEL
    if isinstance(default_model, str) and default_model:
        try:
            names.append(providers.split_model(default_model)[0])
        except ConfigurationError:
            pass  # a model id with no known provider fails when used, with its own message
    configured = agentloop_settings.PROVIDERS
    if isinstance(configured, dict):
        names.extend(name for name in configured if isinstance(name, str))
    warnings: list[CheckMessage] = []
    for name in dict.fromkeys(names):
        try:
            provider = providers.get(name)
        except Exception:  # noqa: BLE001,S112 - unknown or unimportable: reported when used
            continue
        if not isinstance(provider, HTTPProvider):
            continue
        try:
            provider.api_key()
        except ConfigurationError as exc:
            warnings.append(
                Warning(
                    f"Provider {name!r} needs an API key and none is configured.",
                    hint=str(exc),
                    obj=name,
                    id="agentloop.W002",
                )
            )
    return warnings

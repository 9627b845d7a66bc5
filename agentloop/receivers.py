"""Signal receivers agentloop itself needs."""

from typing import Any

from django.core.signals import setting_changed
from django.dispatch import receiver

from .conf import agentloop_settings


@receiver(setting_changed)
def reload_agentloop_settings(*, setting: str, **kwargs: Any) -> None:
    """Drop cached settings when ``AGENTLOOP`` changes (``override_settings``)."""
    if setting == "AGENTLOOP":
        from . import providers

        agentloop_settings.reload()
        providers.forget_configured()

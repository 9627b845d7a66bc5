"""Signal receivers agentloop itself needs (imported by ``AppConfig.ready``, once models load)."""

from typing import Any

from django.apps import apps
from django.core.signals import setting_changed
from django.db.models.signals import post_delete
from django.dispatch import receiver

from . import providers
from .conf import agentloop_settings
from .live_events import delete_events
from .models import AbstractChat


@receiver(setting_changed)
def reload_agentloop_settings(*, setting: str, **kwargs: Any) -> None:
    """Drop cached settings when ``AGENTLOOP`` changes (``override_settings``)."""
    if setting == "AGENTLOOP":
        agentloop_settings.reload()
        providers.forget_configured()


def forget_chat_events(*, instance: Any, **kwargs: Any) -> None:
    """A deleted chat's live events go with it (its Redis stream), so a chat that later
    gets the same primary key starts with none. Queryset deletes send this too."""
    delete_events(instance)


def _connect_chat_deletes() -> None:
    """Connect :func:`forget_chat_events` to every concrete chat model (custom ones too).

    Per model, not for every sender: a receiver on all models would stop Django's fast
    deletes of message and tool call rows.
    """
    for model in apps.get_models():
        if issubclass(model, AbstractChat):
            post_delete.connect(
                forget_chat_events, sender=model, dispatch_uid=f"agentloop-forget-{model._meta}"
            )


_connect_chat_deletes()

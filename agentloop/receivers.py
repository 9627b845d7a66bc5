"""Signal receivers agentloop itself needs."""

from typing import Any

from django.core.signals import setting_changed
from django.dispatch import receiver

from .conf import agentloop_settings
from .signals import chat_cancelled, message_added


@receiver(setting_changed)
def reload_agentloop_settings(*, setting: str, **kwargs: Any) -> None:
    """Drop cached settings when ``AGENTLOOP`` changes (``override_settings``)."""
    if setting == "AGENTLOOP":
        from . import providers

        agentloop_settings.reload()
        providers.forget_configured()


@receiver(message_added)
def publish_message_event(*, chat: Any, message: Any, **kwargs: Any) -> None:
    """Live pages hear of every saved message (``agentloop.events``; Redis only)."""
    from .events import publish_message

    publish_message(chat, message)


@receiver(chat_cancelled)
def publish_cancelled_answer(*, chat: Any, **kwargs: Any) -> None:
    """An answer cut short by ``cancel()`` is kept as a ``cancelled`` row, which sends no
    ``message_added``: live pages hear of it here, to mark the text they streamed."""
    from .events import DatabaseEvents, get_backend, publish_message

    if isinstance(get_backend(), DatabaseEvents):
        return  # the database backend reads the row itself
    latest = chat.messages.order_by("-id").first()
    if latest is not None and latest.status == "cancelled":
        publish_message(chat, latest)

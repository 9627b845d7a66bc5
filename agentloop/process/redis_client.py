"""agentloop's one way to Redis: the client for ``AGENTLOOP["REDIS_URL"]`` and the key names.

Live events (``agentloop.live_events``) and cancel notices (``agentloop.process.cancel_notices``)
both name a chat the same way and put every key under ``REDIS_PREFIX``, so two
sites sharing one Redis database never read each other's chats.
"""

from __future__ import annotations

import threading
from typing import Any

from django.db import connections

from ..conf import agentloop_settings

__all__ = ["chat_key", "chat_name", "client", "key", "prefix", "redis_url"]

_clients: dict[str, Any] = {}
_lock = threading.Lock()


def redis_url() -> str | None:
    """``AGENTLOOP["REDIS_URL"]``, or None when Redis is not configured."""
    url = agentloop_settings.REDIS_URL
    return str(url) if url else None


def client(url: str | None = None) -> Any:
    """The shared synchronous client of ``url`` (default ``REDIS_URL``), made on first use."""
    url = url or redis_url()
    if url is None:
        raise ValueError("AGENTLOOP['REDIS_URL'] is not set")
    with _lock:
        found = _clients.get(url)
        if found is None:
            import redis  # the optional "redis" extra: only sites that configure Redis need it

            found = _clients[url] = redis.Redis.from_url(url)
        return found


def prefix() -> str:
    """``REDIS_PREFIX``, else ``"agentloop:<the default database's NAME>"``."""
    configured = agentloop_settings.REDIS_PREFIX
    if configured:
        return str(configured)
    # Read late: under a test runner the NAME becomes the test database's after start-up.
    return f"agentloop:{connections['default'].settings_dict['NAME']}"


def chat_key(chat: Any) -> str:
    """``"agentloop.chat:42"``: names the chat across processes (model label and pk)."""
    return chat_name(chat, chat.pk)


def chat_name(chat_model: Any, pk: Any) -> str:
    """``chat_key`` of the chat of ``chat_model`` (a model or an instance) with key ``pk``."""
    return f"{chat_model._meta.label_lower}:{pk}"


def key(kind: str, chat_name: str) -> str:
    """The Redis key of one ``kind`` (``events``, ``cancel``) for the chat named ``chat_name``."""
    return f"{prefix()}:{kind}:{chat_name}"

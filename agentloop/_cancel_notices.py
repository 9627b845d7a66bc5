"""Telling a running loop at once that cancel() was called, so it needn't wait for a poll.

The database flag stays the source of truth; a notice only makes the next
checkpoint read it immediately. Runs in this process hear about cancels made
here; with ``AGENTLOOP["REDIS_URL"]`` set, workers also hear about cancels made
in other processes (a Redis pub/sub message per cancel).
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

from . import _redis
from ._redis import chat_key

__all__ = ["RedisCancelListener", "listen_locally", "notify"]

logger = logging.getLogger(__name__)

_local: dict[str, weakref.WeakSet[threading.Event]] = {}
_lock = threading.Lock()
#: prune chats whose notices are all gone once ``_local`` reaches this size (keeps it bounded
#: in a worker that steps many chats; amortised O(1) per call).
_prune_at = 64


class _Notice(threading.Event):
    """A weak-referenceable Event."""


def _channel(key: str) -> str:
    return _redis.key("cancel", key)


def listen_locally(chat: Any) -> threading.Event:
    """An Event set whenever this chat is cancelled from this process."""
    notice = _Notice()
    if chat.pk is not None:
        with _lock:
            _local.setdefault(chat_key(chat), weakref.WeakSet()).add(notice)
            _prune()
    return notice


def _prune() -> None:
    """Forget chats with no live notice (called with ``_lock`` held)."""
    global _prune_at
    if len(_local) >= _prune_at:
        for key in [key for key, notices in _local.items() if not notices]:
            del _local[key]
        _prune_at = max(64, 2 * len(_local))


def notify(chat: Any) -> None:
    """Wake runs of ``chat`` here and, with Redis configured, in other processes."""
    key = chat_key(chat)
    with _lock:
        notices = list(_local.get(key, ()))
    for notice in notices:
        notice.set()
    if _redis.redis_url():
        try:
            _redis.client().publish(_channel(key), "cancel")
        except Exception:  # the flag is written; a worker will still see it when it polls
            logger.warning("Could not publish the cancel notice for %s", key, exc_info=True)


class RedisCancelListener:
    """While a worker runs a step, sets ``notice`` when a cancel message arrives."""

    def __init__(self, chat: Any, notice: threading.Event) -> None:
        self.channel = _channel(chat_key(chat))
        self.notice = notice
        self._pubsub: Any = None
        self._thread: Any = None

    def __enter__(self) -> RedisCancelListener:
        if not _redis.redis_url():
            return self
        try:
            self._pubsub = _redis.client().pubsub(ignore_subscribe_messages=True)
            self._pubsub.subscribe(**{self.channel: lambda message: self.notice.set()})
            self._thread = self._pubsub.run_in_thread(sleep_time=0.05, daemon=True)
        except Exception:
            logger.warning("Cancel notices unavailable; polling only", exc_info=True)
            self._pubsub = None
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._thread is not None:
            self._thread.stop()
            self._thread.join(timeout=1)
        if self._pubsub is not None:
            self._pubsub.close()

"""Telling a running loop at once that cancel() was called, so it needn't wait for a poll.

The database flag stays the source of truth; a notice only makes the next
checkpoint read it immediately. Runs in this process hear about cancels made
here; with ``AGENTLOOP["REDIS_URL"]`` set, workers also hear about cancels made
in other processes (a Redis pub/sub message per cancel).

Per process, not per step: one subscriber (one pub/sub connection, one thread) listens to
every chat's cancel channel under ``REDIS_PREFIX`` (a pattern subscription, so a step costs
Redis nothing) and sets the notices of the runs of that chat in this process. Many chats
cancelled or halted at once (``notify_many``) are one message on the ``many`` channel, which
names them all (a chat's name always has a colon; ``many`` has none). It starts with
the first background step, reconnects after Redis restarts, and is made anew in a forked
child (a prefork pool's children never share the parent's socket).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import weakref
from contextlib import suppress
from typing import Any

from . import redis_client
from .redis_client import chat_key, chat_name

__all__ = [
    "RedisCancelListener",
    "Subscriber",
    "covers",
    "hear",
    "listen_locally",
    "notify",
    "notify_many",
    "stop_hearing",
    "stop_subscribers",
    "subscriber",
]

logger = logging.getLogger(__name__)

_local: dict[str, weakref.WeakSet[threading.Event]] = {}
_lock = threading.Lock()
#: prune chats whose notices are all gone once ``_local`` reaches this size (keeps it bounded
#: in a worker that steps many chats; amortised O(1) per call).
_prune_at = 64


class _Notice(threading.Event):
    """A weak-referenceable Event; ``cancelling`` when a cancel (not only a halt) set it."""

    cancelling = False
    #: the chat it is registered for in ``_local`` ("": none yet).
    key = ""
    #: the subscriber that hears this chat's cancels for it (``hear``), and the monotonic
    #: time it started to.
    heard_by: Subscriber | None = None
    heard_since = float("inf")

    def clear(self) -> None:
        self.cancelling = False
        super().clear()

    def covers(self, since: float) -> bool:
        """Whether a cancel of its chat requested after ``since`` sets this notice: it was
        registered with a subscriber by then, whose subscription has stood since."""
        heard_by = self.heard_by
        return heard_by is not None and self.heard_since <= since and heard_by.live_at(since)


def covers(notice: threading.Event | None, since: float) -> bool:
    """``notice.covers(since)`` for a notice of this module's (False for any other Event)."""
    return isinstance(notice, _Notice) and notice.covers(since)


def _wake(notices: list[Any], cancel: bool) -> None:
    for notice in notices:
        if cancel:
            notice.cancelling = True  # a halt lets the model call finish; a cancel stops it
        notice.set()


#: the channel name (under the cancel channels' prefix) of one message for many chats.
MANY = "many"


def _channel(key: str) -> str:
    return redis_client.key("cancel", key)


def listen_locally(chat: Any) -> threading.Event:
    """An Event set whenever this chat is cancelled from this process."""
    notice = _Notice()
    if chat.pk is not None:
        notice.key = chat_key(chat)
        with _lock:
            _local.setdefault(notice.key, weakref.WeakSet()).add(notice)
            _prune()
    return notice


def _prune() -> None:
    """Forget chats with no live notice (called with ``_lock`` held)."""
    global _prune_at
    if len(_local) >= _prune_at:
        for key in [key for key, notices in _local.items() if not notices]:
            del _local[key]
        _prune_at = max(64, 2 * len(_local))


def notify(chat: Any, *, halt: bool = False) -> None:
    """Wake runs of ``chat`` here and, with Redis configured, in other processes (``halt``:
    for a halt, which doesn't stop a model call in flight, rather than a cancel)."""
    key = chat_key(chat)
    with _lock:
        notices = list(_local.get(key, ()))
    _wake(notices, cancel=not halt)
    if redis_client.redis_url():
        try:
            redis_client.client().publish(_channel(key), "halt" if halt else "cancel")
        except Exception:  # the flag is written; a worker will still see it when it polls
            logger.warning("Could not publish the cancel notice for %s", key, exc_info=True)


def notify_many(chat_model: Any, pks: list[Any], *, halt: bool = False) -> None:
    """``notify`` for many chats of ``chat_model`` at once: with Redis configured, one message
    naming them all (every subscriber hears every cancel channel anyway), however many."""
    keys = [chat_name(chat_model, pk) for pk in pks]
    if not keys:
        return
    with _lock:
        notices = [notice for key in keys for notice in _local.get(key, ())]
    _wake(notices, cancel=not halt)
    if redis_client.redis_url():
        payload = json.dumps({"halt": halt, "chats": keys})
        try:
            redis_client.client().publish(_channel(MANY), payload)
        except Exception:  # the flags are written; workers will still see them when they poll
            logger.warning(
                "Could not publish the cancel notice of %d chats", len(keys), exc_info=True
            )


def hear(chat: Any, notice: threading.Event) -> None:
    """While this process runs a verb of ``chat`` (from its claim to its release), have the
    process's one subscriber hear the chat's cancels and set ``notice``: with
    ``AGENTLOOP["REDIS_URL"]`` set, in a worker and in a web process alike (no connection or
    thread of its own). Until ``stop_hearing``, the notice covers the run (``covers``)."""
    if not redis_client.redis_url():
        return
    key = chat_key(chat)
    if getattr(notice, "key", None) != key:  # else listen_locally registered it already
        with _lock, suppress(TypeError):  # a plain Event can't be held weakly: not fanned to
            _local.setdefault(key, weakref.WeakSet()).add(notice)
    try:
        heard_by = subscriber()
    except Exception:
        logger.warning("Cancel notices unavailable; polling only", exc_info=True)
        return
    if isinstance(notice, _Notice):
        notice.heard_since = time.monotonic()
        notice.heard_by = heard_by


def stop_hearing(notice: threading.Event | None) -> None:
    """The verb ``hear`` was for is over: its notice covers nothing more (the next verb's
    checkpoints poll until it hears again)."""
    if isinstance(notice, _Notice):
        notice.heard_by = None


class RedisCancelListener:
    """``hear`` and ``stop_hearing`` around a block: while it runs, this process's one
    subscriber hears cancels of ``chat`` and sets ``notice``."""

    def __init__(self, chat: Any, notice: threading.Event) -> None:
        self.chat = chat
        self.key = chat_key(chat)
        self.channel = _channel(self.key)
        self.notice = notice

    def __enter__(self) -> RedisCancelListener:
        hear(self.chat, self.notice)
        return self

    def __exit__(self, *exc_info: object) -> None:
        stop_hearing(self.notice)


class Subscriber:
    """One pub/sub connection and one thread: every cancel message under ``pattern`` sets
    the notices of its chat's runs in this process."""

    #: seconds between tries to reach Redis again after it went away (doubling up to 5 s).
    retry_first = 0.2
    retry_max = 5.0
    #: seconds between PINGs on the subscription when no message comes; it counts as live
    #: only while a PING's answer came within ``stale_after`` (a connection can die silently).
    ping_every = 1.0
    stale_after = 3.0

    def __init__(self, url: str, channel_prefix: str) -> None:
        import redis  # the optional "redis" extra: only sites that configure Redis need it

        self.channel_prefix = channel_prefix
        self.pattern = _glob_escape(channel_prefix) + "*"
        # A client of its own, so CLIENT LIST names the connection and its process.
        self.client = redis.Redis.from_url(url, socket_keepalive=True, client_name=_client_name())
        self.pubsub = self.client.pubsub()
        self.subscribed = threading.Event()
        #: monotonic times: since when the subscription has stood (None: not now), and when
        #: Redis last answered on it (a message, a confirmation or a PING's answer).
        self.live_since: float | None = None
        self.confirmed_at = float("-inf")
        self._stop = threading.Event()
        self.thread = threading.Thread(
            target=self._run, name="agentloop-cancel-notices", daemon=True
        )
        self.thread.start()

    def live_at(self, since: float) -> bool:
        """Whether the subscription has stood since ``since`` and Redis answered on it lately:
        a cancel published after ``since`` reaches this process."""
        live_since = self.live_since
        return (
            live_since is not None
            and live_since <= since
            and time.monotonic() - self.confirmed_at < self.stale_after
        )

    def _run(self) -> None:
        delay = self.retry_first
        pinged = time.monotonic()
        while not self._stop.is_set():
            try:
                if not self.subscribed.is_set():
                    self.pubsub.psubscribe(self.pattern)
                    self.subscribed.set()
                if time.monotonic() - pinged >= self.ping_every:
                    pinged = time.monotonic()
                    self.pubsub.ping()
                message = self.pubsub.get_message(timeout=self.ping_every)
            except Exception as exc:
                # Not live from here: a cancel published meanwhile is missed (the flag is
                # still read at the next poll, and checkpoints poll again until it's back).
                self.live_since = None
                if self._stop.is_set():
                    return
                # Redis went away: reconnect (redis-py subscribes again on connect). One
                # line per outage (a Redis restart is not a bug); the traceback at debug.
                if delay == self.retry_first:
                    logger.warning(
                        "Cancel notices: Redis unreachable (%s: %s); retrying, and reading "
                        "cancels from the database meanwhile",
                        type(exc).__name__, str(exc).strip().split("\n", 1)[0],
                    )  # fmt: skip
                logger.debug("Cancel notices: Redis unreachable", exc_info=True)
                self._stop.wait(delay)
                delay = min(delay * 2, self.retry_max)
                continue
            delay = self.retry_first
            if not message:
                continue
            kind = message.get("type")
            now = time.monotonic()
            if kind == "psubscribe":  # confirmed, the first time or after a reconnect
                self.live_since = now
            if self.live_since is not None:
                self.confirmed_at = now
            if kind == "pmessage":
                self._deliver(message["channel"], message.get("data"))

    def _deliver(self, channel: bytes | str, data: Any) -> None:
        name = channel.decode() if isinstance(channel, bytes) else channel
        if not name.startswith(self.channel_prefix):
            return
        key = name[len(self.channel_prefix) :]
        if key == MANY:
            self._deliver_many(data)
            return
        with _lock:
            notices = list(_local.get(key, ()))
        _wake(notices, cancel=data not in (b"halt", "halt"))

    def _deliver_many(self, data: Any) -> None:
        try:
            message = json.loads(data)
            keys, cancel = list(message["chats"]), not message.get("halt")
        except (ValueError, TypeError, KeyError):
            logger.warning("Cancel notices: a message for many chats could not be read")
            return
        with _lock:
            notices = [notice for key in keys for notice in _local.get(str(key), ())]
        _wake(notices, cancel=cancel)

    def stop(self) -> None:
        """Stop listening and close the connection (tests; the process's exit does it too)."""
        self._stop.set()
        self.thread.join(timeout=5)
        self.pubsub.close()
        self.client.close()


_subscribers: dict[tuple[str, str], Subscriber] = {}


def stop_subscribers() -> None:
    """Stop this process's subscribers (tests that own their Redis; a worker's exit does it)."""
    with _lock:
        stopping = list(_subscribers.values())
        _subscribers.clear()
    for each in stopping:
        each.stop()


def subscriber() -> Subscriber:
    """This process's subscriber for the configured Redis and prefix, started on first use."""
    url = redis_client.redis_url()
    if url is None:
        raise ValueError("AGENTLOOP['REDIS_URL'] is not set")
    channel_prefix = _channel("")
    found = _subscribers.get((url, channel_prefix))  # every step asks: no lock once it's there
    if found is not None:
        return found
    with _lock:
        found = _subscribers.get((url, channel_prefix))
        if found is None:
            found = _subscribers[(url, channel_prefix)] = Subscriber(url, channel_prefix)
        return found


def _glob_escape(text: str) -> str:
    """``text`` matched literally in a PSUBSCRIBE pattern."""
    return "".join("\\" + char if char in "*?[]\\" else char for char in text)


def _client_name() -> str:
    """Names the connection in CLIENT LIST: whose it is and which process holds it."""
    return f"agentloop-cancel-notices-{os.getpid()}"


def _forget_after_fork() -> None:
    """A forked child starts with no subscriber: the parent's socket and thread stay theirs."""
    global _lock
    _lock = threading.Lock()
    _subscribers.clear()


os.register_at_fork(after_in_child=_forget_after_fork)

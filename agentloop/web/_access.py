"""Who may see or change a chat, and how many live streams one user may hold open.

The owner may see and change their chat; staff may with the model's permissions (``view_``
or ``change_``). Anyone else is told the chat doesn't exist (404, not 403). Every view, the
event stream and the admin share these rules.

Each open stream (the event stream, a ``useChat`` stream or its resume) holds one of its
user's ``EVENTS_STREAMS_PER_USER`` slots, taken by its view before anything is written
(:func:`take_slot`; ``None`` at the cap: the view answers 429), kept alive while its bytes
flow and given back when the response is closed or ends (:func:`stream_slot`, the ``with``
block a streaming view serves its response in). A slot lasts
:func:`slot_seconds` without renewal, so a process that died holding some frees them by
itself. With ``REDIS_URL`` the slots are counted in Redis (a sorted set per user scored by
expiry, on Redis's clock), so the cap holds across every process of a deployment; without
Redis, per process.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase

from ..conf import agentloop_settings, get_chat_model
from ..process import redis_client

__all__ = [
    "OpenStream",
    "StreamSlot",
    "can_change_chat",
    "can_view_chat",
    "get_chat_for_change",
    "get_chat_for_view",
    "slot_seconds",
    "stream_slot",
    "take_slot",
    "too_many_streams",
]


def can_change_chat(user: Any, chat: Any) -> bool:
    """The owner, or staff holding the model's change permission."""
    if chat.owner_id is not None and chat.owner_id == user.pk:
        return True
    opts = chat._meta
    return bool(user.is_staff and user.has_perm(f"{opts.app_label}.change_{opts.model_name}"))


def get_chat_for_change(request: HttpRequest, pk: Any) -> Any:
    """The chat if this user may change it, else 404."""
    chat_model = get_chat_model()
    chat = chat_model.objects.filter(pk=pk).first()
    if chat is None or not can_change_chat(request.user, chat):
        raise Http404("No such chat.")
    return chat


def can_view_chat(user: Any, chat: Any) -> bool:
    """The owner, or staff holding the model's view (or change) permission."""
    if can_change_chat(user, chat):
        return True
    opts = chat._meta
    return bool(user.is_staff and user.has_perm(f"{opts.app_label}.view_{opts.model_name}"))


def get_chat_for_view(request: HttpRequest, pk: Any) -> Any:
    """The chat if this user may see it, else 404."""
    chat = get_chat_model().objects.filter(pk=pk).first()
    if chat is None or not can_view_chat(request.user, chat):
        raise Http404("No such chat.")
    return chat


logger = logging.getLogger(__name__)

# KEYS[1]: the user's slots; ARGV: the slot's token, the cap (-1: renew, never refused), its
# seconds. Expired slots go first; the clock is Redis's, the same for every process.
_TAKE = """
local now = redis.call('TIME')
local t = tonumber(now[1]) + tonumber(now[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', t)
local cap = tonumber(ARGV[2])
if cap >= 0 and not redis.call('ZSCORE', KEYS[1], ARGV[1])
    and redis.call('ZCARD', KEYS[1]) >= cap then
  return 0
end
redis.call('ZADD', KEYS[1], t + tonumber(ARGV[3]), ARGV[1])
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[3])))
return 1
"""

_local_lock = threading.Lock()
#: without Redis: this process's slots, by user: {token: when it expires (monotonic)}.
_local: dict[str, dict[str, float]] = {}


def slot_seconds() -> float:
    """How long a slot lasts without renewal: a stream sends something (a keep-alive at
    least) every ``EVENTS_KEEPALIVE`` seconds and renews its slot then, once a third of this
    has passed."""
    return 3 * agentloop_settings.EVENTS_KEEPALIVE + 10


class StreamSlot:
    """One open stream's place under its user's cap."""

    def __init__(self, user: str, token: str, seconds: float) -> None:
        self.user = user
        self.token = token
        self.seconds = seconds
        self.renewed_at = time.monotonic()
        self.freed = False

    def due(self) -> bool:
        """Whether a third of the slot's life has passed since it was taken or renewed."""
        return not self.freed and time.monotonic() - self.renewed_at >= self.seconds / 3

    def renew(self) -> None:
        """Keep the slot another :func:`slot_seconds` (never refused: the stream is open)."""
        self.renewed_at = time.monotonic()
        try:
            _claim(self.user, self.token, None, self.seconds)
        except Exception:  # the stream goes on; the slot may expire early
            logger.warning("Could not renew a live stream's slot", exc_info=True)

    def hold(self, response: HttpResponseBase) -> HttpResponseBase:
        """``response`` with its content holding the slot until it ends or is closed; a
        response that doesn't stream gives the slot back at once."""
        if not isinstance(response, StreamingHttpResponse):
            self.free()
            return response
        content: Any = response.streaming_content
        held: Any = (
            _AsyncHeld(aiter(content), self)
            if response.is_async
            else _SyncHeld(iter(content), self)
        )
        response.streaming_content = held
        return response

    def free(self) -> None:
        """Give the slot back (once; a failure is logged: the slot then expires)."""
        if self.freed:
            return
        self.freed = True
        try:
            url = redis_client.redis_url()
            if url is None:
                with _local_lock:
                    _local.get(self.user, {}).pop(self.token, None)
            else:
                redis_client.client(url).zrem(_key(self.user), self.token)
        except Exception:
            logger.warning("Could not give back a live stream's slot", exc_info=True)


def _key(user: str) -> str:
    return redis_client.key("streams", f"user:{user}")


def _claim(user: str, token: str, cap: int | None, seconds: float) -> bool:
    url = redis_client.redis_url()
    if url is not None:
        client = redis_client.client(url)
        taken = client.eval(_TAKE, 1, _key(user), token, -1 if cap is None else cap, seconds)
        return bool(taken)
    now = time.monotonic()
    with _local_lock:
        slots = {t: end for t, end in _local.get(user, {}).items() if end > now}
        if cap is not None and token not in slots and len(slots) >= cap:
            _local[user] = slots
            return False
        slots[token] = now + seconds
        _local[user] = slots
        return True


def take_slot(user_pk: Any) -> StreamSlot | None:
    """A slot for a new stream of the user ``user_pk``; None when they have
    ``EVENTS_STREAMS_PER_USER`` open already. Without a cap, a slot that counts nothing."""
    cap = agentloop_settings.EVENTS_STREAMS_PER_USER
    slot = StreamSlot(str(user_pk), uuid.uuid4().hex, slot_seconds())
    if cap is None:
        slot.freed = True  # nothing to renew or give back
        return slot
    return slot if _claim(slot.user, slot.token, cap, slot.seconds) else None


def too_many_streams() -> HttpResponse:
    """The 429 a view answers at the cap (one line)."""
    cap = agentloop_settings.EVENTS_STREAMS_PER_USER
    return HttpResponse(
        f"Too many live streams open: at most {cap} per user. Close one and try again.",
        status=429,
        content_type="text/plain",
    )


class _Held:
    """A stream's content holding its slot: renewed as its bytes pass, given back when the
    content ends or the response is closed (Django calls ``close()``; a generator that never
    started would not run its ``finally``)."""

    def __init__(self, content: Any, slot: StreamSlot) -> None:
        self.content = content
        self.slot = slot

    def close(self) -> None:
        self.slot.free()
        close = getattr(self.content, "close", None)
        if close is not None:
            close()

    def __del__(self) -> None:
        # A server that drops the response without closing it: the slot goes with it.
        self.slot.free()


class _SyncHeld(_Held):
    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        try:
            chunk: bytes = next(self.content)
        except BaseException:
            self.slot.free()
            raise
        if self.slot.due():
            self.slot.renew()
        return chunk


class _AsyncHeld(_Held):
    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        try:
            chunk: bytes = await anext(self.content)
        except BaseException:
            await sync_to_async(self.slot.free, thread_sensitive=False)()
            raise
        if self.slot.due():
            await sync_to_async(self.slot.renew, thread_sensitive=False)()
        return chunk


@dataclass
class OpenStream:
    """What :func:`stream_slot` gives its ``with`` block: the chat (None at the cap, when
    ``response`` is the 429 already), and the response (an ``HttpResponseBase``) the block
    sets."""

    chat: Any
    response: Any = None


@contextmanager
def stream_slot(request: HttpRequest, pk: Any, *, change: bool = False) -> Iterator[OpenStream]:
    """A ``with`` block that serves the chat ``pk``'s stream holding one of the user's live
    stream slots (docs/live-events.md): the block sets ``response``, whose content then holds
    the slot until it ends or is closed (a response that doesn't stream, or an exception,
    gives it back at once). At the cap (``EVENTS_STREAMS_PER_USER`` open already) ``chat`` is
    None and ``response`` the 429, before the chat is read or anything written; then 404
    unless this user may see the chat (with ``change``: change it)."""
    slot = take_slot(request.user.pk)
    if slot is None:
        yield OpenStream(None, too_many_streams())
        return
    read = get_chat_for_change if change else get_chat_for_view
    try:
        opened = OpenStream(read(request, pk))
        yield opened
    except BaseException:
        slot.free()
        raise
    opened.response = slot.hold(opened.response)

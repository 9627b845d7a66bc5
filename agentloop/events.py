"""Live events of a chat (messages as they are saved, answer chunks as they stream).

One small interface, two backends: Redis Streams when ``AGENTLOOP["REDIS_URL"]`` is
set (chunks included; a reader resumes after any event id, so a page that
reconnects misses nothing), else the database (messages and partial answers,
polled; no per-chunk events). Workers publish; the SSE view reads.
"""

from __future__ import annotations

import json
import logging
import time
from abc import ABC, abstractmethod
from functools import lru_cache
from typing import Any

from .conf import agentloop_settings
from .messages import TextDelta, ToolCallDelta

__all__ = [
    "DatabaseEvents",
    "Event",
    "EventBackend",
    "RedisEvents",
    "chat_key",
    "database_events",
    "get_backend",
    "message_payload",
    "publish_chunk",
    "publish_message",
]

Event = dict[str, Any]  # {"id": str, "type": "message" | "chunk" | ..., "data": {...}}

logger = logging.getLogger(__name__)


def chat_key(chat: Any) -> str:
    """``"agentloop.chat:42"``: names the chat across processes."""
    return f"{chat._meta.label_lower}:{chat.pk}"


def message_payload(message: Any) -> dict[str, Any]:
    """What a page needs to show a saved message row."""
    payload: dict[str, Any] = {
        "id": message.pk,
        "role": message.role,
        "content": message.content,
        "status": message.status,
        "is_error": message.is_error,
        "tool_call_id": message.tool_call_id,
    }
    if message.role == "assistant":
        payload["tool_calls"] = [
            {"id": call.pk, "call_id": call.call_id, "name": call.name, "arguments": call.arguments}
            for call in message.tool_calls.all()
        ]
    return payload


class EventBackend(ABC):
    """Where a chat's live events go and are read back from."""

    @abstractmethod
    def publish(self, key: str, type_: str, data: dict[str, Any]) -> None:
        """Record one event for the chat named ``key``."""

    @abstractmethod
    def read(self, key: str, after: str | None, timeout: float) -> list[Event]:
        """Events after id ``after`` (all kept ones when None); waits up to ``timeout``."""


class RedisEvents(EventBackend):
    """Redis Streams: XADD per event (trimmed to ``EVENTS_MAXLEN``), XREAD BLOCK to wait."""

    def __init__(self, url: str, maxlen: int = 1000) -> None:
        import redis

        self.client = redis.Redis.from_url(url)
        self.maxlen = maxlen

    def _stream(self, key: str) -> str:
        return f"agentloop:events:{key}"

    def publish(self, key: str, type_: str, data: dict[str, Any]) -> None:
        payload = json.dumps({"type": type_, "data": data}, default=str)
        self.client.xadd(
            self._stream(key), {"event": payload}, maxlen=self.maxlen, approximate=True
        )

    def read(self, key: str, after: str | None, timeout: float) -> list[Event]:
        answer: Any = self.client.xread(
            {self._stream(key): after or "0-0"}, block=max(1, int(timeout * 1000))
        )
        return self.events_of(answer)

    @staticmethod
    def events_of(answer: Any) -> list[Event]:
        """The events of an XREAD answer."""
        events = []
        for _stream, entries in answer or []:
            for event_id, fields in entries:
                body = json.loads(fields[b"event"])
                events.append({"id": event_id.decode(), **body})
        return events


class DatabaseEvents(EventBackend):
    """No broker: message rows are the events (ids are message ids); polled."""

    poll_interval = 0.25

    def publish(self, key: str, type_: str, data: dict[str, Any]) -> None:
        return None  # the saved rows are the record; chunks are not kept

    def read(self, key: str, after: str | None, timeout: float) -> list[Event]:
        from django.apps import apps

        label, _, pk = key.rpartition(":")
        chat_model: Any = apps.get_model(label)
        deadline = time.monotonic() + timeout
        while True:
            events, _streaming = database_events(chat_model, pk, after)
            if events or time.monotonic() >= deadline:
                return events
            time.sleep(self.poll_interval)


def database_events(
    chat_model: Any, chat_pk: Any, after: str | None, limit: int = 200
) -> tuple[list[Event], Event | None]:
    """Message rows after id ``after`` as events, and the answer streaming now, if any.

    An answer being streamed is a ``partial`` row; rows after it wait until it is
    finished, so a reader resuming after an id never skips it. A partial row that a
    later answer (or partial) follows was abandoned (a crash) and is passed over.
    The streaming answer comes back as a ``partial`` event without an id.
    """
    message_model = chat_model._meta.get_field("messages").related_model
    after_id = int(after) if after and after.isdigit() else 0
    rows = list(
        message_model.objects.filter(chat_id=chat_pk, id__gt=after_id)
        .prefetch_related("tool_calls")
        .order_by("id")[:limit]
    )
    events: list[Event] = []
    for index, row in enumerate(rows):
        if row.status == "partial":
            if any(later.role == "assistant" for later in rows[index + 1 :]):
                continue  # abandoned
            streaming = {"type": "partial", "data": {"id": row.pk, "content": row.content}}
            return events, streaming
        events.append({"id": str(row.pk), "type": "message", "data": message_payload(row)})
    return events, None


@lru_cache(maxsize=4)
def _backend_for(url: str | None, maxlen: int) -> EventBackend:
    return RedisEvents(url, maxlen) if url else DatabaseEvents()


def get_backend() -> EventBackend:
    """The configured backend (Redis when ``REDIS_URL`` is set)."""
    return _backend_for(agentloop_settings.REDIS_URL, int(agentloop_settings.EVENTS_MAXLEN))


def _publish(backend: EventBackend, chat: Any, type_: str, data: dict[str, Any]) -> None:
    # Best effort: the rows are the record, so an unreachable Redis must not fail the step.
    try:
        backend.publish(chat_key(chat), type_, data)
    except Exception:
        logger.warning("Could not publish a %s event of %s", type_, chat_key(chat), exc_info=True)


def publish_message(chat: Any, message: Any) -> None:
    """Announce a saved message (called for every message of a persisted chat)."""
    backend = get_backend()
    if isinstance(backend, DatabaseEvents):
        return
    _publish(backend, chat, "message", message_payload(message))


def publish_chunk(chat: Any, chunk: Any) -> None:
    """Announce a streamed piece of an answer (Redis only; the database keeps partials)."""
    backend = get_backend()
    if isinstance(backend, DatabaseEvents):
        return
    if isinstance(chunk, TextDelta):
        _publish(backend, chat, "chunk", {"text": chunk.text})
    elif isinstance(chunk, ToolCallDelta):
        _publish(backend, chat, "tool_call_delta", chunk.model_dump())

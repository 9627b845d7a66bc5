"""Live events of a chat (messages as they are saved, answer chunks as they stream).

One small interface, two backends: Redis Streams when ``AGENTLOOP["REDIS_URL"]`` is
set (chunks included; a reader resumes after any event id, so a page that
reconnects misses nothing), else the database (messages and partial answers,
polled; no per-chunk events). Workers publish; the SSE view reads. A backend says
what it can do with flags (``keeps_events``), not by its class.
"""

from __future__ import annotations

import json
import logging
import time
from abc import ABC, abstractmethod
from functools import lru_cache
from typing import Any

from asgiref.sync import sync_to_async
from django.apps import apps

from .conf import agentloop_settings
from .messages import PartialOutput, TextDelta, ToolCallDelta
from .process import redis_client, stream_reader
from .process.event_publisher import publisher
from .process.redis_client import chat_key

__all__ = [
    "READ_COUNT",
    "DatabaseEvents",
    "Event",
    "EventBackend",
    "RedisEvents",
    "blocked_reason",
    "chat_key",
    "database_events",
    "delete_events",
    "erase_events",
    "flush",
    "forget_messages",
    "get_backend",
    "message_payload",
    "publish_chunk",
    "publish_message",
    "publish_superseded",
]

Event = dict[str, Any]  # {"id": str, "type": "message" | "chunk" | ..., "data": {...}}

logger = logging.getLogger(__name__)


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
    if message.status == "blocked":
        # A guardrail's block: why, and nothing of a blocked answer (it must not be shown).
        payload["blocked"] = blocked_reason(message)
        if message.role == "assistant":
            payload["content"] = ""
    if message.role == "assistant":
        # The readable thinking (untrusted text: pages show it escaped, collapsed).
        payload["thinking"] = (
            "" if payload.get("blocked") is not None else (getattr(message, "thinking", "") or "")
        )
        # An answer just saved carries its call rows (the store sets them): no query. A
        # blocked answer's calls (never run) are not shown either.
        calls = getattr(message, "_agentloop_tool_calls", None)
        if payload.get("blocked") is not None:
            calls = []
        elif calls is None:
            calls = message.tool_calls.all()
        payload["tool_calls"] = [
            {"id": call.pk, "call_id": call.call_id, "name": call.name, "arguments": call.arguments}
            for call in calls
        ]
        parsed = getattr(message, "parsed", None)
        if parsed is not None and payload.get("blocked") is None:
            payload["parsed"] = parsed  # a with_schema answer's validated structured output
        recall = getattr(message, "recall", None)
        if recall is not None:
            # A chat with_memory: the memories the answer was given (ids and similarity only:
            # their text is the owner's, read where the page may show it).
            payload["recall"] = recall
    return payload


def blocked_reason(message: Any) -> str:
    """Why a guardrail blocked a saved message: "guardrail <name>: <reason>" ("" if unknown)."""
    for outcome in getattr(message, "guardrails", None) or []:
        if isinstance(outcome, dict) and outcome.get("decision") == "blocked":
            return f"guardrail {outcome.get('guardrail', '')}: {outcome.get('reason', '')}"
    return ""


class EventBackend(ABC):
    """Where a chat's live events go and are read back from."""

    #: True: published events are kept and read back (chunks included); False: the saved
    #: rows are the events, and publishing is a no-op.
    keeps_events: bool = False

    @abstractmethod
    def publish(self, key: str, type_: str, data: dict[str, Any]) -> None:
        """Record one event for the chat named ``key``."""

    def destination(self, key: str) -> str:
        """Where the events of the chat named ``key`` go, read when an event is made (so
        settings such as ``REDIS_PREFIX`` are those of its moment); default: ``key``."""
        return key

    def publish_batch(self, events: list[tuple[str, str, dict[str, Any]]]) -> None:
        """Record ``(destination, type, data)`` events in order (this process's publisher
        sends what it queued this way; default: one :meth:`publish` each)."""
        for key, type_, data in events:
            self.publish(key, type_, data)

    @abstractmethod
    def read(self, key: str, after: str | None, timeout: float) -> list[Event]:
        """Events after id ``after`` (all kept ones when None); waits up to ``timeout``."""

    def delete(self, key: str) -> None:
        """Forget the events of the chat named ``key`` (it was deleted)."""
        return None

    def erase(self, keys: list[str], ttl: int) -> None:
        """Forget the events of the erased chats ``keys`` for good: nothing published for
        them in the next ``ttl`` seconds (a step that had not stopped yet) is kept either.
        Default: :meth:`delete` each."""
        for key in keys:
            self.delete(key)

    def drop_messages(self, key: str, message_ids: list[Any]) -> None:
        """Forget the ``message`` events of rows ``message_ids`` of the chat named ``key``
        (their text was erased from the rows); default: nothing is kept, nothing to do."""
        return None

    def aconnect(self) -> Any:
        """A connection for :meth:`aread` in the running event loop (None: none needed).

        The caller closes it with ``await connection.aclose()``.
        """
        return None

    async def aread(
        self, key: str, after: str | None, timeout: float, connection: Any = None
    ) -> list[Event]:
        """:meth:`read`, awaited (default: on a worker thread)."""
        return await sync_to_async(self.read)(key, after, timeout)

    def latest_id(self, key: str, type_: str) -> str:
        """The id of the latest kept event of ``type_`` (backends that keep events)."""
        raise NotImplementedError("backends with keeps_events = True provide latest_id()")


#: the most events one read of a Redis stream returns (XREAD COUNT, XREVRANGE COUNT): a reader
#: that starts from the beginning of a full stream reads it in parts, never all at once.
READ_COUNT = 100


class RedisEvents(EventBackend):
    """Redis Streams: XADD per event (capped, expiring), XREAD BLOCK to wait."""

    keeps_events = True

    def __init__(self, url: str, maxlen: int = 1000, ttl: int | None = None) -> None:
        self.url = url
        self.client = redis_client.client(url)
        self.maxlen = maxlen
        #: seconds a stream lives after its latest event (None: until its chat is deleted).
        self.ttl = ttl

    def stream(self, key: str) -> str:
        """The Redis key of the chat named ``key``'s stream (under ``REDIS_PREFIX``)."""
        return redis_client.key("events", key)

    def publish(self, key: str, type_: str, data: dict[str, Any]) -> None:
        self.publish_batch([(self.stream(key), type_, data)])

    def destination(self, key: str) -> str:
        return self.stream(key)

    def publish_batch(self, events: list[tuple[str, str, dict[str, Any]]]) -> None:
        """One pipeline: an XADD per event (to its stream), in order, then one EXPIRE per
        stream."""
        pipeline = self.client.pipeline(transaction=False)
        streams: dict[str, None] = {}
        for stream, type_, data in events:
            payload = json.dumps({"type": type_, "data": data}, default=str)
            streams[stream] = None  # in order, once each
            pipeline.xadd(stream, {"event": payload}, maxlen=self.maxlen, approximate=True)
        if self.ttl:
            for stream in streams:
                pipeline.expire(stream, self.ttl)  # refreshed by every event: a live chat stays
        pipeline.execute()

    def read(self, key: str, after: str | None, timeout: float) -> list[Event]:
        try:
            answer: Any = self.client.xread(**self._xread_args(key, after, timeout))
        except Exception as exc:
            self._erased(exc)
            time.sleep(timeout)  # as a read that found nothing (no tight loop on a tombstone)
            return []
        return self.events_of(answer)

    def aconnect(self) -> Any:
        """A subscription to the event loop's one shared reader (``process.stream_reader``):
        however many streams are open, the loop reads them on one Redis connection."""
        return stream_reader.subscribe(self.url, READ_COUNT)

    async def aread(
        self, key: str, after: str | None, timeout: float, connection: Any = None
    ) -> list[Event]:
        """The events after ``after``, from the shared reader (``connection``, from
        :meth:`aconnect`), awaited: blocks no thread (an erased chat's tombstone: none)."""
        entries = await connection.read(self.stream(key), after, timeout)
        return self.events_of([(self.stream(key), entries)])

    @staticmethod
    def _erased(exc: Exception) -> None:
        """Raises ``exc`` unless the stream is an erased chat's tombstone: then there are no
        events (a reader still open ends at its next look at the chat row)."""
        if "WRONGTYPE" not in str(exc):
            raise exc

    def _xread_args(self, key: str, after: str | None, timeout: float) -> dict[str, Any]:
        return {
            "streams": {self.stream(key): after or "0-0"},
            "count": READ_COUNT,  # a reader catching up takes the stream a part at a time
            "block": max(1, int(timeout * 1000)),
        }

    def delete(self, key: str) -> None:
        self.client.delete(self.stream(key))

    #: what an erased chat's stream key holds until it expires (not a stream: XADD fails).
    TOMBSTONE = "erased"

    def erase(self, keys: list[str], ttl: int) -> None:
        """Put a tombstone (a plain string, expiring after ``ttl`` seconds) where each
        stream was, in one pipeline per 1,000 keys: a worker's XADD to it fails (its
        publisher drops the event), so no erased chat's stream comes back."""
        for start in range(0, len(keys), 1000):
            pipeline = self.client.pipeline(transaction=False)
            for key in keys[start : start + 1000]:
                pipeline.set(self.stream(key), self.TOMBSTONE, ex=max(1, ttl))
            pipeline.execute()

    def drop_messages(self, key: str, message_ids: list[Any]) -> None:
        """XDEL the stream's ``message`` events of those rows, read a part at a time (a
        tombstone, or no stream, has none)."""
        stream, wanted = self.stream(key), {str(pk) for pk in message_ids}
        found: list[bytes] = []
        lower = "-"
        while True:
            try:
                entries: Any = self.client.xrange(stream, min=lower, max="+", count=READ_COUNT)
            except Exception as exc:
                self._erased(exc)
                return
            for event_id, fields in entries:
                event = json.loads(fields[b"event"])
                data = event.get("data") or {}
                if event.get("type") == "message" and str(data.get("id")) in wanted:
                    found.append(event_id)
            if len(entries) < READ_COUNT:
                break
            lower = "(" + entries[-1][0].decode()
        if found:
            self.client.xdel(stream, *found)

    def latest_id(self, key: str, type_: str) -> str:
        """The id of the latest kept event of ``type_`` ("0-0" when there is none)."""
        stream = self.stream(key)
        upper = "+"
        while True:
            entries: Any = self.client.xrevrange(stream, max=upper, min="-", count=READ_COUNT)
            if not entries:
                return "0-0"
            for event_id, fields in entries:
                if json.loads(fields[b"event"]).get("type") == type_:
                    return str(event_id.decode())
            upper = "(" + entries[-1][0].decode()

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
        message_model.objects.filter(chat_id=chat_pk, id__gt=after_id, superseded_at__isnull=True)
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
def _backend_for(url: str | None, maxlen: int, ttl: int | None) -> EventBackend:
    return RedisEvents(url, maxlen, ttl) if url else DatabaseEvents()


def get_backend() -> EventBackend:
    """The configured backend (Redis when ``REDIS_URL`` is set)."""
    ttl = agentloop_settings.EVENTS_TTL
    return _backend_for(
        redis_client.redis_url(), agentloop_settings.EVENTS_MAXLEN, int(ttl) if ttl else None
    )


def _publish(backend: EventBackend, chat: Any, type_: str, data: dict[str, Any]) -> None:
    # Queued for this process's publisher thread: a slow or unreachable Redis never holds the
    # step (best effort: the rows are the record).
    size = agentloop_settings.EVENTS_QUEUE_SIZE
    publisher().put(backend, backend.destination(chat_key(chat)), type_, data, size)


def flush(timeout: float = 10.0) -> bool:
    """Wait until the events this process published so far are sent to Redis (or given up
    on); False when ``timeout`` seconds passed first. Publishing itself never waits."""
    return publisher().flush(timeout)


def publish_message(chat: Any, message: Any) -> None:
    """Announce a saved message (called for every message of a persisted chat)."""
    backend = get_backend()
    if backend.keeps_events:
        _publish(backend, chat, "message", message_payload(message))


def publish_superseded(chat: Any, message_ids: list[Any]) -> None:
    """Announce messages an edit or a regenerated answer superseded (Redis only: without
    it a page learns of them when it loads the chat again)."""
    backend = get_backend()
    if backend.keeps_events and message_ids:
        _publish(backend, chat, "superseded", {"ids": list(message_ids)})


def publish_chunk(chat: Any, chunk: Any) -> None:
    """Announce a streamed piece of an answer, or a structured answer's partial output
    (Redis only; the database keeps partials)."""
    backend = get_backend()
    if not backend.keeps_events:
        return
    if isinstance(chunk, TextDelta):
        _publish(backend, chat, "chunk", {"text": chunk.text})
    elif isinstance(chunk, ToolCallDelta):
        _publish(backend, chat, "tool_call_delta", chunk.model_dump())
    elif isinstance(chunk, PartialOutput):
        # The whole value so far: a reader that missed some (or joins late) needs only the
        # latest. Parsed from JSON text, so it is JSON again.
        _publish(backend, chat, "partial_output", {"value": chunk.value})


def erase_events(chat_keys: list[str], ttl: int) -> None:
    """Forget the events of erased chats (named by ``chat_key``) for good
    (:meth:`EventBackend.erase`), this process's queued ones included."""
    backend = get_backend()
    for key in chat_keys:
        publisher().discard(backend, backend.destination(key))
    backend.erase(chat_keys, ttl)


def forget_messages(messages_by_chat: dict[str, list[Any]]) -> None:
    """Forget the ``message`` events of some rows whose text was erased, by chat (named by
    ``chat_key``): a page that reconnects reads the rows as they are now."""
    backend = get_backend()
    for key, message_ids in messages_by_chat.items():
        backend.drop_messages(key, message_ids)


def delete_events(chat: Any) -> None:
    """Forget a deleted chat's events, so a later chat given its pk never reads them."""
    backend = get_backend()
    try:
        # None of its queued events may land after the delete.
        publisher().discard(backend, backend.destination(chat_key(chat)))
        backend.delete(chat_key(chat))
    except Exception:  # the stream still expires after EVENTS_TTL
        logger.warning("Could not delete the events of %s", chat_key(chat), exc_info=True)

"""Server-Sent Events of one chat, for live pages (the ``agentloop:events`` view).

Each event is ``id:`` (when it can be resumed from), ``event:`` and one ``data:`` line
of JSON:

- ``message``: a saved message row (``agentloop.events.message_payload``); its id is
  the message id (database backend) or the Redis stream id.
- ``chunk`` / ``tool_call_delta``: a piece of the answer streaming now (Redis only).
- ``partial``: without Redis, the text of the answer streaming now, so far (no id: a
  reader that reconnects gets the latest one again).
- ``state``: the chat's state (idle, queued, running, waiting, stopped, failed),
  whether a cancel is pending, and the tool calls waiting for a person (no id; sent
  first and whenever it changes).

A reader resumes after the ``Last-Event-ID`` header (browsers send it when they
reconnect) or ``?after=``, so it misses nothing. A comment line is sent after
``EVENTS_KEEPALIVE`` seconds of silence, which keeps proxies from closing the
connection and lets a WSGI server notice a reader that left.

Two loops share one reader: :func:`event_stream` (sync, for WSGI and ``runserver``:
one thread per open stream) and :func:`aevent_stream` (async, for ASGI: it waits
with ``asyncio.sleep`` or ``redis.asyncio``, so an open stream blocks no thread).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.db.models import Exists, OuterRef
from django.http import HttpRequest, StreamingHttpResponse

from .conf import agentloop_settings
from .events import Event, RedisEvents, chat_key, database_events, get_backend

__all__ = [
    "KEEPALIVE",
    "ChatEventReader",
    "aevent_stream",
    "event_stream",
    "format_event",
    "requested_position",
    "resume_point",
    "stream_response",
]

#: a comment line: readers ignore it; it keeps the connection (and its proxies) open.
KEEPALIVE = b": keep-alive\n\n"
#: sent first: how long a browser waits before reconnecting (milliseconds).
RETRY = b"retry: 2000\n\n"
_POSITION = re.compile(r"^\d{1,20}(-\d{1,20})?$")
_ERROR_SHOWN = 1000  # characters of a failed chat's error sent to the page


def format_event(type_: str, data: Any, event_id: str | None = None) -> bytes:
    """One event in the wire format: ``id:`` (if any), ``event:``, ``data:`` (JSON)."""
    lines = [f"id: {event_id}"] if event_id is not None else []
    lines.append(f"event: {type_}")
    lines.append("data: " + json.dumps(data, default=str, separators=(",", ":")))
    return ("\n".join(lines) + "\n\n").encode()


def requested_position(request: HttpRequest) -> str | None:
    """Where a reader resumes: the ``Last-Event-ID`` header, else ``?after=``."""
    value = request.headers.get("Last-Event-ID") or request.GET.get("after") or ""
    value = value.strip()
    return value if _POSITION.match(value) else None


class ChatEventReader:
    """One reader's position in one chat's events, and what it last told the page.

    The reads are plain synchronous ORM calls; the async loop runs them with
    ``sync_to_async``.
    """

    def __init__(self, chat: Any, after: str | None) -> None:
        self.chat_model: Any = type(chat)
        self.chat_pk = chat.pk
        self.key = chat_key(chat)
        self.after = after
        self.backend = get_backend()
        #: the chat was deleted: the stream ends.
        self.gone = False
        self._state: dict[str, Any] | None = None
        self._streaming: Event | None = None

    @property
    def uses_redis(self) -> bool:
        return isinstance(self.backend, RedisEvents)

    def poll(self) -> list[bytes]:
        """The chat's state, and its new messages when there is no Redis (one or two queries).

        The state is read first: a run saves its messages before it releases the
        chat, so a state read before the messages never runs ahead of them.
        """
        state = self._read_state()
        frames = [] if self.uses_redis else self._read_messages()
        if state is not None:
            frames.append(state)
        return frames

    def frames_for(self, events: list[Event]) -> list[bytes]:
        """Events read from Redis, in the wire format; the position moves past them."""
        frames = []
        for event in events:
            frames.append(format_event(event["type"], event.get("data", {}), event["id"]))
            self.after = event["id"]
        return frames

    def _read_messages(self) -> list[bytes]:
        events, streaming = database_events(self.chat_model, self.chat_pk, self.after)
        frames = self.frames_for(events)
        if streaming is not None and streaming != self._streaming:
            frames.append(format_event("partial", streaming["data"]))
        self._streaming = streaming
        return frames

    def _read_state(self) -> bytes | None:
        call_model = self.chat_model._meta.get_field("tool_calls").related_model
        waiting = call_model.objects.filter(chat_id=OuterRef("pk"), state="waiting")
        row = (
            self.chat_model.objects.filter(pk=self.chat_pk)
            .annotate(has_waiting=Exists(waiting))
            .values(
                "state",
                "error",
                "stop_reason",
                "cancel_requested_at",
                "has_waiting",
                "updated_at",
            )  # fmt: skip
            .first()
        )
        if row is None:
            self.gone = True
            return None
        pending: list[dict[str, Any]] = []
        if row["has_waiting"]:
            pending = list(
                call_model.objects.filter(chat_id=self.chat_pk, state="waiting")
                .order_by("id")
                .values("id", "call_id", "name", "arguments", "wait_reason", "question")
            )
        state = {
            "state": row["state"],
            "cancel_requested": row["cancel_requested_at"] is not None,
            "error": row["error"][-_ERROR_SHOWN:],
            "stop_reason": row["stop_reason"],
            "pending": pending,
            # Every run takes and releases the chat, which bumps this: a whole run that
            # starts and ends between two polls (idle -> ... -> idle) still shows as a change.
            "changed_at": row["updated_at"].isoformat() if row["updated_at"] else None,
        }
        if state == self._state:
            return None
        self._state = state
        return format_event("state", state)


def _settings() -> tuple[float, float]:
    return (
        max(0.01, float(agentloop_settings.EVENTS_POLL_INTERVAL)),
        max(0.01, float(agentloop_settings.EVENTS_KEEPALIVE)),
    )


def event_stream(chat: Any, after: str | None) -> Iterator[bytes]:
    """The events of ``chat`` after position ``after``, forever (sync: holds its thread)."""
    reader = ChatEventReader(chat, after)
    interval, keepalive = _settings()
    yield RETRY
    quiet_since = time.monotonic()
    next_poll = 0.0
    while True:
        frames: list[bytes] = []
        if time.monotonic() >= next_poll:
            frames += reader.poll()
            next_poll = time.monotonic() + interval
            if reader.gone:
                return
        if reader.uses_redis:
            wait = max(0.001, next_poll - time.monotonic())
            frames += reader.frames_for(reader.backend.read(reader.key, reader.after, wait))
        if frames:
            yield b"".join(frames)
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= keepalive:
            yield KEEPALIVE
            quiet_since = time.monotonic()
        if not reader.uses_redis:
            time.sleep(max(0.0, next_poll - time.monotonic()))


async def aevent_stream(chat: Any, after: str | None) -> AsyncIterator[bytes]:
    """The events of ``chat`` after position ``after``, forever (async: blocks no thread)."""
    reader = ChatEventReader(chat, after)
    interval, keepalive = _settings()
    redis_client = _async_redis() if reader.uses_redis else None
    try:
        yield RETRY
        quiet_since = time.monotonic()
        next_poll = 0.0
        while True:
            frames: list[bytes] = []
            if time.monotonic() >= next_poll:
                frames += await sync_to_async(reader.poll)()
                next_poll = time.monotonic() + interval
                if reader.gone:
                    return
            if redis_client is not None:
                wait = max(0.001, next_poll - time.monotonic())
                events = await _aread(redis_client, reader, wait)
                frames += reader.frames_for(events)
            if frames:
                yield b"".join(frames)
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since >= keepalive:
                yield KEEPALIVE
                quiet_since = time.monotonic()
            if redis_client is None:
                await asyncio.sleep(max(0.0, next_poll - time.monotonic()))
    finally:
        if redis_client is not None:
            await redis_client.aclose()


def _async_redis() -> Any:
    import redis.asyncio

    return redis.asyncio.Redis.from_url(agentloop_settings.REDIS_URL)


async def _aread(client: Any, reader: ChatEventReader, timeout: float) -> list[Event]:
    """XREAD BLOCK on the chat's stream, awaited (the async twin of ``RedisEvents.read``)."""
    backend: Any = reader.backend
    answer = await client.xread(
        {backend._stream(reader.key): reader.after or "0-0"}, block=max(1, int(timeout * 1000))
    )
    return RedisEvents.events_of(answer)


def resume_point(chat: Any) -> str:
    """The position a page rendered now should read events after.

    Without Redis: the id of the latest message before any answer still streaming
    (the stream then sends that answer as it grows). With Redis: the id of the latest
    ``message`` event, so the chunks of an answer streaming now are sent from its start.
    Read it before reading the messages the page shows: anything saved in between
    is then sent again rather than missed (pages key messages by id).
    """
    backend = get_backend()
    if isinstance(backend, RedisEvents):
        return _last_message_event_id(backend, chat_key(chat))
    message_model = type(chat)._meta.get_field("messages").related_model
    rows = message_model.objects.filter(chat_id=chat.pk).order_by("-id")
    streaming = rows.filter(status="partial").values_list("id", flat=True).first()
    if streaming is not None:
        # An abandoned partial (an answer follows it) is passed over, as in the stream.
        if not rows.filter(id__gt=streaming, role="assistant").exists():
            rows = rows.filter(id__lt=streaming)
    last = rows.values_list("id", flat=True).first()
    return str(last or 0)


def _last_message_event_id(backend: RedisEvents, key: str) -> str:
    stream = backend._stream(key)
    upper = "+"
    while True:
        entries: Any = backend.client.xrevrange(stream, max=upper, min="-", count=100)
        if not entries:
            return "0-0"
        for event_id, fields in entries:
            if json.loads(fields[b"event"]).get("type") == "message":
                return str(event_id.decode())
        upper = "(" + entries[-1][0].decode()


def stream_response(request: HttpRequest, chat: Any) -> StreamingHttpResponse:
    """The ``text/event-stream`` response: async under ASGI, sync under WSGI."""
    after = requested_position(request)
    content: Iterator[bytes] | AsyncIterator[bytes]
    if isinstance(request, ASGIRequest):
        content = aevent_stream(chat, after)
    else:
        content = event_stream(chat, after)
    response = StreamingHttpResponse(content, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass events on as they come
    return response

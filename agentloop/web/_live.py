"""Server-Sent Events of one chat, for live pages (the ``agentloop:events`` view).

Each event is ``id:`` (when it can be resumed from), ``event:`` and one ``data:`` line
of JSON:

- ``message``: a saved message row (``agentloop.live_events.message_payload``); its id is
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
connection and lets a WSGI server notice a reader that left. Every
``EVENTS_REAUTH_SECONDS`` the stream checks again that its reader may see the chat
(still logged in, active, allowed) and ends when not; a reconnect is a new request,
checked like any other.

The loop is written once (:func:`_steps`, which only says what to do next) and run
by two drivers: :func:`event_stream` (sync, for WSGI and ``runserver``: one thread
per open stream) and :func:`aevent_stream` (async, for ASGI: it waits with
``asyncio.sleep`` or ``redis.asyncio``, so an open stream blocks no thread).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.contrib import auth
from django.core.handlers.asgi import ASGIRequest
from django.db.models import Exists, OuterRef
from django.http import HttpRequest, StreamingHttpResponse

from ..conf import agentloop_settings
from ..live_events import Event, chat_key, database_events, get_backend
from ._access import can_view_chat
from ._stream_drivers import KEEPALIVE, SEND, Pace, Step, adrive, drive, shared_reads

__all__ = [
    "CUT_MARK",
    "KEEPALIVE",
    "ChatEventReader",
    "ReaderAccess",
    "aevent_stream",
    "cut_to_fit",
    "event_stream",
    "format_event",
    "requested_position",
    "resume_point",
    "stream_response",
]

#: a comment line: readers ignore it; it keeps the connection (and its proxies) open.
#: sent first: how long a browser waits before reconnecting (milliseconds).
RETRY = b"retry: 2000\n\n"
_POSITION = re.compile(r"^\d{1,20}(-\d{1,20})?$")
_ERROR_SHOWN = 1000  # characters of a failed chat's error sent to the page


def format_event(
    type_: str, data: Any, event_id: str | None = None, *, max_bytes: int | None = None
) -> bytes:
    """One event in the wire format: ``id:`` (if any), ``event:``, ``data:`` (JSON).

    With ``max_bytes``, data whose JSON is longer is sent cut to fit (:func:`cut_to_fit`)."""
    lines = [f"id: {event_id}"] if event_id is not None else []
    lines.append(f"event: {type_}")
    body = _json(data)
    if max_bytes is not None and len(body) > max_bytes:
        body = _json(cut_to_fit(data, max_bytes))
    lines.append("data: " + body)
    return ("\n".join(lines) + "\n\n").encode()


def _json(data: Any) -> str:
    return json.dumps(data, default=str, separators=(",", ":"))


#: what ends a text cut to fit ``EVENTS_MAX_BYTES`` (the whole text is in the database).
CUT_MARK = " … [truncated]"
#: texts are not cut shorter than this (ids, roles and states stay whole); when that is not
#: enough, only the event's identifying fields are sent.
_KEPT_CHARACTERS = 100
#: the fields kept when even cut texts don't fit: what a page needs to find the row again.
_IDENTIFYING = ("id", "role", "status", "tool_call_id", "call_id", "name")


def cut_to_fit(data: Any, max_bytes: int) -> dict[str, Any]:
    """``data`` (an event's dict) with ``"truncated": true`` and its longest texts cut, each
    ending in :data:`CUT_MARK`, so that its JSON fits in ``max_bytes``; when cutting texts
    down to ``_KEPT_CHARACTERS`` is not enough, only its identifying fields."""
    source = data if isinstance(data, dict) else {}
    longest = max(_text_lengths(source), default=0)

    def fits(keep: int) -> bool:
        return len(_json(_cut(source, keep))) <= max_bytes

    # A text longer than max_bytes can't fit whole, so the search starts below that: each
    # try serialises a bounded payload, however large the event.
    low, high = _KEPT_CHARACTERS, min(longest, max_bytes)
    if high < low or not fits(low):
        return {
            **{key: source[key] for key in _IDENTIFYING if _is_scalar(source.get(key))},
            "truncated": True,
        }
    while low < high:  # the longest cut that fits
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return _cut(source, low)


def _text_lengths(value: Any) -> Iterator[int]:
    if isinstance(value, str):
        yield len(value)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _text_lengths(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _text_lengths(item)


def _cut(data: dict[str, Any], keep: int) -> dict[str, Any]:
    def cut(value: Any) -> Any:
        if isinstance(value, str):
            return value if len(value) <= keep else value[:keep] + CUT_MARK
        if isinstance(value, dict):
            return {key: cut(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [cut(item) for item in value]
        return value

    return {**cut(data), "truncated": True}


def _is_scalar(value: Any) -> bool:
    return value is not None and isinstance(value, str | int | float | bool)


def requested_position(request: HttpRequest) -> str | None:
    """Where a reader resumes: the ``Last-Event-ID`` header, else ``?after=``."""
    value = request.headers.get("Last-Event-ID") or request.GET.get("after") or ""
    value = value.strip()
    return value if _POSITION.match(value) else None


class ReaderAccess:
    """Who reads a stream, checked again every ``EVENTS_REAUTH_SECONDS`` while it is open.

    Access holds while the request's session still logs in the same active user (a
    logout deletes it) and that user may still see the chat (``can_view_chat``:
    owner, or staff with the permission). Without a session the user row is read.
    """

    def __init__(self, request: HttpRequest, chat: Any) -> None:
        self.user_pk: Any = request.user.pk
        session = getattr(request, "session", None)
        self.session_class: Any = type(session) if session is not None else None
        self.session_key: str | None = session.session_key if session is not None else None
        self.chat_model: Any = type(chat)
        self.chat_pk = chat.pk
        self.every = max(0.0, agentloop_settings.EVENTS_REAUTH_SECONDS)
        self.checked_at = time.monotonic()

    def due(self) -> bool:
        """True once ``EVENTS_REAUTH_SECONDS`` have passed since the last check."""
        return time.monotonic() - self.checked_at >= self.every

    def allowed(self) -> bool:
        """Whether the reader may still see the chat (a few queries)."""
        self.checked_at = time.monotonic()
        user = self._user()
        if user is None or not user.is_active:
            return False
        chat = self.chat_model.objects.filter(pk=self.chat_pk).first()
        return chat is not None and can_view_chat(user, chat)

    def _user(self) -> Any:
        if self.session_key is not None:
            probe = HttpRequest()  # auth.get_user() reads only the request's session
            probe.session = self.session_class(self.session_key)
            user = auth.get_user(probe)
            return user if user.is_authenticated and user.pk == self.user_pk else None
        return auth.get_user_model()._default_manager.filter(pk=self.user_pk).first()


class ChatEventReader:
    """One reader's position in one chat's events, and what it last told the page.

    The reads are plain synchronous ORM calls; the async driver runs them with
    ``sync_to_async``.
    """

    def __init__(self, chat: Any, after: str | None, access: ReaderAccess | None = None) -> None:
        self.chat_model: Any = type(chat)
        self.chat_pk = chat.pk
        self.key = chat_key(chat)
        self.after = after
        self.backend = get_backend()
        self.access = access
        #: the largest event data sent whole (``EVENTS_MAX_BYTES``); larger is cut to fit.
        self.max_bytes = agentloop_settings.EVENTS_MAX_BYTES
        #: the chat was deleted, or its reader may no longer see it: the stream ends.
        self.gone = False
        self._state: dict[str, Any] | None = None
        self._streaming: Event | None = None
        #: when the stream began: it shares no read made before (``shared_reads``).
        self.began = time.monotonic()

    @property
    def keeps_events(self) -> bool:
        """The backend keeps events (Redis): they are read from it, not from the rows."""
        return self.backend.keeps_events

    def poll(self) -> list[bytes]:
        """The chat's state, and its new messages when there is no Redis (one or two queries).

        The state is read first: a run saves its messages before it releases the
        chat, so a state read before the messages never runs ahead of them.
        """
        state = self._read_state()
        frames = [] if self.keeps_events else self._read_messages()
        if state is not None:
            frames.append(state)
        return frames

    def access_due(self) -> bool:
        """Whether the reader's access is due for a check (no query)."""
        return self.access is not None and self.access.due()

    def still_allowed(self) -> bool:
        """Whether what was read may be sent (a few queries): checked when due, after the
        reads, so nothing read after a logout or a lost permission reaches the reader."""
        if self.access is not None and not self.access.allowed():
            self.gone = True
        return not self.gone

    def frames_for(self, events: list[Event]) -> list[bytes]:
        """Events read from Redis, in the wire format; the position moves past them."""
        frames = []
        for event in events:
            data = event.get("data", {})
            frames.append(format_event(event["type"], data, event["id"], max_bytes=self.max_bytes))
            self.after = event["id"]
        return frames

    def _read_messages(self) -> list[bytes]:
        events, streaming = database_events(self.chat_model, self.chat_pk, self.after)
        frames = self.frames_for(events)
        if streaming is not None and streaming != self._streaming:
            frames.append(format_event("partial", streaming["data"], max_bytes=self.max_bytes))
        self._streaming = streaming
        return frames

    def _read_state(self) -> bytes | None:
        # Shared with the process's other streams of this chat (one read per half interval).
        key = ("events", self.chat_model._meta.label_lower, self.chat_pk)
        max_age = agentloop_settings.EVENTS_POLL_INTERVAL / 2
        state = shared_reads.get(key, max_age, self._chat_state, self.began)
        if state is None:
            self.gone = True
            return None
        if state == self._state:
            return None
        self._state = state
        return format_event("state", state, max_bytes=self.max_bytes)

    def _chat_state(self) -> dict[str, Any] | None:
        """The chat's state as a page is told it (None: the chat is gone); one or two queries."""
        call_model = self.chat_model._meta.get_field("tool_calls").related_model
        waiting = call_model.objects.filter(chat_id=OuterRef("pk"), state="waiting")
        row = (
            self.chat_model.objects.filter(pk=self.chat_pk)
            .annotate(has_waiting=Exists(waiting))
            .values(
                "state",
                "error",
                "stop_reason",
                "waiting_for",
                "cancel_requested_at",
                "has_waiting",
                "updated_at",
            )  # fmt: skip
            .first()
        )
        if row is None:
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
            # A background step waiting for a rate limit ("" otherwise).
            "waiting_for": row["waiting_for"] if row["state"] == "queued" else "",
            "pending": pending,
            # Every run takes and releases the chat, which bumps this: a whole run that
            # starts and ends between two polls (idle -> ... -> idle) still shows as a change.
            "changed_at": row["updated_at"].isoformat() if row["updated_at"] else None,
        }
        return state


def _settings() -> tuple[float, float]:
    return (
        max(0.01, agentloop_settings.EVENTS_POLL_INTERVAL),
        max(0.01, agentloop_settings.EVENTS_KEEPALIVE),
    )


# What the loop asks its driver to do besides SEND (the answer is sent back into the loop).
_POLL = "poll"  # run reader.poll(); answer: its frames
_READ = "read"  # read the backend's events, waiting up to this many seconds; answer: events
_ALLOWED = "allowed"  # run reader.still_allowed() before sending; answer: a bool


def _steps(reader: ChatEventReader) -> Generator[Step, Any, None]:
    """The stream's loop, once for both drivers: yields steps, receives their answers."""
    interval, keepalive = _settings()
    yield SEND, RETRY
    pace = Pace(keepalive)
    next_poll = 0.0
    while True:
        frames: list[bytes] = []
        if time.monotonic() >= next_poll:
            frames += yield _POLL, None
            next_poll = time.monotonic() + interval
            if reader.gone:
                return
        if reader.keeps_events:
            wait = max(0.001, next_poll - time.monotonic())
            frames += reader.frames_for((yield _READ, wait))
        # Checked after the reads, whether or not they found anything: a logout before them
        # ends the stream with what they read unsent, and an idle stream ends too. (Only
        # when due: the async driver pays a thread hop for the check.)
        if reader.access_due() and not (yield _ALLOWED, None):
            return
        yield from pace.send(frames, next_poll, reader.keeps_events)


def event_stream(
    chat: Any, after: str | None, access: ReaderAccess | None = None
) -> Iterator[bytes]:
    """The events of ``chat`` after ``after`` until access ends (sync: holds its thread)."""
    reader = ChatEventReader(chat, after, access)
    run: dict[str, Callable[[Any], Any]] = {
        _POLL: lambda _: reader.poll(),
        _ALLOWED: lambda _: reader.still_allowed(),
        _READ: lambda wait: reader.backend.read(reader.key, reader.after, wait),
    }
    yield from drive(_steps(reader), run)


async def aevent_stream(
    chat: Any, after: str | None, access: ReaderAccess | None = None
) -> AsyncIterator[bytes]:
    """The events of ``chat`` after ``after`` until access ends (async: blocks no thread)."""
    reader = ChatEventReader(chat, after, access)
    connection = reader.backend.aconnect() if reader.keeps_events else None
    run: dict[str, Callable[[Any], Any]] = {
        _POLL: lambda _: sync_to_async(reader.poll)(),
        _ALLOWED: lambda _: sync_to_async(reader.still_allowed)(),
        _READ: lambda wait: reader.backend.aread(reader.key, reader.after, wait, connection),
    }
    try:
        async for chunk in adrive(_steps(reader), run):
            yield chunk
    finally:
        if connection is not None:
            await connection.aclose()


def resume_point(chat: Any) -> str:
    """The position a page rendered now should read events after.

    Without Redis: the id of the latest message before any answer still streaming
    (the stream then sends that answer as it grows). With Redis: the id of the latest
    ``message`` event, so the chunks of an answer streaming now are sent from its start.
    Read it before reading the messages the page shows: anything saved in between
    is then sent again rather than missed (pages key messages by id).
    """
    backend = get_backend()
    if backend.keeps_events:
        return backend.latest_id(chat_key(chat), "message")
    message_model = type(chat)._meta.get_field("messages").related_model
    rows = message_model.objects.filter(chat_id=chat.pk).order_by("-id")
    streaming = rows.filter(status="partial").values_list("id", flat=True).first()
    if streaming is not None:
        # An abandoned partial (an answer follows it) is passed over, as in the stream.
        if not rows.filter(id__gt=streaming, role="assistant").exists():
            rows = rows.filter(id__lt=streaming)
    last = rows.values_list("id", flat=True).first()
    return str(last or 0)


def stream_response(request: HttpRequest, chat: Any) -> StreamingHttpResponse:
    """The ``text/event-stream`` response: async under ASGI, sync under WSGI.

    ``request.user`` must be loaded already (the view checked it may see ``chat``).
    """
    after = requested_position(request)
    access = ReaderAccess(request, chat)
    content: Iterator[bytes] | AsyncIterator[bytes]
    if isinstance(request, ASGIRequest):
        content = aevent_stream(chat, after, access)
    else:
        content = event_stream(chat, after, access)
    response = StreamingHttpResponse(content, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass events on as they come
    return response

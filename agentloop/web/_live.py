"""Following a chat live: the event stream (Server-Sent Events) and the ``useChat`` stream.

A page reads a chat's live events (``agentloop.live_events``: Redis, or the database's rows
and partial answers) through one of two readers, each a :class:`LiveReader`:

- :class:`ChatEventReader` serves the ``agentloop:events`` view. Each event is ``id:``
  (when it can be resumed from), ``event:`` and one ``data:`` line of JSON: ``message`` (a
  saved row, ``agentloop.live_events.message_payload``; its id is the message id, or the
  Redis stream id), ``chunk`` / ``tool_call_delta`` (a piece of the answer streaming now;
  Redis only), ``partial`` (without Redis, the text of the answer streaming now, so far; no
  id) and ``state`` (the chat's state, whether a cancel is pending, the calls waiting for a
  person; no id; sent first and whenever it changes). A reader resumes after the
  ``Last-Event-ID`` header (browsers send it when they reconnect) or ``?after=``.
- :class:`RunFollower` serves the ``useChat`` views: the events fed to a
  ``UIStreamTranslator`` (``agentloop.web._ui_protocol``), to the end of the run: the rows
  no event brought yet (events are published after the rows are saved) are read from the
  database, then the closing parts and ``[DONE]``. The AG-UI view's reader
  (``agentloop.web._ag_ui.AgUiFollower``) is one too, with its own translator.

The loop is written once (:func:`_steps`, which only says what to do next) and run by two
drivers: :func:`stream` (sync, for WSGI and ``runserver``: one thread per open stream) and
:func:`astream` (async, for ASGI: it waits with ``asyncio.sleep`` or ``redis.asyncio``, so
an open stream blocks no thread). A comment line is sent after ``EVENTS_KEEPALIVE`` seconds
of silence, which keeps proxies from closing the connection and lets a WSGI server notice a
reader that left. Every ``EVENTS_REAUTH_SECONDS`` the stream checks again that its reader
may see the chat (:class:`ReaderAccess`) and ends when not. The open streams of a process
share their reads of one chat's row (:data:`shared_reads`). A reader that leaves stops only
its stream, never the run.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Generator,
    Hashable,
    Iterator,
)
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.contrib import auth
from django.core.handlers.asgi import ASGIRequest
from django.db.models import Exists, OuterRef, Q
from django.http import HttpRequest, StreamingHttpResponse

from ..conf import agentloop_settings
from ..live_events import Event, chat_key, database_events, get_backend
from ..tools.mcp.elicitation import ELICITATION
from ._access import can_view_chat
from ._translator import Translator
from ._ui_protocol import DONE, HEADERS, encode, row_payload

__all__ = [
    "CUT_MARK",
    "IN_FLIGHT",
    "KEEPALIVE",
    "ChatEventReader",
    "LiveReader",
    "ReaderAccess",
    "RunFollower",
    "SharedReads",
    "astream",
    "cut_to_fit",
    "format_event",
    "requested_position",
    "resume_point",
    "shared_reads",
    "stream",
    "stream_response",
    "streaming_response",
]

T = TypeVar("T")

#: the states of a chat whose run goes on (the ``useChat`` stream ends with anything else).
IN_FLIGHT = ("queued", "running")
#: the step that writes its bytes to the client.
SEND = "send"
#: the step that waits this many seconds.
SLEEP = "sleep"
#: an SSE comment sent after a quiet spell, which keeps proxies from closing the stream.
KEEPALIVE = b": keep-alive\n\n"
Step = tuple[str, Any]
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


class Pace:
    """A stream's sends: what was read, else a keep-alive once it has been quiet for
    ``keepalive`` seconds; then, for a source that keeps no events, a sleep to the next poll."""

    def __init__(self, keepalive: float) -> None:
        self.keepalive = keepalive
        self.quiet_since = time.monotonic()

    def send(
        self, frames: list[bytes], next_poll: float, keeps_events: bool
    ) -> Generator[Step, Any, None]:
        """The steps that send ``frames`` (or a keep-alive) and wait for the next poll."""
        if frames or time.monotonic() - self.quiet_since >= self.keepalive:
            yield SEND, b"".join(frames) if frames else KEEPALIVE
            self.quiet_since = time.monotonic()
        if not keeps_events:
            yield SLEEP, max(0.0, next_poll - time.monotonic())


class SharedReads:
    """What the open streams of a process read of the same chat, read once for all of them
    while it is younger than ``max_age`` seconds: a hundred streams of one chat make the
    queries of one. Values are shared: readers must not change them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[Hashable, tuple[float, Any]] = {}

    def get(self, key: Hashable, max_age: float, read: Callable[[], T], since: float) -> T:
        """The value read under ``key`` less than ``max_age`` seconds ago and not before
        ``since`` (a ``time.monotonic()``: a stream takes nothing read before it began, such
        as a state from before the message it follows), else ``read()``'s (two streams may
        read at once; the later one is kept)."""
        started = time.monotonic()
        with self._lock:
            found = self._values.get(key)
        if found is not None and found[0] >= since and started - found[0] < max_age:
            value: T = found[1]
            return value
        value = read()
        with self._lock:
            # Timed from before the read: it shows the chat as it was then, at the latest.
            self._values[key] = (started, value)
            if len(self._values) > 1000:  # streams come and go: drop what has aged
                for old in [k for k, (at, _) in self._values.items() if started - at >= max_age]:
                    del self._values[old]
        return value


#: the reads this process's streams share.
shared_reads = SharedReads()


class LiveReader(ABC):
    """One reader of one chat's live events: its position, its access, and what the stream's
    loop (:func:`stream`, :func:`astream`) asks of it. Its reads are plain synchronous ORM
    calls; the async driver runs them on a thread."""

    #: what the stream sends first.
    first = b""
    #: the response's headers besides its content type.
    headers: dict[str, str] = {}
    #: :meth:`take` reads rows (the async driver runs it on a thread).
    take_reads_rows = False

    def __init__(self, chat: Any, after: str | None, access: ReaderAccess | None = None) -> None:
        self.chat_model: Any = type(chat)
        self.chat_pk = chat.pk
        self.key = chat_key(chat)
        self.after = after
        self.backend = get_backend()
        self.access = access
        #: the chat was deleted, or its reader may no longer see it: the stream ends.
        self.gone = False
        #: when the stream began: it shares no read made before (``shared_reads``).
        self.began = time.monotonic()

    @property
    def keeps_events(self) -> bool:
        """The backend keeps events (Redis): they are read from it, not from the rows."""
        return self.backend.keeps_events

    @property
    def over(self) -> bool:
        """The stream has said all it will (the state read last ended it)."""
        return False

    @abstractmethod
    def poll(self) -> list[bytes]:
        """What a look at the chat finds: its state and, without Redis, its new rows."""

    @abstractmethod
    def take(self, events: list[Event]) -> list[bytes]:
        """Events read from the backend, in the wire format; the position moves past them."""

    def finish(self) -> list[bytes]:
        """What is sent once the stream is :attr:`over`."""
        return []

    @abstractmethod
    def _chat_state(self) -> dict[str, Any] | None:
        """The chat's state as this kind of reader tells it (None: the chat is gone)."""

    def _read_state(self) -> dict[str, Any] | None:
        """:meth:`_chat_state`, shared with the process's other streams of this chat and
        kind (one read per half poll interval); None, and the stream ends: the chat is gone."""
        key = (type(self).__name__, self.chat_model._meta.label_lower, self.chat_pk)
        max_age = agentloop_settings.EVENTS_POLL_INTERVAL / 2
        state = shared_reads.get(key, max_age, self._chat_state, self.began)
        if state is None:
            self.gone = True
        return state

    def access_due(self) -> bool:
        """Whether the reader's access is due for a check (no query)."""
        return self.access is not None and self.access.due()

    def still_allowed(self) -> bool:
        """Whether what was read may be sent (a few queries): checked when due, after the
        reads, so nothing read after a logout or a lost permission reaches the reader."""
        if self.access is not None and not self.access.allowed():
            self.gone = True
        return not self.gone


class ChatEventReader(LiveReader):
    """The event stream's reader: the chat's events in the wire format of :func:`format_event`,
    and its ``state`` whenever it changes."""

    first = RETRY
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # nginx: pass events on

    def __init__(self, chat: Any, after: str | None, access: ReaderAccess | None = None) -> None:
        super().__init__(chat, after, access)
        #: the largest event data sent whole (``EVENTS_MAX_BYTES``); larger is cut to fit.
        self.max_bytes = agentloop_settings.EVENTS_MAX_BYTES
        self._state: dict[str, Any] | None = None
        self._streaming: Event | None = None

    def poll(self) -> list[bytes]:
        """The chat's state, and its new messages when there is no Redis (one or two queries).

        The state is read first: a run saves its messages before it releases the
        chat, so a state read before the messages never runs ahead of them.
        """
        state = self._state_event()
        frames = [] if self.keeps_events else self._read_messages()
        if state is not None:
            frames.append(state)
        return frames

    def take(self, events: list[Event]) -> list[bytes]:
        """Events read from Redis, in the wire format; the position moves past them."""
        frames = []
        for event in events:
            data = event.get("data", {})
            frames.append(format_event(event["type"], data, event["id"], max_bytes=self.max_bytes))
            self.after = event["id"]
        return frames

    def _read_messages(self) -> list[bytes]:
        events, streaming = database_events(self.chat_model, self.chat_pk, self.after)
        frames = self.take(events)
        if streaming is not None and streaming != self._streaming:
            frames.append(format_event("partial", streaming["data"], max_bytes=self.max_bytes))
        self._streaming = streaming
        return frames

    def _state_event(self) -> bytes | None:
        """The ``state`` event, when the state changed since the last one sent."""
        state = self._read_state()
        if state is None or state == self._state:
            return None
        self._state = state
        return format_event("state", state, max_bytes=self.max_bytes)

    def _chat_state(self) -> dict[str, Any] | None:
        """The chat's state as a page is told it (None: the chat is gone); one or two queries."""
        call_model = self.chat_model._meta.get_field("tool_calls").related_model
        waiting = call_model.objects.filter(Q(state="waiting") | _ASKING, chat_id=OuterRef("pk"))
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
            pending = _with_schemas(
                call_model.objects.filter(Q(state="waiting") | _ASKING, chat_id=self.chat_pk)
                .order_by("id")
                .values(
                    "id", "call_id", "name", "arguments", "wait_reason", "question", "elicitation"
                )
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


class RunFollower(LiveReader):
    """The ``useChat`` stream's reader: one chat's run as the UI message stream, to its end.

    ``after`` is the event position to read after (:func:`resume_point`, read before the
    rows the page was given); ``floor`` the pk of the latest row the page has, or was sent,
    when the stream began: rows above it are the run's. ``head`` is what is sent first (the
    ``start`` part, a replayed turn).
    """

    headers = HEADERS
    take_reads_rows = True
    #: the stream's last line, after the translator's last parts.
    closing = DONE

    def __init__(
        self,
        chat: Any,
        after: str | None,
        translator: Translator,
        floor: int,
        head: list[bytes],
        access: ReaderAccess | None = None,
    ) -> None:
        super().__init__(chat, after, access)
        self.translator = translator
        self.floor = floor
        self.first = b"".join(head)
        #: the chat's latest state: {"state", "error", "stop_reason", "pending"}.
        self.state: dict[str, Any] = {"state": "queued"}

    @classmethod
    def respond(
        cls,
        request: HttpRequest,
        chat: Any,
        after: str | None,
        translator: Translator,
        floor: int,
        head: list[bytes],
    ) -> StreamingHttpResponse:
        """The stream of a reader of this kind for the request's user (its access checked
        again while it is open)."""
        reader = cls(chat, after, translator, floor, head, ReaderAccess(request, chat))
        return streaming_response(request, reader)

    @property
    def over(self) -> bool:
        """The state read last says the run is over."""
        return self.state.get("state") not in IN_FLIGHT

    def poll(self) -> list[bytes]:
        """Read the state, then (database backend) the rows and the answer streaming now.

        The state comes first: a run saves its rows before it lets go of the chat, so a
        state that says "over" was read after every row of the run was saved."""
        self.state = self._read_state() or {}
        if self.gone:
            return []
        if self.keeps_events:
            return self._questions()
        events, streaming = database_events(self.chat_model, self.chat_pk, self.after)
        if events:
            self.after = events[-1]["id"]
        return self.take(events + ([streaming] if streaming else [])) + self._questions()

    def _questions(self) -> list[bytes]:
        """An MCP server's questions, once each, while the run that asks them goes on."""
        asking = [
            call
            for call in self.state.get("pending") or []
            if call.get("wait_reason") == ELICITATION
        ]
        return [encode(chunk) for chunk in self.translator.pending(asking)] if asking else []

    def take(self, events: list[Event]) -> list[bytes]:
        """Translate events (a denied call's result is looked up: the page shows it apart)."""
        frames: list[bytes] = []
        for event in events:
            if event.get("id") is not None and self.keeps_events:
                self.after = event["id"]
            data = event.get("data") or {}
            if (
                event.get("type") == "message"
                and data.get("role") == "tool"
                and data.get("is_error")
            ):
                event = {**event, "data": {**data, "decision": self._decision(data)}}
            frames += [encode(chunk) for chunk in self.translator.event(event)]
        return frames

    def finish(self) -> list[bytes]:
        """The run is over: its rows not sent yet, the calls waiting for a person, the end."""
        message_model = self.chat_model._meta.get_field("messages").related_model
        rows = (
            message_model.objects.filter(
                chat_id=self.chat_pk, id__gt=self.floor, superseded_at__isnull=True
            )
            .exclude(status="partial")
            .exclude(id__in=self.translator.sent_rows)
            .select_related("tool_call")
            .prefetch_related("tool_calls")
            .order_by("id")
        )
        translator = self.translator
        chunks = []
        for row in rows:
            chunks += translator.event({"type": "message", "data": row_payload(row)})
        chunks += translator.cancel_calls(self._cancelled_calls())
        chunks += translator.pending(self.state.get("pending") or [])
        chunks += self.before_end()
        chunks += translator.end(
            self.state.get("state", ""),
            self.state.get("error", ""),
            self.state.get("stop_reason", ""),
        )
        return [encode(chunk) for chunk in chunks] + ([self.closing] if self.closing else [])

    def before_end(self) -> list[dict[str, Any]]:
        """Parts sent after the run's rows and before its end (none here)."""
        return []

    def _chat_state(self) -> dict[str, Any] | None:
        """The chat's state, error and calls waiting for a person (None: the chat is gone)."""
        call_model = self.chat_model._meta.get_field("tool_calls").related_model
        asking = call_model.objects.filter(_ASKING, chat_id=OuterRef("pk"))
        row = (
            self.chat_model.objects.filter(pk=self.chat_pk)
            .annotate(asking=Exists(asking))
            .values("state", "error", "stop_reason", "asking")
            .first()
        )
        if row is None:
            return None
        row["pending"] = []
        # An MCP server's question is asked while the run goes on (its call is held open).
        if row.pop("asking") or row["state"] == "waiting":
            row["pending"] = _with_schemas(
                call_model.objects.filter(Q(state="waiting") | _ASKING, chat_id=self.chat_pk)
                .order_by("id")
                .values("id", "wait_reason", "question", "elicitation")
            )
        return row

    def _cancelled_calls(self) -> list[int]:
        """The pks of the shown calls a cancel kept from running (no result saved)."""
        if not self.translator.calls:
            return []
        call_model = self.chat_model._meta.get_field("tool_calls").related_model
        return list(
            call_model.objects.filter(
                chat_id=self.chat_pk, pk__in=list(self.translator.calls), state="cancelled"
            )
            .order_by("id")
            .values_list("id", flat=True)
        )

    def _decision(self, data: dict[str, Any]) -> str:
        call_model = self.chat_model._meta.get_field("tool_calls").related_model
        found = call_model.objects.filter(pk=data.get("tool_call_id")).values_list("decision")
        return str((found.first() or ("",))[0])


def _advance(steps: Generator[Step, Any, None], answer: Any) -> Step | None:
    """The stream's next step, or None when it ends."""
    try:
        return steps.send(answer)
    except StopIteration:
        return None


#: a call whose MCP server waits for a person's answer (its run goes on meanwhile).
_ASKING = Q(state="running", wait_reason=ELICITATION)


def _with_schemas(rows: Any) -> list[dict[str, Any]]:
    """Pending calls as a page is told them: an MCP server's question with the ``schema``
    of the answer it asks for (the rest of the row's ``elicitation`` stays on the server)."""
    pending = []
    for row in rows:
        asked = row.pop("elicitation", None)
        if row.get("wait_reason") == ELICITATION and isinstance(asked, dict):
            row["schema"] = asked.get("schema") or {}
        pending.append(row)
    return pending


# What the loop asks its driver to do besides SEND (the answer is sent back in; a SEND's
# answer is not read): SLEEP, and
_POLL = "poll"  # reader.poll(); answer: frames
_READ = "read"  # read the backend's events, waiting up to this many seconds; answer: events
_TAKE = "take"  # reader.take(events); answer: frames
_FINISH = "finish"  # reader.finish(); answer: frames
_ALLOWED = "allowed"  # reader.still_allowed() before sending; answer: a bool


def _steps(reader: LiveReader) -> Generator[Step, Any, None]:
    """The stream's loop, once for every reader and both drivers: yields steps, receives
    their answers."""
    interval = max(0.01, agentloop_settings.EVENTS_POLL_INTERVAL)
    keepalive = max(0.01, agentloop_settings.EVENTS_KEEPALIVE)
    yield SEND, reader.first
    pace = Pace(keepalive)
    next_poll = 0.0
    while True:
        frames: list[bytes] = []
        polled = False
        if time.monotonic() >= next_poll:
            frames += yield _POLL, None
            next_poll = time.monotonic() + interval
            polled = True
            if reader.gone:
                return
        if reader.keeps_events:
            ending = polled and reader.over
            events = yield _READ, 0.001 if ending else max(0.001, next_poll - time.monotonic())
            if events:
                frames += yield _TAKE, events
        # Checked after the reads, whether or not they found anything: a logout before them
        # ends the stream with what they read unsent, and an idle stream ends too. (Only
        # when due: the async driver pays a thread hop for the check.)
        if reader.access_due() and not (yield _ALLOWED, None):
            return
        if polled and reader.over:
            # Every row of the run was saved before the state said so (read above).
            yield SEND, b"".join(frames + (yield _FINISH, None))
            return
        yield from pace.send(frames, next_poll, reader.keeps_events)


def stream(reader: LiveReader) -> Iterator[bytes]:
    """The reader's stream, sync (WSGI: holds its thread while it waits): its bytes, each
    other step done in this thread."""
    run: dict[str, Callable[[Any], Any]] = {
        SLEEP: time.sleep,
        _POLL: lambda _: reader.poll(),
        _READ: lambda wait: reader.backend.read(reader.key, reader.after, wait),
        _TAKE: reader.take,
        _FINISH: lambda _: reader.finish(),
        _ALLOWED: lambda _: reader.still_allowed(),
    }
    steps, answer = _steps(reader), None
    while (step := _advance(steps, answer)) is not None:
        if step[0] == SEND:
            yield step[1]
        else:
            answer = run[step[0]](step[1])


async def astream(reader: LiveReader) -> AsyncIterator[bytes]:
    """The reader's stream, async (ASGI: waits without a thread): its bytes, each other
    step awaited on the event loop."""
    connection = reader.backend.aconnect() if reader.keeps_events else None

    async def take_here(events: list[Event]) -> list[bytes]:
        return reader.take(events)

    run: dict[str, Callable[[Any], Awaitable[Any]]] = {
        SLEEP: asyncio.sleep,
        _POLL: lambda _: sync_to_async(reader.poll)(),
        _READ: lambda wait: reader.backend.aread(reader.key, reader.after, wait, connection),
        _TAKE: sync_to_async(reader.take) if reader.take_reads_rows else take_here,
        _FINISH: lambda _: sync_to_async(reader.finish)(),
        _ALLOWED: lambda _: sync_to_async(reader.still_allowed)(),
    }
    steps, answer = _steps(reader), None
    try:
        while (step := _advance(steps, answer)) is not None:
            if step[0] == SEND:
                yield step[1]
            else:
                answer = await run[step[0]](step[1])
    finally:
        if connection is not None:
            await connection.aclose()


def streaming_response(request: HttpRequest, reader: LiveReader) -> StreamingHttpResponse:
    """The reader's ``text/event-stream`` response: async under ASGI, sync under WSGI.

    ``request.user`` must be loaded already (the view checked it may see the chat).
    """
    content: Iterator[bytes] | AsyncIterator[bytes]
    content = astream(reader) if isinstance(request, ASGIRequest) else stream(reader)
    response = StreamingHttpResponse(content, content_type="text/event-stream")
    for name, value in reader.headers.items():
        response[name] = value
    return response


def stream_response(request: HttpRequest, chat: Any) -> StreamingHttpResponse:
    """The event stream's response: the events after the position the request asks for."""
    reader = ChatEventReader(chat, requested_position(request), ReaderAccess(request, chat))
    return streaming_response(request, reader)

"""Following a chat's run as a UI message stream (the ``useChat`` views serve it).

A :class:`RunFollower` reads the chat's state and its live events (``agentloop.live_events``:
Redis, or the database's rows and partial answers) and feeds them to a
:class:`~agentloop.web._ui_protocol.UIStreamTranslator`. The stream ends when the run does
(the chat is no longer queued or running): the rows no event brought yet (events are
published after the rows are saved) are read from the database, then the closing parts
and ``[DONE]``. A reader that leaves stops only its stream, never the run.

As in ``agentloop.web._live``, the loop is written once (:func:`_steps`) and run by a sync
driver (WSGI) and an async one (ASGI: it waits with ``asyncio.sleep`` or
``redis.asyncio`` and holds no thread while it waits).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, StreamingHttpResponse

from ..conf import agentloop_settings
from ..live_events import Event, chat_key, database_events, get_backend
from ._live import ReaderAccess
from ._stream_drivers import SEND, Pace, Step, adrive, drive, shared_reads
from ._ui_protocol import DONE, HEADERS, UIStreamTranslator, encode, row_payload

__all__ = ["IN_FLIGHT", "RunFollower", "aui_stream", "ui_stream", "ui_stream_response"]

#: the states of a chat whose run goes on (anything else ends the stream).
IN_FLIGHT = ("queued", "running")


class RunFollower:
    """One reader's view of one chat's run: its position in the events, what it sent.

    ``after`` is the event position to read after (``sse.resume_point``, read before
    the rows the page was given); ``floor`` the pk of the latest row the page has, or
    was sent, when the stream began: rows above it are the run's.
    """

    def __init__(
        self,
        chat: Any,
        after: str | None,
        translator: UIStreamTranslator,
        floor: int,
        head: list[bytes],
        access: ReaderAccess | None = None,
    ) -> None:
        self.chat_model: Any = type(chat)
        self.chat_pk = chat.pk
        self.key = chat_key(chat)
        self.backend = get_backend()
        self.after = after
        self.translator = translator
        self.floor = floor
        #: what is sent first (the ``start`` part, a replayed turn).
        self.head = head
        self.access = access
        #: the chat's latest state: {"state", "error", "stop_reason", "pending"}.
        self.state: dict[str, Any] = {"state": "queued"}
        #: the chat is gone, or its reader may no longer see it: the stream stops.
        self.gone = False
        #: when the stream began (after what the view wrote): it shares no read made before.
        self.began = time.monotonic()

    @property
    def keeps_events(self) -> bool:
        return self.backend.keeps_events

    @property
    def over(self) -> bool:
        """The state read last says the run is over."""
        return self.state.get("state") not in IN_FLIGHT

    def poll(self) -> list[bytes]:
        """Read the state, then (database backend) the rows and the answer streaming now.

        The state comes first: a run saves its rows before it lets go of the chat, so a
        state that says "over" was read after every row of the run was saved."""
        self.state = self._read_state()
        if self.gone or self.keeps_events:
            return []
        events, streaming = database_events(self.chat_model, self.chat_pk, self.after)
        if events:
            self.after = events[-1]["id"]
        return self.take(events + ([streaming] if streaming else []))

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
        chunks += translator.pending(self.state.get("pending") or [])
        chunks += translator.end(
            self.state.get("state", ""),
            self.state.get("error", ""),
            self.state.get("stop_reason", ""),
        )
        return [encode(chunk) for chunk in chunks] + [DONE]

    def access_due(self) -> bool:
        return self.access is not None and self.access.due()

    def still_allowed(self) -> bool:
        if self.access is not None and not self.access.allowed():
            self.gone = True
        return not self.gone

    def _read_state(self) -> dict[str, Any]:
        # Shared with the process's other streams of this chat (one read per half interval).
        key = ("usechat", self.chat_model._meta.label_lower, self.chat_pk)
        max_age = agentloop_settings.EVENTS_POLL_INTERVAL / 2
        row = shared_reads.get(key, max_age, self._chat_state, self.began)
        if row is None:
            self.gone = True
            return {}
        return row

    def _chat_state(self) -> dict[str, Any] | None:
        """The chat's state, error and calls waiting for a person (None: the chat is gone)."""
        row = (
            self.chat_model.objects.filter(pk=self.chat_pk)
            .values("state", "error", "stop_reason")
            .first()
        )
        if row is None:
            return None
        row["pending"] = []
        if row["state"] == "waiting":
            call_model = self.chat_model._meta.get_field("tool_calls").related_model
            row["pending"] = list(
                call_model.objects.filter(chat_id=self.chat_pk, state="waiting")
                .order_by("id")
                .values("id", "wait_reason", "question")
            )
        return row

    def _decision(self, data: dict[str, Any]) -> str:
        call_model = self.chat_model._meta.get_field("tool_calls").related_model
        found = call_model.objects.filter(pk=data.get("tool_call_id")).values_list("decision")
        return str((found.first() or ("",))[0])


# What the loop asks its driver to do (the answer is sent back into the generator).
_POLL = "poll"  # follower.poll(); answer: frames
_READ = "read"  # read the backend's events, waiting up to this many seconds; answer: events
_TAKE = "take"  # follower.take(events); answer: frames
_FINISH = "finish"  # follower.finish(); answer: frames
_ALLOWED = "allowed"  # follower.still_allowed(); answer: a bool


def _steps(follower: RunFollower) -> Generator[Step, Any, None]:
    interval = max(0.01, agentloop_settings.EVENTS_POLL_INTERVAL)
    keepalive = max(0.01, agentloop_settings.EVENTS_KEEPALIVE)
    yield SEND, b"".join(follower.head)
    pace = Pace(keepalive)
    next_poll = 0.0
    while True:
        frames: list[bytes] = []
        polled = False
        if time.monotonic() >= next_poll:
            frames += yield _POLL, None
            next_poll = time.monotonic() + interval
            polled = True
            if follower.gone:
                return
        if follower.keeps_events:
            events = yield (
                _READ,
                0.001 if polled and follower.over else max(0.001, next_poll - time.monotonic()),
            )
            if events:
                frames += yield _TAKE, events
        if follower.access_due() and not (yield _ALLOWED, None):
            return
        if polled and follower.over:
            # Every row of the run was saved before the state said so (read above).
            yield SEND, b"".join(frames + (yield _FINISH, None))
            return
        yield from pace.send(frames, next_poll, follower.keeps_events)


def ui_stream(follower: RunFollower) -> Iterator[bytes]:
    """The stream, sync (WSGI: holds its thread while it waits)."""
    run: dict[str, Callable[[Any], Any]] = {
        _POLL: lambda _: follower.poll(),
        _READ: lambda wait: follower.backend.read(follower.key, follower.after, wait),
        _TAKE: follower.take,
        _FINISH: lambda _: follower.finish(),
        _ALLOWED: lambda _: follower.still_allowed(),
    }
    yield from drive(_steps(follower), run)


async def aui_stream(follower: RunFollower) -> AsyncIterator[bytes]:
    """The stream, async (ASGI: waits without a thread)."""
    connection = follower.backend.aconnect() if follower.keeps_events else None
    run: dict[str, Callable[[Any], Any]] = {
        _POLL: lambda _: sync_to_async(follower.poll)(),
        _READ: lambda wait: follower.backend.aread(follower.key, follower.after, wait, connection),
        _TAKE: lambda events: sync_to_async(follower.take)(events),
        _FINISH: lambda _: sync_to_async(follower.finish)(),
        _ALLOWED: lambda _: sync_to_async(follower.still_allowed)(),
    }
    try:
        async for chunk in adrive(_steps(follower), run):
            yield chunk
    finally:
        if connection is not None:
            await connection.aclose()


def ui_stream_response(request: HttpRequest, follower: RunFollower) -> StreamingHttpResponse:
    """The ``text/event-stream`` response in the UI message stream protocol."""
    content: Iterator[bytes] | AsyncIterator[bytes]
    if isinstance(request, ASGIRequest):
        content = aui_stream(follower)
    else:
        content = ui_stream(follower)
    response = StreamingHttpResponse(content, content_type="text/event-stream")
    for name, value in HEADERS.items():
        response[name] = value
    return response

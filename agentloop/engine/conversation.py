"""The loop's verbs, written once over a :class:`~.store.ChatStore`.

Every verb reads the transcript and decides from it alone, so a chat can be
driven from any process: ``step()`` here, ``step()`` in a Celery worker later.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from ..attachments import attachments_from
from ..conf import agentloop_settings
from ..exceptions import (
    CancelledError,
    ChatBusyError,
    ConfigurationError,
    PendingToolCallsError,
)
from ..messages import Message, ToolCall, ToolCallState
from ..tools import Tool
from .checkpoints import Checkpoints
from .configuration import Configuration
from .model_calls import ModelCalls, PreparedCall
from .people import PeopleInTheLoop
from .store import ChatStore, UsageRecord
from .streaming import StreamCallback
from .tool_runner import ToolRunner
from .transcript import (
    finished,
    is_complete,
    is_waiting,
    next_move,
    pending_round,
)

__all__ = ["CANCELLED_TOOL_RESULT", "Conversation", "PreparedCall", "StreamCallback"]

#: the result given to calls left unanswered by a cancel when the user moves on.
CANCELLED_TOOL_RESULT = "Cancelled by the user before this tool ran."

_EVENTS = (
    "before_message",
    "after_message",
    "before_tool_call",
    "after_tool_result",
    "cancelled",
    "stopped",
)


class Conversation(Configuration, PeopleInTheLoop, ModelCalls):
    """A chat's verbs and configuration over a store.

    ``agentloop.chat()`` returns one over a :class:`~.memory.MemoryStore`; the
    persisted ``Chat`` model drives one over the Django store.
    """

    def __init__(self, store: ChatStore, *, owner: Any = None) -> None:
        self.store = store
        #: what tools see as ``self.context.chat``: the persisted chat, or this object.
        self.owner = owner if owner is not None else self
        self._callbacks: dict[str, list[Callable[..., Any]]] = defaultdict(list)
        self._schema_model: type[BaseModel] | None = None

    def __repr__(self) -> str:
        return f"<Conversation model={self.store.get_config().model!r}>"

    # -- callbacks ----------------------------------------------------------------------
    def on(self, event: str, callback: Callable[..., Any]) -> Conversation:
        """Call ``callback`` on ``event`` (one of the callback names, "cancelled", "stopped")."""
        if event not in _EVENTS:
            raise ConfigurationError(f"Unknown event {event!r}; choose from {', '.join(_EVENTS)}")
        self._callbacks[event].append(callback)
        return self

    def before_message(self, callback: Callable[[], Any]) -> Conversation:
        """Call ``callback()`` before each model call."""
        return self.on("before_message", callback)

    def after_message(self, callback: Callable[[Any], Any]) -> Conversation:
        """Call ``callback(message)`` after each message is added (user, assistant, tool)."""
        return self.on("after_message", callback)

    def before_tool_call(self, callback: Callable[[Any], Any]) -> Conversation:
        """Call ``callback(tool_call)`` before each tool runs."""
        return self.on("before_tool_call", callback)

    def after_tool_result(self, callback: Callable[[Any], Any]) -> Conversation:
        """Call ``callback(result_message)`` after each tool result is saved."""
        return self.on("after_tool_result", callback)

    def _emit(self, event: str, *args: Any) -> None:
        for callback in self._callbacks.get(event, ()):
            callback(*args)

    # -- reading --------------------------------------------------------------------------
    @property
    def messages(self) -> list[Message]:
        """The transcript (engine messages, read fresh)."""
        return self.store.load_transcript()

    def is_complete(self) -> bool:
        """Settled: the latest answer asked for no tools (or there is nothing yet)."""
        return is_complete(self.store.load_transcript())

    def is_waiting(self) -> bool:
        """A pending tool call is held by an approval, a question or a subagent."""
        return is_waiting(self.store.load_transcript())

    def tools(self) -> dict[str, type[Tool]]:
        """The chat's tools by name."""
        return {tool.name: tool for tool in self.store.get_tools()}

    # -- verbs ------------------------------------------------------------------------------
    def cancel(self) -> None:
        """Ask the run to stop at its next checkpoint; works from any thread or process."""
        self.store.request_cancel()

    def ask_later(self, content: str, attachments: Any = None) -> Conversation:
        """Add a user message; no model call. Refuses while tool calls wait for results,
        except calls left by a cancel, which are answered as cancelled first.

        ``attachments``: an :class:`~agentloop.messages.Attachment`, an http(s) or ``data:``
        URL, a ``pathlib.Path``, or a list of them (``AttachmentError`` when one can't be
        sent; checked before anything is written)."""
        limit = agentloop_settings.MAX_ATTACHMENT_BYTES
        files = attachments_from(attachments, max_bytes=None if limit is None else int(limit))
        round_ = pending_round(self.store.load_transcript())
        if self.store.running_elsewhere():
            raise ChatBusyError(
                "A background worker is running this chat; add the message when it is done "
                "(or cancel() the run first)."
            )
        if round_.unanswered:
            if not all(call.state == ToolCallState.CANCELLED for call in round_.unanswered):
                names = ", ".join(f"{call.name} ({call.id})" for call in round_.unanswered)
                raise PendingToolCallsError(
                    f"{len(round_.unanswered)} tool call(s) still wait for results: {names}. "
                    "Run them with run_tools() or complete() before adding a user message."
                )
            for call in round_.unanswered:
                result = Message(
                    role="tool",
                    content=CANCELLED_TOOL_RESULT,
                    tool_call_id=call.id,
                    tool_name=call.name,
                    is_error=True,
                )
                record = self.store.save_tool_result(call, result, ToolCallState.CANCELLED, None)
                self._emit("after_message", record)
        record = self.store.append_message(Message(role="user", content=content, attachments=files))
        self._emit("after_message", record)
        return self

    def generate(self, stream: StreamCallback | None = None) -> Any:
        """Exactly one model call (with retries of that call); appends and returns the answer."""
        with self._run() as checkpoints:
            return self._generate(self._read(checkpoints), stream, checkpoints)

    def run_tools(self) -> list[Any]:
        """Run the pending tool calls and append a result for each; skips answered ones."""
        with self._run() as checkpoints:
            return self._run_tools(self._read(checkpoints), checkpoints)

    def step(self, stream: StreamCallback | None = None) -> Any:
        """Do the next move: run pending tools, else call the model. None when settled or
        waiting. Returns the last message added."""
        with self._run() as checkpoints:
            return self._step(stream, checkpoints)

    def complete(self, stream: StreamCallback | None = None) -> Any:
        """Step until settled or waiting; returns the last message."""
        last: Any = None
        with self._run() as checkpoints:
            while True:
                added = self._step(stream, checkpoints)
                if added is None:
                    break
                last = added
        if last is None:
            transcript = finished(self.store.load_transcript())
            return self.store.native_message(transcript[-1]) if transcript else None
        return last

    def ask(
        self, content: str, stream: StreamCallback | None = None, *, attachments: Any = None
    ) -> Any:
        """``ask_later(content, attachments)`` then ``complete()``; returns the answer."""
        self.ask_later(content, attachments)
        return self.complete(stream)

    # -- internals ---------------------------------------------------------------------------
    @contextmanager
    def _run(self) -> Iterator[Checkpoints]:
        """A run; turns any CancelledError into a recorded one. Its first read (``_read``)
        is the verb's start checkpoint."""
        checkpoints = Checkpoints(self.store, float(agentloop_settings.CANCEL_POLL_INTERVAL))
        try:
            yield checkpoints
        except CancelledError as exc:
            if not exc.recorded:
                self._record_cancel(exc)
            raise

    def _record_cancel(
        self,
        exc: CancelledError,
        *,
        partial: Message | None = None,
        partial_key: Any = None,
        usage: UsageRecord | None = None,
        unanswered: list[ToolCall] | None = None,
    ) -> None:
        requested_at = exc.requested_at if isinstance(exc.requested_at, datetime) else None
        self.store.record_cancellation(
            requested_at,
            partial=partial,
            partial_key=partial_key,
            usage=usage,
            unanswered=unanswered or [],
        )
        exc.recorded = True
        self._emit("cancelled")

    def drop_cancel_request(self, requested_at: datetime | None) -> None:
        """Forget a cancel that came as the turn finished: nothing is left to stop, and left
        set it would stop the next question at once (a newer request is kept)."""
        if requested_at is not None:
            self.store.record_cancellation(
                requested_at, partial=None, partial_key=None, usage=None, unanswered=[]
            )

    def _read(self, checkpoints: Checkpoints) -> list[Message]:
        """The transcript, read together with the cancel flag: the start-of-verb checkpoint."""
        transcript, requested_at = self.store.read_for_step()
        self._observe(checkpoints, requested_at, transcript)
        return transcript

    def _observe(
        self, checkpoints: Checkpoints, requested_at: Any, transcript: list[Message]
    ) -> None:
        """Stop here if cancelled; a round not yet run is marked cancelled, so the next
        ``ask_later`` answers its calls instead of refusing."""
        try:
            checkpoints.observe(requested_at)
        except CancelledError as exc:
            unanswered = [
                call
                for call in pending_round(transcript).unanswered
                if call.state != ToolCallState.WAITING
            ]
            self._record_cancel(exc, unanswered=unanswered)
            raise

    def _step(self, stream: StreamCallback | None, checkpoints: Checkpoints) -> Any:
        transcript, requested_at = self.store.read_for_step()
        move = next_move(transcript)
        if requested_at is not None and move == "done":
            self.drop_cancel_request(requested_at)
            return None
        # Waiting with a cancel requested: the cancel applies to the held round (its calls
        # are marked cancelled), as it would when the chat is resumed later.
        self._observe(checkpoints, requested_at, transcript)
        if move == "tools":
            results = self._run_tools(transcript, checkpoints)
            return results[-1] if results else None
        if move == "generate":
            return self._generate(transcript, stream, checkpoints)
        return None  # done, or waiting for a person or a subagent

    def _tool_map(self) -> dict[str, type[Tool]]:
        return {tool.name: tool for tool in self.store.get_tools()}

    def _run_tools(self, transcript: list[Message], checkpoints: Checkpoints) -> list[Any]:
        round_ = pending_round(transcript)
        if round_.message is None or not round_.unanswered:
            return []
        options = self.store.get_config().tool_options
        if options.concurrency is None and agentloop_settings.TOOL_CONCURRENCY is not None:
            # The chat didn't choose: the project-wide default applies.
            options = options.model_copy(
                update={"concurrency": agentloop_settings.TOOL_CONCURRENCY}
            )
        runner = ToolRunner(
            self.store,
            self._tool_map(),
            options,
            checkpoints,
            self._emit,
            chat=self.owner,
        )
        try:
            return runner.run(round_.message.tool_calls, round_.unanswered)
        except CancelledError as exc:
            left = [call for call in round_.unanswered if call.id not in runner.answered]
            self._record_cancel(exc, unanswered=left)
            raise

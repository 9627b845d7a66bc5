"""The loop's verbs, written once over a :class:`~.store.ChatStore`.

Every verb reads the transcript and decides from it alone, so a chat can be
driven from any process: ``step()`` here, ``step()`` in a Celery worker later.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
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
from . import tracing
from .async_verbs import AsyncVerbs
from .checkpoints import Checkpoints
from .configuring import Configuration
from .control import CANCELLED_TOOL_RESULT, HALTED_PREFIX, Control, HaltedRelease
from .drivers import drive
from .editing import Editing
from .effects import Effects
from .model_calls import ModelCalls, PreparedCall
from .people import PeopleInTheLoop
from .results import MessageT, StepResult
from .store import ChatStore, UsageRecord
from .streaming import StreamCallback
from .tool_runner import ToolRunner
from .transcript import (
    counted_tool_results,
    finished,
    is_complete,
    is_waiting,
    next_move,
    pending_round,
)

__all__ = [
    "CANCELLED_TOOL_RESULT",
    "HALTED_PREFIX",
    "Conversation",
    "PreparedCall",
    "StepResult",
    "StreamCallback",
]

_EVENTS = (
    "before_message",
    "after_message",
    "before_tool_call",
    "after_tool_result",
    "cancelled",
    "stopped",
    "model_fallback",
    "halted",
    "claimed",
    "subagents_waiting",
    "superseded",
    "forked",
)


@dataclass
class _Run:
    """One verb's state: its checkpoints, and the transcript read once and kept up to date."""

    checkpoints: Checkpoints
    single: bool
    transcript: list[Message] | None = None
    next_move: str | None = None
    #: set when a halt stopped the run: the release records it as the chat's stop.
    halted: HaltedRelease | None = None


class Conversation(
    Configuration, PeopleInTheLoop, Control, ModelCalls, Editing, AsyncVerbs[MessageT]
):
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
        """Call ``callback`` on ``event`` (a callback name, "cancelled", "stopped", "halted")."""
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
    def cancel(self) -> bool:
        """Ask the run to stop at its next checkpoint; works from any thread or process.

        True when a run was in progress, queued or waiting for a person; False (and nothing
        is set) when there was none, so a later message never inherits the cancel. A chat
        that waits for a person, which no run holds, has no run to see the flag: its held
        calls are cancelled at once (``cancel_waiting``)."""
        if not self.store.request_cancel():
            return False
        self.cancel_waiting()
        return True

    def ask_later(
        self, content: str, attachments: Any = None, *, if_busy: str | None = None
    ) -> Conversation:
        """Add a user message; no model call. Refuses while tool calls wait for results,
        except calls left by a cancel, which are answered as cancelled first.

        ``attachments``: an :class:`~agentloop.attachments.Attachment`, an http(s) or
        ``data:`` URL, a ``pathlib.Path``, or a list of them (``AttachmentError`` when one
        can't be sent; checked before anything is written).

        ``if_busy`` (default ``AGENTLOOP["IF_BUSY"]``), for a chat another run holds:
        "reject" raises ``ChatBusyError``; "queue" keeps the message and it is added and
        answered, in order, after the current run; "interrupt" cancels the current run at its
        next checkpoint, then answers the message."""
        mode = if_busy or agentloop_settings.IF_BUSY
        if mode not in ("reject", "queue", "interrupt"):
            raise ConfigurationError(
                f"if_busy must be 'reject', 'queue' or 'interrupt', not {mode!r}."
            )
        files = self._attachments(attachments)
        try:
            with self._run(single=True) as run:
                self._ask_later(run, content, files)
        except (ChatBusyError, PendingToolCallsError) as exc:
            # Between two jobs of a background run no one holds the chat, but the run is on:
            # its pending calls are not a reason to refuse a message that can wait its turn.
            between_jobs = isinstance(exc, PendingToolCallsError) and self.store.run_in_progress()
            if mode == "reject" or not (isinstance(exc, ChatBusyError) or between_jobs):
                raise
            if mode == "interrupt":
                self.cancel()
            self.store.queue_message(Message(role="user", content=content, attachments=files))
        return self

    def generate(self, stream: StreamCallback | None = None) -> MessageT:
        """Exactly one model call (with retries of that call); appends and returns the answer."""
        return drive(self._generating(stream), self.store)

    def run_tools(self) -> list[MessageT]:
        """Run the pending tool calls and append a result for each; skips answered ones."""
        return drive(self._running_tools(), self.store)

    def step(self, stream: StreamCallback | None = None) -> MessageT | None:
        """Do the next move: run pending tools, else call the model. None when settled or
        waiting. Returns the last message added."""
        return self.advance(stream).message

    def advance(self, stream: StreamCallback | None = None) -> StepResult:
        """``step()``, returning what happened and what comes next (``StepResult``): what a
        background worker runs, one per job, without reading the transcript again."""
        return drive(self._advancing(stream), self.store)

    def complete(self, stream: StreamCallback | None = None) -> MessageT:
        """Step until settled or waiting; returns the last message."""
        return drive(self._completing(stream), self.store)

    def ask(
        self, content: str, stream: StreamCallback | None = None, *, attachments: Any = None
    ) -> MessageT:
        """``ask_later(content, attachments)`` then ``complete()``; returns the answer."""
        return drive(self._completing(stream, (content, attachments)), self.store)

    # -- the verbs' effects: driven by ``drive`` here, by ``drive_async`` in the async twins ------
    def _generating(self, stream: StreamCallback | None) -> Effects[Any]:
        with self._run(single=True) as run:
            return (yield from self._generate(self._read(run), stream, run))

    def _running_tools(self) -> Effects[list[Any]]:
        with self._run(single=True) as run:
            return (yield from self._run_tools(self._read(run), run))

    def _advancing(self, stream: StreamCallback | None) -> Effects[StepResult]:
        with self._run(single=True) as run:
            added = yield from self._step(stream, run)
        return StepResult(message=added, next_move=run.next_move or "done")

    def _completing(
        self, stream: StreamCallback | None, asked: tuple[str, Any] | None = None
    ) -> Effects[Any]:
        """``complete()``; with ``asked`` (content, attachments) ``ask()``."""
        files = None if asked is None else self._attachments(asked[1])
        with self._run(single=False) as run:
            if asked is not None and files is not None:
                self._ask_later(run, asked[0], files)
            return (yield from self._complete(run, stream))

    # -- internals ---------------------------------------------------------------------------
    @staticmethod
    def _attachments(attachments: Any) -> list[Any]:
        limit = agentloop_settings.MAX_ATTACHMENT_BYTES
        return attachments_from(attachments, max_bytes=None if limit is None else int(limit))

    @contextmanager
    def _run(self, *, single: bool) -> Iterator[_Run]:
        """A verb under the chat's claim: taken first (``ChatBusyError`` when another process
        holds the chat), released by the verb's last write or at its end, with how it ended.
        A CancelledError is recorded on the way out."""
        owns = self.store.claim()
        if owns:
            try:
                # A verb took the chat: configuration that follows code (agents) applies now.
                self._emit("claimed")
            except BaseException as exc:
                self.store.release(None, failure=exc)
                raise
        run = _Run(Checkpoints(self.store, agentloop_settings.CANCEL_POLL_INTERVAL), single)
        try:
            with tracing.verb(self.store, single):
                yield run
        except BaseException as exc:
            if isinstance(exc, CancelledError) and not exc.recorded:
                self._record_cancel(exc)
            if owns:
                # How it ended goes on the chat: cancelled, stopped by a limit, or failed
                # (one line; a lost lease writes nothing).
                self.store.release(None, failure=exc)
            raise
        if owns:
            if run.halted is not None:
                self.store.release(None, failure=run.halted)
            else:
                self.store.release(run.next_move)

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

    def record_cancel(
        self,
        exc: CancelledError,
        *,
        usage: UsageRecord | None = None,
        unanswered: list[ToolCall] | None = None,
    ) -> None:
        """Record a cancel observed outside a verb (a batch poller): the flag cleared, the
        attempt cut short and the calls left unanswered recorded, "cancelled" sent."""
        self._record_cancel(exc, usage=usage, unanswered=unanswered)

    def emit(self, event: str, *args: Any) -> None:
        """Send a conversation event to its callbacks (for workers acting for the chat)."""
        self._emit(event, *args)

    def _read(self, run: _Run) -> list[Message]:
        """The transcript, read once per verb together with the cancel flag (the start
        checkpoint); later steps of the run keep it up to date in memory."""
        if run.transcript is None:
            transcript, requested_at = self.store.read_for_step()
            run.transcript = transcript
            self._observe(run, requested_at)
        else:
            try:
                run.checkpoints.check()
            except CancelledError as exc:
                self._cancel_held(run, exc)
        return run.transcript

    def _observe(self, run: _Run, requested_at: Any) -> None:
        try:
            run.checkpoints.observe(requested_at)
        except CancelledError as exc:
            self._cancel_held(run, exc)

    def _cancel_held(self, run: _Run, exc: CancelledError) -> None:
        """Stop here: a round not yet run, and its calls held for a person, are marked
        cancelled, so the next ``ask_later`` answers its calls instead of refusing."""
        transcript = run.transcript or []
        unanswered = [
            call
            for call in pending_round(transcript).unanswered
            # A call held for a subagent is settled by the subagent's own cancel.
            if call.state != ToolCallState.WAITING or call.wait_reason != "subagent"
        ]
        self._record_cancel(exc, unanswered=unanswered)
        raise exc

    def _ask_later(self, run: _Run, content: str | None, files: list[Any]) -> None:
        """Add the messages queued so far, then ``content`` (None: only the queued ones)."""
        transcript, _ = self.store.read_for_step()
        round_ = pending_round(transcript)
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
                transcript.append(result)
                self._emit("after_message", record)
        # Messages queued earlier go first, in order, taken together: a message sent now (to a
        # chat whose run failed, or waits for its retry, leaving them queued) never overtakes
        # them.
        messages = self.store.take_queued() if self.store.has_queued() else []
        if content is not None:
            messages.append(Message(role="user", content=content, attachments=files))
        # The new turn starts with what was read (no cancel: a user message never inherits one).
        run.transcript = transcript
        for message in messages:
            record = self.store.append_message(message)
            tracing.turn_started(self.store, message)
            transcript.append(message)
            run.next_move = next_move(transcript)
            self._emit("after_message", record)

    def _complete(self, run: _Run, stream: StreamCallback | None) -> Effects[Any]:
        last: Any = None
        while True:
            added = yield from self._step(stream, run)
            if added is not None:
                last = added
            if run.halted is not None:
                break
            if added is None:
                if run.next_move == "wait" and self._drive_subagents(run):
                    continue  # a subagent went on and settled its call: so do we
                break
        if last is None:
            transcript = finished(run.transcript or [])
            return self.store.native_message(transcript[-1]) if transcript else None
        return last

    def _step(self, stream: StreamCallback | None, run: _Run) -> Effects[Any]:
        requested_at = None
        first = run.transcript is None
        if run.transcript is None:
            run.transcript, requested_at = self.store.read_for_step()
        transcript = run.transcript
        move = next_move(transcript)
        if self.store.has_queued() and self._takes_a_message(transcript):
            # Messages sent while another run held the chat: added now, in order.
            self._ask_later(run, None, [])
            transcript, requested_at = run.transcript or transcript, None
            move = next_move(transcript)
        run.next_move = move
        if move in ("done", "wait") and not (move == "wait" and first and requested_at):
            # Nothing to do (a cancel that came as the turn finished is dropped by the
            # release). Waiting with a cancel requested: the cancel applies to the held round.
            return None
        if first:
            self._observe(run, requested_at)
        else:
            self._read(run)
        if move == "tools":
            results = yield from self._run_tools(transcript, run)
            if run.next_move == "generate":
                # A halt asked for during the round stops the run here, in the same step.
                self._halt_if_requested(run)
            return results[-1] if results else None
        if move == "generate":
            if self._halt_if_requested(run):
                return None
            return (yield from self._generate(transcript, stream, run))
        return None

    @staticmethod
    def _takes_a_message(transcript: list[Message]) -> bool:
        """A user message can be added: the turn is settled, or a cancel left its calls."""
        unanswered = pending_round(transcript).unanswered
        return all(call.state == ToolCallState.CANCELLED for call in unanswered)

    def _tool_map(self) -> dict[str, type[Tool]]:
        return {tool.name: tool for tool in self.store.get_tools()}

    def _run_tools(self, transcript: list[Message], run: _Run) -> Effects[list[Any]]:
        round_ = pending_round(transcript)
        if round_.message is None or not round_.unanswered:
            run.next_move = next_move(transcript)
            return []
        options = self.store.get_config().tool_options
        if options.concurrency is None and agentloop_settings.TOOL_CONCURRENCY is not None:
            # The chat didn't choose: the project-wide default applies.
            options = options.model_copy(
                update={"concurrency": agentloop_settings.TOOL_CONCURRENCY}
            )
        limit = self.store.get_config().limits.max_tool_calls
        budget = None if limit is None else max(limit - counted_tool_results(transcript), 0)
        runner = ToolRunner(
            self.store,
            self._tool_map(),
            options,
            run.checkpoints,
            self._emit,
            chat=self.owner,
            release_last=run.single,
            tool_budget=budget,
        )
        try:
            results = yield from runner.run(round_.message.tool_calls, round_.unanswered)
        except CancelledError as exc:
            transcript.extend(runner.messages)
            left = [call for call in round_.unanswered if call.id not in runner.answered]
            self._record_cancel(exc, unanswered=left)
            raise
        # The transcript in memory follows what was written: the next step needs no read.
        transcript.extend(runner.messages)
        run.next_move = next_move(transcript)
        return results

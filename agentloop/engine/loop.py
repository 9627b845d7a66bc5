"""The loop itself: add the user's message, then step (run the pending tools, else call the
model) until the chat is settled, waits for someone, or a halt or limit stops it.

Each verb's body is a generator of effects (:mod:`.effects`): ``drive`` runs it for the sync
verbs, ``drive_async`` for their async twins.
"""

from __future__ import annotations

from typing import Any

from ..attachments import attachments_from
from ..conf import agentloop_settings
from ..exceptions import CancelledError, PendingToolCallsError
from ..messages import Message, ToolCallState
from ..tools import Tool
from . import tracing
from .callbacks import Callbacks
from .control import CANCELLED_TOOL_RESULT, Control
from .effects import Effects
from .guarding import Guards
from .handoffs import RoundHandoffs
from .model_calls import ModelCalls
from .results import StepResult
from .runs import Run, Runs
from .store import ChatStore
from .streaming import StreamCallback
from .tool_runner import ToolRunner
from .transcript_reading import (
    counted_tool_results,
    finished,
    handoffs_in_turn,
    next_move,
    pending_round,
)

__all__ = ["Loop", "checked_attachments"]


def checked_attachments(attachments: Any) -> list[Any]:
    """``attachments`` as a list, each checked against ``MAX_ATTACHMENT_BYTES``."""
    limit = agentloop_settings.MAX_ATTACHMENT_BYTES
    return attachments_from(attachments, max_bytes=None if limit is None else int(limit))


class Loop:
    """One chat's verbs as effects, over its runs, model calls and control.

    ``owner`` is what tools see as ``self.context.chat``."""

    def __init__(
        self,
        store: ChatStore,
        callbacks: Callbacks,
        runs: Runs,
        calls: ModelCalls,
        control: Control,
        *,
        owner: Any,
    ) -> None:
        self.store = store
        self._callbacks = callbacks
        self._runs = runs
        self._calls = calls
        self._control = control
        self._owner = owner

    # -- the verbs' bodies ------------------------------------------------------------------
    def generating(self, stream: StreamCallback | None) -> Effects[Any]:
        """``generate()``: exactly one model call."""
        with self._runs.scope(single=True) as run:
            return (yield from self._calls.generate(self._runs.read(run), stream, run))

    def running_tools(self) -> Effects[list[Any]]:
        """``run_tools()``: the pending round."""
        with self._runs.scope(single=True) as run:
            return (yield from self._run_tools(self._runs.read(run), run))

    def advancing(self, stream: StreamCallback | None) -> Effects[StepResult]:
        """``advance()``: one move, and what comes next."""
        with self._runs.scope(single=True) as run:
            added = yield from self._step(stream, run)
        return StepResult(message=added, next_move=run.next_move or "done")

    def completing(
        self, stream: StreamCallback | None, asked: tuple[str, Any] | None = None
    ) -> Effects[Any]:
        """``complete()``; with ``asked`` (content, attachments) ``ask()``."""
        files = None if asked is None else checked_attachments(asked[1])
        with self._runs.scope(single=False) as run:
            if asked is not None and files is not None:
                self.ask_later(run, asked[0], files)
            return (yield from self._complete(run, stream))

    def finish(self, run: Run, stream: StreamCallback | None) -> Effects[Any]:
        """Step the open ``run`` until the chat settles or waits: ``complete()``'s loop, for a
        verb that wrote its own message first (an edit)."""
        return self._complete(run, stream)

    # -- the moves ----------------------------------------------------------------------------
    def ask_later(self, run: Run, content: str | None, files: list[Any]) -> None:
        """Add the messages queued so far, then ``content`` (None: only the queued ones)."""
        emit = self._callbacks.emit
        transcript = self.store.transcript.load_transcript()
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
                record = self.store.tool_calls.save_tool_result(
                    call, result, ToolCallState.CANCELLED, None
                )
                transcript.append(result)
                emit("after_message", record)
        # Messages queued earlier go first, in order, taken together: a message sent now (to a
        # chat whose run failed, or waits for its retry, leaving them queued) never overtakes
        # them.
        inbox = self.store.inbox
        messages = inbox.take_queued() if inbox is not None and inbox.has_queued() else []
        if content is not None:
            messages.append(Message(role="user", content=content, attachments=files))
        # The new turn starts with what was read (no cancel: a user message never inherits one).
        run.transcript = transcript
        for message in messages:
            record = self.store.transcript.append_message(message)
            tracing.turn_started(self.store, message)
            transcript.append(message)
            run.next_move = next_move(transcript)
            emit("after_message", record)

    def _complete(self, run: Run, stream: StreamCallback | None) -> Effects[Any]:
        last: Any = None
        while True:
            added = yield from self._step(stream, run)
            if added is not None:
                last = added
            if run.halted is not None:
                break
            if added is None:
                if run.next_move == "wait" and self._control.drive_subagents(run):
                    continue  # a subagent went on and settled its call: so do we
                break
        if last is None:
            transcript = finished(run.transcript or [])
            return self.store.transcript.native_message(transcript[-1]) if transcript else None
        return last

    def _step(self, stream: StreamCallback | None, run: Run) -> Effects[Any]:
        requested_at = None
        first = run.transcript is None
        if run.transcript is None:
            run.transcript = self.store.transcript.load_transcript()
            requested_at = self.store.stopping.cancel_requested_at()
        transcript = run.transcript
        move = next_move(transcript)
        inbox = self.store.inbox
        if inbox is not None and inbox.has_queued() and _takes_a_message(transcript):
            # Messages sent while another run held the chat: added now, in order.
            self.ask_later(run, None, [])
            transcript, requested_at = run.transcript or transcript, None
            move = next_move(transcript)
        run.next_move = move
        if move in ("done", "wait") and not (move == "wait" and first and requested_at):
            # Nothing to do (a cancel that came as the turn finished is dropped by the
            # release). Waiting with a cancel requested: the cancel applies to the held round.
            return None
        if first:
            self._runs.observe(run, requested_at)
        else:
            self._runs.read(run)
        if move == "tools":
            results = yield from self._run_tools(transcript, run)
            if run.next_move == "generate":
                # A halt asked for during the round stops the run here, in the same step.
                self._control.halt_if_requested(run)
            return results[-1] if results else None
        if move == "generate":
            if self._control.halt_if_requested(run):
                return None
            return (yield from self._calls.generate(transcript, stream, run))
        return None

    def _run_tools(self, transcript: list[Message], run: Run) -> Effects[list[Any]]:
        round_ = pending_round(transcript)
        if round_.message is None or not round_.unanswered:
            run.next_move = next_move(transcript)
            return []
        config = self.store.config.get_config()
        options = config.tool_options
        if options.concurrency is None and agentloop_settings.TOOL_CONCURRENCY is not None:
            # The chat didn't choose: the project-wide default applies.
            options = options.model_copy(
                update={"concurrency": agentloop_settings.TOOL_CONCURRENCY}
            )
        limit = config.limits.max_tool_calls
        budget = None if limit is None else max(limit - counted_tool_results(transcript), 0)
        tools: dict[str, type[Tool]] = {tool.name: tool for tool in self.store.config.get_tools()}
        guards = Guards(self.store, self._callbacks.emit, self._owner)
        runner = ToolRunner(
            self.store,
            tools,
            options,
            run.checkpoints,
            self._callbacks.emit,
            chat=self._owner,
            release_last=run.single,
            tool_budget=budget,
            guards=guards if guards.tool else None,
            transcript=transcript,
            asking=round_.message,
            handoffs=RoundHandoffs(
                self.store,
                self._callbacks.emit,
                self._owner,
                made_in_turn=handoffs_in_turn(transcript),
            ),
        )
        try:
            results = yield from runner.run(round_.message.tool_calls, round_.unanswered)
        except CancelledError as exc:
            transcript.extend(runner.messages)
            left = [call for call in round_.unanswered if call.id not in runner.answered]
            self._runs.record_cancel(exc, unanswered=left)
            raise
        if runner.handoffs is not None and runner.handoffs.made is not None:
            # Handed over: the new agent's instructions replaced the system message. Read
            # again (one query, only after a handoff), so the next model call sends them.
            transcript[:] = self.store.transcript.load_transcript()
        else:
            # The transcript in memory follows what was written: the next step needs no read.
            transcript.extend(runner.messages)
        run.next_move = next_move(transcript)
        if runner.stopped is not None:
            # A tool guardrail's block stops the chat, now that the round's results are saved.
            guards.fail_or_stop(runner.stopped, announce=False)
        return results


def _takes_a_message(transcript: list[Message]) -> bool:
    """A user message can be added: the turn is settled, or a cancel left its calls."""
    unanswered = pending_round(transcript).unanswered
    return all(call.state == ToolCallState.CANCELLED for call in unanswered)

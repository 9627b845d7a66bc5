"""The loop itself: add the user's message, then step (run the pending tools, else call the
model) until the chat is settled, waits for someone, or a halt or limit stops it; control
beyond cancel; and editing.

Each verb's body is a generator of effects (:mod:`._effects`): ``drive`` runs it for the sync
verbs, ``drive_async`` for their async twins.

Control (``Control``): halting a run before its next model call, driving subagents a person
unblocked, and cancelling calls no run will come back to.

Editing (``Editing``, a part of ``Conversation``): ``fork``, ``regenerate`` and ``edit``. The
transcript is ordinary rows, so editing is visible in them: an edit or a regenerated answer
marks the replaced rows superseded (kept, with their usage rows, never sent again) and adds
the new user message at the end; a fork is a new chat holding copies of the rows up to a
message. See docs/editing.md for what happens to pending tool calls, approvals and
subagents under each verb.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..attachments import attachments_from
from ..conf import agentloop_settings
from ..exceptions import (
    CancelledError,
    ChatBusyError,
    ConfigurationError,
    EditError,
    PendingToolCallsError,
)
from ..messages import Message, MessageStatus, ToolCallState
from ..tools import Tool
from . import tracing
from ._effects import Effects, StreamCallback
from ._judging import Guards
from ._model_calls import ModelCalls
from ._runs import Callbacks, HaltedRelease, Run, Runs
from ._tool_rounds import RoundHandoffs, ToolRunner
from ._transcript_reading import (
    StepResult,
    counted_tool_results,
    finished,
    handoffs_in_turn,
    next_move,
    pending_round,
)
from .store import SUPERSEDED_DECISION, ChatStore, Edits, missing_part

__all__ = [
    "CANCELLED_TOOL_RESULT",
    "Control",
    "Editing",
    "FORK_OPEN_CALL_RESULT",
    "HALTED_PREFIX",
    "KEEP",
    "Loop",
    "SUPERSEDED_DECISION",
    "checked_attachments",
    "halt_text",
]


#: how a halted chat's ``stop_reason`` begins.
HALTED_PREFIX = "halted: "


#: the result given to calls a cancel left unanswered (when the user moves on) or held.
CANCELLED_TOOL_RESULT = "Cancelled by the user before this tool ran."


def halt_text(reason: str) -> str:
    """A halt's reason as it is stored: on one line, at most 240 characters."""
    text = " ".join(str(reason).split()) or "no reason given"
    return text[:240]


class Control:
    """Halts, subagents driven in process, held calls cancelled, for one chat's store."""

    def __init__(self, store: ChatStore, callbacks: Callbacks) -> None:
        self.store = store
        self._callbacks = callbacks

    def halt_if_requested(self, run: Run) -> bool:
        """Before a model call: a pending halt stops the run (recorded, "halted" sent; the
        verb's release marks the chat stopped)."""
        reason = self.store.stopping.halt_requested()
        if not reason:
            return False
        stop_reason = HALTED_PREFIX + reason
        self.store.stopping.record_stop(stop_reason)
        run.next_move, run.halted = "done", HaltedRelease(stop_reason)
        self._callbacks.emit("halted", reason)
        return True

    def drive_subagents(self, run: Run) -> bool:
        """In process, held by subagents: "subagents_waiting" lets the chats they run go on
        where a person unblocked them. True when a call was settled and the run can go on."""
        if self.store.runs.background or not self._callbacks.listens("subagents_waiting"):
            return False
        held = [
            call
            for call in pending_round(run.transcript or []).unanswered
            if call.state == ToolCallState.WAITING and call.wait_reason == "subagent"
        ]
        if not held:
            return False
        self._callbacks.emit("subagents_waiting", held)
        run.transcript = self.store.transcript.load_transcript()
        run.next_move = next_move(run.transcript)
        return run.next_move != "wait"


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


#: the result a fork gives a copied call whose result was not copied: it never runs there.
FORK_OPEN_CALL_RESULT = "Not run: the conversation was forked before this call had a result."


class _Keep:
    """``attachments=KEEP``: the edited message keeps the attachments it had."""

    def __repr__(self) -> str:
        return "KEEP"


KEEP: Any = _Keep()


def _key_of(message: Any) -> Any:
    """The store key ``message`` names: a store record (``pk``), a Message (``key``), or a
    key itself."""
    if isinstance(message, Message):
        return message.key
    return getattr(message, "pk", message)


def _same(key: Any, other: Any) -> bool:
    return key == other or (key is not None and str(key) == str(other))


class Editing:
    """One chat's edits and forks, over its runs (the claim) and its loop (the answer)."""

    def __init__(self, store: ChatStore, callbacks: Callbacks, runs: Runs, loop: Loop) -> None:
        self.store = store
        self._emit = callbacks.emit
        self._runs = runs
        self._loop = loop

    # -- fork -----------------------------------------------------------------------------
    def fork(self, at: Any, wrap: Callable[[ChatStore], Any]) -> Any:
        """The new chat (``wrap`` makes a Conversation of a store the store returned)."""
        forks = self.store.forks
        if forks is None:
            raise ConfigurationError(missing_part(self.store, "forks", "no fork"))
        transcript = self.store.transcript.load_transcript()
        if at is None:
            finished = [m for m in transcript if m.status != MessageStatus.PARTIAL]
            if not finished:
                raise EditError("Nothing to fork: the chat has no messages yet.")
            target = finished[-1]
        else:
            target = self._find(transcript, at)
            if target.status == MessageStatus.PARTIAL:
                raise EditError(
                    f"Message {target.key} is an answer still streaming: fork at a finished one."
                )
        forked = forks.fork(target, FORK_OPEN_CALL_RESULT)
        if isinstance(forked, ChatStore):
            forked = wrap(forked)
        self._emit("forked", forked, self.store.transcript.native_message(target))
        return forked

    # -- regenerate and edit --------------------------------------------------------------
    def checked(self, text: Any, attachments: Any) -> list[Any] | None:
        """An edit's input checked before anything is taken or written: the attachments to
        send (None: keep the original's)."""
        if not isinstance(text, str):
            raise EditError(
                f"An edited message's text must be a string, not {type(text).__name__}."
            )
        return None if attachments is KEEP else checked_attachments(attachments)

    def replacing(
        self,
        message: Any,
        text: str | None,
        files: list[Any] | None,
        stream: StreamCallback | None,
    ) -> Effects[Any]:
        """``edit()`` and ``regenerate()``: the replacement written, then answered here."""
        self._edits()  # refused before anything is taken or written
        with self._runs.scope(single=False) as run:
            self._replace(run, message, text, files)
            return (yield from self._loop.finish(run, stream))

    def replace_later(self, message: Any, text: str | None, files: list[Any] | None) -> None:
        """``edit_later()`` and ``regenerate_later()``: the replacement written, no model call."""
        self._edits()  # refused before anything is taken or written
        with self._runs.scope(single=True) as run:
            self._replace(run, message, text, files)

    # -- internals --------------------------------------------------------------------------
    def _edits(self) -> Edits:
        """The store's edits part; a clear refusal where the store leaves it out."""
        if self.store.edits is None:
            raise ConfigurationError(missing_part(self.store, "edits", "no edit or regenerate"))
        return self.store.edits

    def _replace(self, run: Run, message: Any, text: str | None, files: list[Any] | None) -> None:
        """Under the verb's claim: supersede from the named user message (the last one when
        None) and add its replacement as the new turn (``files``: its attachments; None:
        the original's); the run goes on with the kept rows and the replacement."""
        transcript = self.store.transcript.load_transcript()
        pending = self._edits().pending_run()
        if pending:
            raise ChatBusyError(
                f"This chat {pending}: cancel() it, or wait for it to end, before editing "
                "or regenerating."
            )
        target = self._target(transcript, message)
        replacement = Message(
            role="user",
            content=target.content if text is None else text,
            attachments=target.attachments if files is None else files,
        )
        if not replacement.content.strip() and not replacement.attachments:
            raise EditError("An edited message needs some text (or an attachment).")
        start = next(i for i, m in enumerate(transcript) if m.key == target.key)
        superseded = self._edits().supersede(target)
        record = self.store.transcript.append_message(replacement)
        tracing.turn_started(self.store, replacement)
        kept = transcript[:start] + [m for m in transcript[start:] if m.role == "system"]
        run.transcript = [*kept, replacement]
        run.next_move = next_move(run.transcript)
        self._emit("superseded", superseded)
        self._emit("after_message", record)

    def _target(self, transcript: list[Message], message: Any) -> Message:
        if message is None:
            users = [m for m in transcript if m.role == "user"]
            if not users:
                raise EditError("Nothing to regenerate: the chat has no user message yet.")
            return users[-1]
        target = self._find(transcript, message)
        if target.role != "user":
            raise EditError(
                f"Message {target.key} is a {target.role} message: only a user message can be "
                "edited (regenerate() gives the last one a new answer)."
            )
        return target

    def _find(self, transcript: list[Message], message: Any) -> Message:
        """The current message ``message`` names; ``EditError`` saying why when none."""
        key = _key_of(message)
        for candidate in transcript:
            if _same(candidate.key, key):
                return candidate
        if any(m.superseded and _same(m.key, key) for m in self._edits().load_history()):
            raise EditError(
                f"Message {key} was superseded (an edit or a regenerated answer replaced it): "
                "name one of the chat's current messages."
            )
        raise EditError(f"No message {key!r} in this chat.")

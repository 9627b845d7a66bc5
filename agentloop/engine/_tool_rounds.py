"""A round of tool calls, the handoffs it makes, and the people who decide held calls.

A round runs its calls one after another or a bounded number at once. Every result is
written as soon as its tool finishes, in its own transaction, so a crash loses at most the
tool that was running. Database writes happen on the calling thread; running a tool is an
effect (:mod:`._effects`) its driver performs: on a thread, or awaited on the event loop for
an ``async def`` tool of an async verb.

Handoffs: the chat handed over to another agent by the call that asked for it (a handoff
tool, or any tool calling ``ToolContext.hand_off``), in the transaction that saves the call's
result, so the very next model call is the new agent's, in this run or in a worker's next
job, and a crash never leaves one without the other. At most one handoff per round: the
first handoff tool in the answer's call order runs, later ones get an error result; a
handoff asked for when the round already made one is not made. At most
``AGENTLOOP["MAX_HANDOFFS"]`` per turn (A to B to A...): past it a handoff is refused with an
error result and the current agent goes on.

People in the loop (``PeopleInTheLoop``): approvals, questions, and calls waiting on
subagents.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..conf import agentloop_settings
from ..exceptions import (
    CancelledError,
    ConfigurationError,
    DecisionConflictError,
    GuardrailError,
    InvalidArgumentsError,
    ToolCallNotWaitingError,
)
from ..guardrails import Guardrail
from ..messages import Message, ToolCall, ToolCallState
from ..providers.common import INVALID_ARGUMENTS
from ..tools import (
    Tool,
    ToolOutcome,
    arguments_problem,
    format_result,
)
from ._chat_config import ToolOptions
from ._drivers import execute_tool, unaskable
from ._effects import Effects, Judge, Launch, Pause, RunTool, WaitAny
from ._judging import Case, Guards, Verdict, stop_reason
from ._runs import Checkpoints
from ._transcript_reading import TOOL_LIMIT_RESULT, pending_round
from .store import ChatStore, ToolTransaction

__all__ = [
    "BLOCKED_PREFIX",
    "BLOCKED_RESULT",
    "DENIED_RESULT",
    "PeopleInTheLoop",
    "RoundHandoffs",
    "STOPPED_RESULT",
    "ToolRunner",
    "agent_label",
    "hands_off",
]


def hands_off(tool_class: Any) -> bool:
    """A handoff tool (``Agent.as_handoff()``): running it only asks for the handoff."""
    return getattr(tool_class, "handoff_agent", None) is not None


def agent_label(path: str) -> str:
    """``Billing`` for ``myapp.agents.Billing``; "" for no agent."""
    return path.rpartition(".")[2]


class RoundHandoffs:
    """The handoffs of one tool round: which may be made, and making them."""

    def __init__(
        self, store: ChatStore, emit: Callable[..., None], owner: Any, *, made_in_turn: int
    ) -> None:
        self.store = store
        self.emit = emit
        #: what the new agent configures: the persisted chat, or the in-memory Conversation.
        self.owner = owner
        self.limit = int(agentloop_settings.MAX_HANDOFFS)
        self.made_in_turn = made_in_turn
        #: the handoff this round made: (the call's id, its record).
        self.made: tuple[str, dict[str, Any]] | None = None
        #: the call whose handoff is made and not yet announced ("handed_off").
        self._unannounced: ToolCall | None = None

    def refusal(self) -> str | None:
        """Why a handoff can't be made now; None when it can."""
        if self.store.handoffs is None:
            return (
                f"Not handed off: {type(self.store).__name__} keeps no handoffs "
                "(store.handoffs is None)."
            )
        if self.made is not None:
            call_id, record = self.made
            return (
                f"Not handed off: call {call_id} of this answer already handed the "
                f"conversation to {agent_label(record['to'])}."
            )
        if self.made_in_turn >= self.limit:
            return (
                f"Not handed off: this turn already handed the conversation over "
                f"{self.made_in_turn} times, the limit (AGENTLOOP['MAX_HANDOFFS'])."
            )
        return None

    def refusals(self, calls: list[ToolCall], tools: dict[str, Any]) -> dict[str, ToolOutcome]:
        """Before the round runs: the handoff tools' calls that won't run (all but the
        answer's first, or all of them when no handoff can be made), with their results."""
        refused: dict[str, ToolOutcome] = {}
        first = True
        for call in calls:
            if not hands_off(tools.get(call.name)):
                continue
            reason = self.refusal()
            if reason is None and not first:
                reason = (
                    "Not handed off: an answer hands the conversation to one agent; "
                    "an earlier call of this answer does."
                )
            first = False
            if reason is not None:
                refused[call.id] = ToolOutcome(reason, is_error=True, error=reason)
        return refused

    def save(
        self,
        call: ToolCall,
        outcome: ToolOutcome,
        tool_class: Any,
        write: Callable[[ToolOutcome], Any],
    ) -> tuple[ToolOutcome, Any]:
        """Write ``call``'s result (``write``), its outcome asking for a handoff: the handoff
        made in the same transaction (the new agent's configuration applied, the chat's agent
        recorded, the call marked); when it can't be made, the result says why. Returns the
        outcome written and what ``write`` returned; :meth:`announce` once committed."""
        request = outcome.handoff
        assert request is not None  # noqa: S101 - the runner routes only handoffs here
        reason = self.refusal()
        if reason is None:
            try:
                with self.store.atomic():
                    # The new agent checks everything (inputs, model) before it writes.
                    record = request.agent.take_over(self.owner, request.inputs)
                    call.handoff = record
                    assert self.store.handoffs is not None  # refusal() said so
                    self.store.handoffs.record_handoff(call, record)
                    result = write(outcome)
            except ConfigurationError as exc:
                call.handoff = None
                target = getattr(request.agent, "__name__", str(request.agent))
                reason = f"Not handed off to {target}: {exc}"
            else:
                self.made = (call.id, record)
                self.made_in_turn += 1
                self._unannounced = call
                return outcome, result
        if hands_off(tool_class):
            refused = ToolOutcome(reason, is_error=True, error=reason)
        else:
            # Any other tool ran and has its own result: kept, with why no handoff was made.
            refused = ToolOutcome(f"{outcome.content}\n\n[{reason}]")
        return refused, write(refused)

    def announce(self) -> None:
        """Once the handoff's transaction committed: "handed_off" for it (once), so what
        listens sees the chat under its new agent."""
        call, self._unannounced = self._unannounced, None
        if call is not None and call.handoff is not None:
            self.emit("handed_off", call.handoff, self.store.tool_calls.native_tool_call(call))


#: what the model is told about a call a person denied.
DENIED_RESULT = "The user denied this tool call; it was not run."


#: what the model is told about a call a tool guardrail blocked ("guardrail <name>: <why>").
BLOCKED_RESULT = "Blocked by {reason}; the tool was not run."


#: how every such result begins (the admin's "blocked by a guardrail" filter looks for it).
BLOCKED_PREFIX = "Blocked by guardrail "


#: ... and about the round's calls left when a tool guardrail stopped the chat.
STOPPED_RESULT = "Not run: {reason} stopped the chat."


Emit = Callable[..., None]


def _passed_before_approval(call: ToolCall, guardrails: list[Guardrail]) -> bool:
    """``call`` was approved with the arguments ``guardrails`` let through before the person
    was asked (each of them passed it, or replaced its arguments): judged already."""
    if call.decision != "approved" or call.original_arguments is not None:
        return False
    passed = {
        outcome.guardrail
        for outcome in call.guardrails
        if outcome.stage == "tool" and outcome.decision in ("passed", "replaced")
    }
    return all(guardrail.name in passed for guardrail in guardrails)


class ToolRunner:
    """Runs the unanswered calls of one round and persists each result."""

    def __init__(
        self,
        store: ChatStore,
        tools: dict[str, type[Tool]],
        options: ToolOptions,
        checkpoints: Checkpoints,
        emit: Emit,
        chat: Any = None,
        *,
        release_last: bool = False,
        tool_budget: int | None = None,
        guards: Guards | None = None,
        transcript: list[Message] | None = None,
        asking: Message | None = None,
        handoffs: RoundHandoffs | None = None,
    ) -> None:
        self.store = store
        #: the round's handoffs (None: a handoff asked for is not made, the result says so).
        self.handoffs = handoffs
        #: the chat's guardrails (tool guardrails judge each call before it runs), and the
        #: transcript their contexts show.
        self.guards = guards
        self.transcript = transcript or []
        #: the block of a tool guardrail that stops the chat (once the round is saved).
        self.stopped: Verdict | None = None
        #: the answer that asked for the round's calls (the guardrails' ``message``).
        self.asking = asking
        #: the round is the verb's last move: its last result's write also releases the claim.
        self.release_last = release_last
        self.unanswered: list[ToolCall] = []
        #: how many more calls may run this turn (``max_tool_calls``); None: no limit.
        self.tool_budget = tool_budget
        self.tools = tools
        self.options = options
        self.checkpoints = checkpoints
        self.emit = emit
        self.chat = chat
        self.results: list[Any] = []
        #: the result messages written, as engine messages (the caller's transcript grows).
        self.messages: list[Message] = []
        self.answered: set[str] = set()
        #: calls that now wait for a person or a subagent.
        self.waiting: list[ToolCall] = []

    # -- outcomes that need no tool run ------------------------------------------------
    def _refusal(self, call: ToolCall, all_calls: list[ToolCall]) -> ToolOutcome | None:
        tool_class = self.tools.get(call.name)
        if tool_class is None:
            available = ", ".join(sorted(self.tools)) or "none"
            text = f"Unknown tool {call.name!r}. Available tools: {available}."
            return ToolOutcome(text, is_error=True, error=text)
        if INVALID_ARGUMENTS in call.provider_data:
            # The provider kept argument text that was not a JSON object: never run on a guess.
            sent = str(call.provider_data[INVALID_ARGUMENTS])[:500]
            text = f"Invalid arguments for tool {call.name!r}: not a JSON object: {sent}"
            return ToolOutcome(text, is_error=True, error=text)
        if self.options.calls == "one" and call is not all_calls[0]:
            text = "Only one tool call per answer is allowed; this call was not run."
            return ToolOutcome(text, is_error=True)
        # Cut short by a crash: a transactional call's writes were rolled back with it, so it
        # runs again (such a tool can't be idempotent=False: tools.py refuses that).
        if call.state == ToolCallState.RUNNING and not tool_class.idempotent:
            text = (
                f"Tool {call.name!r} was interrupted while running and is not run again "
                "because it is not idempotent; its effects are unknown."
            )
            return ToolOutcome(text, is_error=True, error=text)
        if tool_class.needs_approval(call.arguments):
            held = self._approval(call)
            if held is not None:
                return (unaskable(tool_class, call) or held) if held.wait_reason else held
        if tool_class.deferred:
            # Its result comes from outside (submit_result): held, never run here.
            return unaskable(tool_class, call) or ToolOutcome(wait_reason="deferred")
        return None

    def _approval(self, call: ToolCall) -> ToolOutcome | None:
        """Fail closed: only an approval given for exactly these arguments lets a call run."""
        if call.decision == "denied":
            # The denial's result was not written (a crash in between): write it now.
            return ToolOutcome(DENIED_RESULT, is_error=True)
        if call.decision == "approved" and call.decision_digest == call.arguments_digest():
            return None
        return ToolOutcome(wait_reason="approval")

    def _save(self, call: ToolCall, outcome: ToolOutcome, *, release: str | None = None) -> None:
        if outcome.handoff is not None:
            # Released by the verb, after the transaction that makes the handoff.
            outcome, written = self._hand_off(call, outcome)
            self._announce(call, outcome, written)
            if self.handoffs is not None:
                self.handoffs.announce()
            return
        self._announce(call, outcome, self._write(call, outcome, release))

    def _hand_off(
        self, call: ToolCall, outcome: ToolOutcome
    ) -> tuple[ToolOutcome, tuple[Message, Any] | None]:
        """Write the result of ``call``, which asks for a handoff, making the handoff with it
        (``RoundHandoffs``); the outcome written (a refused handoff's says why) and the rows."""
        if self.handoffs is None:
            kept = ToolOutcome(f"{outcome.content}\n\n[Not handed off: no handoffs here.]")
            return kept, self._write(call, kept)
        tool_class = self.tools.get(call.name)
        return self.handoffs.save(call, outcome, tool_class, lambda done: self._write(call, done))

    def _write(
        self, call: ToolCall, outcome: ToolOutcome, release: str | None = None
    ) -> tuple[Message, Any] | None:
        """Persist ``outcome``: the call's wait (None), or its result (the message and the
        store's record)."""
        if outcome.wait_reason is not None:
            self.store.tool_calls.mark_tool_waiting(call, outcome.wait_reason, outcome.question)
            return None
        message = Message(
            role="tool",
            content=outcome.content,
            tool_call_id=call.id,
            tool_name=call.name,
            is_error=outcome.is_error,
        )
        state = ToolCallState.FAILED if outcome.is_error else ToolCallState.SUCCEEDED
        record = self.store.tool_calls.save_tool_result(
            call, message, state, outcome.error, release=release
        )
        return message, record

    def _announce(
        self, call: ToolCall, outcome: ToolOutcome, written: tuple[Message, Any] | None
    ) -> None:
        """The round and the callbacks follow what ``_write`` persisted (once it committed)."""
        if written is None:
            call.state, call.wait_reason, call.question = (
                ToolCallState.WAITING,
                outcome.wait_reason,
                outcome.question,
            )
            self.waiting.append(call)
            if outcome.after_wait is not None:
                outcome.after_wait()
            return
        message, record = written
        call.state = ToolCallState.FAILED if outcome.is_error else ToolCallState.SUCCEEDED
        self.answered.add(call.id)
        self.messages.append(message)
        self.results.append(record)
        self.emit("after_tool_result", record)
        self.emit("after_message", record)

    # -- transactional tools -------------------------------------------------------------
    def _transactional(self, call: ToolCall) -> bool:
        """``call``'s tool runs in the store's transaction (a store that has one)."""
        return self.store.transactions is not None and self.tools[call.name].transactional

    def _run_in_transaction(self, call: ToolCall) -> ToolOutcome:
        """Run a transactional tool here, in this database phase: its writes, its result and
        its call's state commit together. Callbacks hear of the result once it committed;
        the verb's release comes after, on its own (never from inside the transaction)."""
        tool = self._execute(call)

        def work(run: ToolTransaction) -> tuple[ToolOutcome, tuple[Message, Any] | None]:
            outcome = execute_tool(
                tool.tool_class, call, tool.chat, tool.background, tool.cancel_check, run.savepoint
            )
            if outcome.handoff is not None:
                return self._hand_off(call, outcome)  # in the same transaction
            return outcome, self._write(call, outcome)

        transactions = self.store.transactions
        assert transactions is not None  # only a store with transactions runs them here
        (outcome, written), refused = transactions.run_in_transaction(call, work)
        if refused:
            # The database refused the commit: nothing of the run stayed; the model hears why.
            text = (
                f"Tool {call.name!r} failed: the database refused its writes when they were "
                f"committed ({refused}); none of them were kept."
            )
            outcome = ToolOutcome(text, is_error=True, error=text)
            self._save(call, outcome)
            return outcome
        self._announce(call, outcome, written)
        if self.handoffs is not None:
            self.handoffs.announce()  # committed
        return outcome

    def _execute(self, call: ToolCall) -> RunTool:
        return RunTool(
            self.tools[call.name],
            call,
            self.chat,
            self.store.runs.background,
            cancel_check=lambda: self.store.stopping.cancel_requested_at() is not None,
            wrap=self.store.wrap_thread,
        )

    def _start(self, call: ToolCall) -> bool:
        """Claim the call (a conditional write); False: it changed meanwhile, don't run it."""
        if not self.store.tool_calls.mark_tool_running(call):
            return False
        call.state = ToolCallState.RUNNING
        self.emit("before_tool_call", self.store.tool_calls.native_tool_call(call))
        return True

    # -- tool guardrails ----------------------------------------------------------------
    def _judge(self, call: ToolCall) -> Effects[Verdict | None]:
        """What the tool guardrails decide about ``call`` (None: none judge it now), kept
        on the call; arguments one replaced are the call's from now on. A call they passed
        before a person was asked, approved as it was, is not judged again; one whose
        arguments the approver edited is, and keeps both verdicts."""
        guardrails = self.guards.tool_guardrails(call) if self.guards is not None else []
        if not guardrails or self.guards is None or _passed_before_approval(call, guardrails):
            return None
        text = json.dumps(call.arguments, ensure_ascii=False, default=str)
        case = Case("tool", text, message=self.asking, tool_call=call)
        panels = self.guards.panels(guardrails, [case], self.transcript)
        (verdict,) = yield Judge(panels, self.store.wrap_thread, self.checkpoints)
        if verdict.passed and verdict.arguments is not None:
            problem = arguments_problem(self.tools[call.name], verdict.arguments)
            if problem is not None:
                replaced = verdict.outcomes[-1]
                verdict.error = GuardrailError(
                    f"guardrail {replaced.guardrail!r} replaced the arguments of "
                    f"{call.name!r} with ones its tool refuses: {problem}"
                )
                replaced.decision, replaced.reason = "error", str(verdict.error)
        # After an edit, the verdict before the person was asked stays on record.
        earlier = call.guardrails if call.original_arguments is not None else []
        call.guardrails = [*earlier, *verdict.outcomes]
        if verdict.passed and verdict.arguments is not None:
            call.arguments = verdict.arguments
        return verdict

    def _judged(self, call: ToolCall, verdict: Verdict | None, release: str | None = None) -> bool:
        """Act on a verdict that did not pass ``call``: a failure raises its
        ``GuardrailError`` (fails closed: the call is not run, the chat fails); a block
        gives the model an error result (and, stopping, ends the round). True when the call
        was dealt with here (it must not run)."""
        if verdict is None or verdict.passed:
            return False
        self.store.tool_calls.save_tool_guardrails(call)
        if verdict.error is not None:
            raise verdict.error
        blocked = verdict.blocked
        assert blocked is not None  # noqa: S101 - not passed: blocked or failed
        self.emit("guardrail_blocked", blocked, verdict.stop)
        if verdict.stop:
            self.stopped = verdict
        text = BLOCKED_RESULT.format(reason=stop_reason(blocked))
        self._save(call, ToolOutcome(text, is_error=True), release=release)
        return True

    def _stopped_result(self) -> ToolOutcome | None:
        """A call's result once a guardrail stopped the chat: not run."""
        if self.stopped is None or self.stopped.blocked is None:
            return None
        text = STOPPED_RESULT.format(reason=stop_reason(self.stopped.blocked))
        return ToolOutcome(text, is_error=True)

    def _refuse(self, call: ToolCall, refusal: ToolOutcome, last: bool) -> Effects[None]:
        """Save a refusal; a call held for a person's approval, or a deferred one (run
        outside), is judged before it is held: a call a guardrail blocks is never put to a
        person, and one it rewrites is put with the arguments it would run with."""
        if refusal.wait_reason in ("approval", "deferred"):
            verdict = yield from self._judge(call)
            if self._judged(call, verdict, release=self._then(call) if last else None):
                return
        self._save(call, refusal, release=self._then(call) if last else None)

    # -- the round ---------------------------------------------------------------------
    def run(self, round_calls: list[ToolCall], unanswered: list[ToolCall]) -> Effects[list[Any]]:
        """Run ``unanswered`` (calls of ``round_calls`` without a result)."""
        self.unanswered = unanswered
        yield Pause(self.checkpoints)  # an iterated run's events go out before any call starts
        # Calls held by a person or a subagent are not ours to run.
        calls = [call for call in unanswered if call.state != ToolCallState.WAITING]
        refusals = {call.id: self._refusal(call, round_calls) for call in calls}
        if self.handoffs is not None:
            # One handoff per answer, within the turn's limit: decided before anything runs.
            would_run = [call for call in calls if refusals[call.id] is None]
            refusals.update(self.handoffs.refusals(would_run, self.tools))
        runnable = [call for call in calls if refusals[call.id] is None]
        if self.tool_budget is not None and len(runnable) > self.tool_budget:
            # Past max_tool_calls a call is not run; the turn stops before the next model call.
            for call in runnable[self.tool_budget :]:
                refusals[call.id] = ToolOutcome(TOOL_LIMIT_RESULT, is_error=True)
            runnable = runnable[: self.tool_budget]
        concurrency = self.options.concurrency
        if concurrency is None or len(runnable) <= 1:
            yield from self._run_in_order(calls, refusals)
        else:
            for call in calls:
                refusal = refusals[call.id]
                if refusal is not None:
                    yield from self._refuse(call, refusal, last=False)
            # Transactional tools run on the verb's own connection, one after another, before
            # the others start: a transaction belongs to one connection and one thread.
            at_once = [call for call in runnable if not self._transactional(call)]
            for call in runnable:
                if not self._transactional(call):
                    continue
                self.checkpoints.check()
                if self._judged(call, (yield from self._judge(call))):
                    continue
                if self._start(call):
                    self._run_in_transaction(call)
            size = len(at_once) if concurrency == "threads" else int(concurrency)
            if at_once:
                yield from self._run_at_once(at_once, size)
        return self.results

    def _run_in_order(
        self, calls: list[ToolCall], refusals: dict[str, ToolOutcome | None]
    ) -> Effects[None]:
        """One after another, results in call order."""
        checked = False
        for index, call in enumerate(calls):
            last = self.release_last and index == len(calls) - 1
            refusal = self._stopped_result() or refusals[call.id]
            if refusal is not None:
                yield from self._refuse(call, refusal, last)
                continue
            if not checked:
                # The verb's own start check usually just ran (throttled then); later tools
                # are covered by the previous tool's after-check.
                self.checkpoints.check(force=False)
                checked = True
            verdict = yield from self._judge(call)
            if self._judged(call, verdict, release=self._then(call) if last else None):
                continue
            if self._start(call):
                if self._transactional(call):
                    self._run_in_transaction(call)  # the verb releases, after the commit
                else:
                    outcome = yield self._execute(call)
                    # A handoff is released by the verb, after the transaction that makes it.
                    releases = outcome.wait_reason is None and outcome.handoff is None
                    release = self._then(call) if last and releases else None
                    self._save(call, outcome, release=release)
                    if release is not None:
                        # Released with the round's result: a cancel that came meanwhile
                        # stays set and stops the next step at its start.
                        return
                if self._next_step_checks(index, calls, call):
                    return
            self.checkpoints.check()

    def _next_step_checks(self, index: int, calls: list[ToolCall], call: ToolCall) -> bool:
        """The round's last result is written and the verb goes on to call the model: that
        step's start checkpoint reads the flag the result's write returned, so no check (and
        no query) here."""
        return not self.release_last and index == len(calls) - 1 and self._then(call) == "generate"

    def _then(self, call: ToolCall) -> str | None:
        """The move after ``call``, the round's last, gets its result: the model is called
        again unless another call of the round still waits. None (release later, not with
        this write) when a halt was asked for, or a guardrail stops the chat: the verb
        applies it after the round."""
        if self.stopped is not None or self.store.stopping.halt_requested():
            return None
        others = [c for c in self.unanswered if c is not call and c.id not in self.answered]
        return "wait" if any(c.state == ToolCallState.WAITING for c in others) else "generate"

    def _run_at_once(self, calls: list[ToolCall], size: int) -> Effects[None]:
        """At most ``size`` tools running at once (threads, or tasks of an async verb)."""
        queue = list(calls)
        running: dict[Any, ToolCall] = {}
        cancelled: CancelledError | None = None
        while queue or running:
            while queue and len(running) < size and cancelled is None:
                try:
                    self.checkpoints.check()
                except CancelledError as exc:
                    cancelled = exc
                    break
                call = queue.pop(0)
                stopped = self._stopped_result()
                if stopped is not None:
                    self._save(call, stopped)
                    continue
                try:
                    verdict = yield from self._judge(call)
                except CancelledError as exc:  # while a guardrail judged it: it does not run
                    cancelled = exc
                    break
                if self._judged(call, verdict) or not self._start(call):
                    continue
                running[(yield Launch(self._execute(call), size))] = call
            if not running:
                break
            for handle, outcome in (yield WaitAny(list(running))):
                self._save(running.pop(handle), outcome)
                if cancelled is None:
                    try:
                        self.checkpoints.check()
                    except CancelledError as exc:
                        cancelled = exc  # let the running tools finish and be saved
        if cancelled is not None:
            raise cancelled


#: what a call waiting for each reason waits for, in an error message.
_WAITS_FOR = {"approval": "approval", "question": "an answer", "deferred": "a submitted result"}


def _names(call: ToolCall, key: Any) -> bool:
    """Whether ``key`` (a provider call id or a store key) names ``call``."""
    return call.id == key or call.key == key or str(call.key) == str(key)


class PeopleInTheLoop:
    """What holds a chat, and the decisions that release it, for one chat's store: a base of
    ``Conversation``, whose store and callbacks these are."""

    store: ChatStore
    _emit: Callable[..., None]

    def pending_approvals(self) -> list[Any]:
        """Tool calls waiting for a person to approve or deny them."""
        return self._waiting_calls("approval")

    def pending_questions(self) -> list[Any]:
        """Tool calls waiting for a person's answer (``call.question`` asks it)."""
        return self._waiting_calls("question")

    def pending_results(self) -> list[Any]:
        """Calls of deferred tools waiting for their result from outside (``submit_result``)."""
        return self._waiting_calls("deferred")

    def _waiting_calls(self, reason: str) -> list[Any]:
        round_ = pending_round(self.store.transcript.load_transcript())
        return [
            self.store.tool_calls.native_tool_call(call)
            for call in round_.unanswered
            if call.state == ToolCallState.WAITING and call.wait_reason == reason
        ]

    def _find_waiting(self, tool_call_id: Any, reason: str) -> ToolCall:
        """The waiting call named by its provider id, its store key, or a store record."""
        key = getattr(tool_call_id, "pk", tool_call_id)
        transcript = self.store.transcript.load_transcript()
        round_ = pending_round(transcript)
        for call in round_.message.tool_calls if round_.message is not None else []:
            if _names(call, key):
                if call.decision and (
                    call.state != ToolCallState.WAITING or call not in round_.unanswered
                ):
                    # Someone decided it first (a race: the view answers 409).
                    raise DecisionConflictError(
                        f"Tool call {call.id!r} ({call.name}) was already {call.decision}."
                    )
                if (
                    call not in round_.unanswered
                    or call.state != ToolCallState.WAITING
                    or call.wait_reason != reason
                ):
                    raise ToolCallNotWaitingError(
                        f"Tool call {call.id!r} ({call.name}) is not waiting for "
                        f"{_WAITS_FOR.get(reason, reason)}."
                    )
                return call
        for message in transcript:
            for call in message.tool_calls:
                if call.decision and _names(call, key):
                    # Decided in an earlier round (a late retry of a webhook, say).
                    raise DecisionConflictError(
                        f"Tool call {call.id!r} ({call.name}) was already {call.decision}."
                    )
        superseded = self.store.edits.superseded_calls() if self.store.edits is not None else []
        for call in superseded:
            if _names(call, key):
                raise ToolCallNotWaitingError(
                    f"Tool call {call.id!r} ({call.name}) was superseded (an edit or a "
                    "regenerated answer replaced its message): it will not run."
                )
        raise ToolCallNotWaitingError(f"No pending tool call {tool_call_id!r} in this chat.")

    def approve(
        self, tool_call_id: Any, by: Any = None, arguments: dict[str, Any] | None = None
    ) -> None:
        """Let a call that needs approval run (at the next step), for exactly its arguments,
        or for ``arguments`` edited by the approver: validated by the tool's ``Params`` first
        (``InvalidArgumentsError``, nothing written); the model's are kept."""
        call = self._find_waiting(tool_call_id, "approval")
        if arguments is not None:
            self._edit_arguments(call, arguments)
        else:
            # Held before the engine checked arguments first: approve only what could run.
            self._check_arguments(call, call.arguments)
        self.store.tool_calls.record_decision(call, "approved", by=by, reason="", result=None)

    def _check_arguments(self, call: ToolCall, arguments: dict[str, Any]) -> None:
        """``InvalidArgumentsError`` (one line) when the call's tool refuses ``arguments`` or
        takes no parameter for some of their keys; nothing is checked for a tool the chat
        no longer has (running it answers that)."""
        tool_class = next((t for t in self.store.config.get_tools() if t.name == call.name), None)
        problem = None if tool_class is None else arguments_problem(tool_class, arguments)
        if problem is not None:
            raise InvalidArgumentsError(problem)

    def _edit_arguments(self, call: ToolCall, arguments: Any) -> None:
        """Check the approver's arguments, then make them the call's (the approval's digest
        binds them); the model's arguments go to ``original_arguments``."""
        tool_class = next((t for t in self.store.config.get_tools() if t.name == call.name), None)
        if tool_class is None:
            raise InvalidArgumentsError(
                f"Tool {call.name!r} is not among the chat's tools: its arguments can't be edited."
            )
        if not isinstance(arguments, dict):
            raise InvalidArgumentsError(
                f"Arguments for tool {call.name!r} must be a JSON object, not "
                f"{type(arguments).__name__}."
            )
        self._check_arguments(call, arguments)
        try:
            edited = json.loads(json.dumps(arguments))  # what the row will hold
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentsError(
                f"Arguments for tool {call.name!r} are not JSON: {exc}"
            ) from None
        if edited != call.arguments:
            call.original_arguments, call.arguments = call.arguments, edited

    def deny(self, tool_call_id: Any, reason: str = "", by: Any = None) -> Any:
        """Refuse a call: the model gets an error result saying the user denied it."""
        call = self._find_waiting(tool_call_id, "approval")
        text = DENIED_RESULT + (f" Reason: {reason}" if reason else "")
        result = Message(
            role="tool", content=text, tool_call_id=call.id, tool_name=call.name, is_error=True
        )
        record = self.store.tool_calls.record_decision(
            call, "denied", by=by, reason=reason, result=result
        )
        self._emit("after_tool_result", record)
        self._emit("after_message", record)
        return record

    def answer(self, tool_call_id: Any, text: str, by: Any = None) -> Any:
        """Answer a call's question: the answer becomes the call's result."""
        call = self._find_waiting(tool_call_id, "question")
        result = Message(role="tool", content=text, tool_call_id=call.id, tool_name=call.name)
        record = self.store.tool_calls.record_decision(
            call, "answered", by=by, reason="", result=result
        )
        self._emit("after_tool_result", record)
        self._emit("after_message", record)
        return record

    def submit_result(self, tool_call_id: Any, content: Any, error: bool = False) -> Any:
        """Give a deferred tool's call its result (``error=True``: the model sees an error
        result). A conditional decision: a second submit gets ``DecisionConflictError``."""
        call = self._find_waiting(tool_call_id, "deferred")
        text = content if isinstance(content, str) else format_result(content)
        result = Message(
            role="tool", content=text, tool_call_id=call.id, tool_name=call.name, is_error=error
        )
        record = self.store.tool_calls.record_decision(
            call, "submitted", by=None, reason="", result=result
        )
        self._emit("after_tool_result", record)
        self._emit("after_message", record)
        return record

    def settle_subagent(self, tool_call_id: Any, text: str, is_error: bool = False) -> bool:
        """Give a call waiting on a subagent its result (an error result when the subagent's
        run was cancelled); False if it wasn't waiting."""
        try:
            call = self._find_waiting(tool_call_id, "subagent")
        except ToolCallNotWaitingError:
            return False
        result = Message(
            role="tool", content=text, tool_call_id=call.id, tool_name=call.name, is_error=is_error
        )
        decision = "cancelled" if is_error else "answered"
        record = self.store.tool_calls.record_decision(
            call, decision, by=None, reason="", result=result
        )
        self._emit("after_tool_result", record)
        self._emit("after_message", record)
        return True

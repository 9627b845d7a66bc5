"""A chat's guardrails (:mod:`agentloop.guardrails`) judging a case, and what their verdicts do.

A stage's guardrails judge a case (a user message, an answer, a tool call) in order: each
sees the text as the one before left it (a replacement carries on), and the first that does
not pass ends the judging. A :class:`Panel` is a stage's guardrails with the case they judge;
its :class:`Verdict` fills as they decide. What the verdicts do (the outcomes kept on the
message or call, a replaced text, a block that stops the chat, an error that fails it) is
:class:`Guards`'.

Running the checks is an effect (:mod:`._effects`) the drivers perform with ``judge`` (sync
verbs) and ``ajudge`` (async verbs), panels in order. Each check is bounded: a sync one
decides on a thread of its own (an ``async def`` one, under a sync verb, on that thread's
event loop; under an async verb, as a task), while the verb waits in short slices, looking at
the run's cancel and at the check's time limit
(:meth:`~agentloop.guardrails.Guardrail.time_limit`) in between. A cancel stops the judging
at once (``CancelledError``); a check past its limit fails closed, as one that raised. A
check left behind is abandoned: a task is cancelled, a thread runs on until it returns
(Python can't stop one) and its decision is ignored.

:class:`Judging` is input guardrails judging while the model call is in flight
(``StartJudging``, ``AwaitJudging``): it tells the call to stop as soon as its verdict will
not let the call stand. ``unkept_usage`` is the usage row of a call whose answer the
guardrails did not let be kept.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from asgiref.sync import async_to_sync

from ..exceptions import GuardrailBlockedError, GuardrailError
from ..guardrails import Block, Guardrail, GuardrailContext, Pass, Replace
from ..messages import GuardrailOutcome, Message, MessageStatus, ModelResponse, TokenUsage, ToolCall
from ..providers.base import Provider
from ._transcript_reading import finished
from .store import ChatStore, UsageRecord

__all__ = [
    "ABANDONED",
    "AsyncWatch",
    "Case",
    "Guards",
    "Judged",
    "Judging",
    "Panel",
    "SLICE",
    "UNJUDGED",
    "Verdict",
    "Watch",
    "ajudge",
    "judge",
    "stop_reason",
    "unjudged_inputs",
    "unkept_usage",
]


#: the longest reason an outcome keeps (a guardrail's own words, or an error's first line).
_REASON_CHARS = 1000


def stop_reason(outcome: GuardrailOutcome) -> str:
    """The chat's stop reason for a block: "guardrail <name>: <reason>"."""
    return f"guardrail {outcome.guardrail}: {outcome.reason}"


@dataclass
class Case:
    """What a stage's guardrails judge: a user message, an answer, or a tool call."""

    stage: str
    text: str
    message: Message | None = None
    tool_call: ToolCall | None = None


@dataclass
class Verdict:
    """What a stage's guardrails decided about one case, together."""

    outcomes: list[GuardrailOutcome] = field(default_factory=list)
    #: the text (input, output) or arguments (tool) to go on with, when replaced.
    text: str | None = None
    arguments: dict[str, Any] | None = None
    #: the block that ended the judging; ``stop``: it stops the chat.
    blocked: GuardrailOutcome | None = None
    stop: bool = False
    #: a guardrail failed (raised, or returned something that is no decision).
    error: GuardrailError | None = None

    @property
    def passed(self) -> bool:
        """Neither blocked nor failed (maybe replaced)."""
        return self.blocked is None and self.error is None

    @property
    def clean(self) -> bool:
        """Passed as it was: nothing replaced."""
        return self.passed and self.text is None and self.arguments is None


@dataclass
class Panel:
    """A stage's guardrails and the case they judge; ``verdict`` fills as they decide."""

    guardrails: list[Guardrail]
    case: Case
    chat: Any = None
    transcript: tuple[Message, ...] = ()
    background: bool = False
    parallel: bool = False
    verdict: Verdict = field(default_factory=Verdict)

    def context(self, guardrail: Guardrail) -> GuardrailContext:
        verdict, case = self.verdict, self.case
        text = verdict.text if verdict.text is not None else case.text
        call = case.tool_call
        if call is not None and verdict.arguments is not None:
            call = call.model_copy(update={"arguments": verdict.arguments})
        return GuardrailContext(
            stage=guardrail.stage,
            guardrail=guardrail.name,
            text=text,
            chat=self.chat,
            message=case.message,
            tool_call=call,
            transcript=self.transcript,
            background=self.background,
            parallel=self.parallel,
        )

    def take(self, guardrail: Guardrail, decision: Any, started: float) -> bool:
        """Record ``decision``; True when the next guardrail judges on."""
        verdict, stage = self.verdict, self.case.stage
        outcome = GuardrailOutcome(
            guardrail=guardrail.name,
            stage=guardrail.stage,
            decision="passed",
            parallel=self.parallel,
            duration_ms=int((time.monotonic() - started) * 1000),
        )
        if isinstance(decision, Pass):
            verdict.outcomes.append(outcome)
            return True
        if isinstance(decision, Block):
            outcome.decision = "blocked"
            outcome.reason = _cut(" ".join(decision.reason.split()) or "no reason given")
            verdict.outcomes.append(outcome)
            verdict.blocked = outcome
            verdict.stop = decision.stop or stage != "tool"
            return False
        wants = "arguments" if stage == "tool" else "text"
        if isinstance(decision, Replace) and getattr(decision, wants) is not None:
            outcome.decision = "replaced"
            if stage == "tool":
                call = self.case.tool_call
                current = verdict.arguments
                if current is None:  # the first replacement: the model's own arguments
                    current = call.arguments if call is not None else {}
                if decision.keep_original:
                    outcome.original = dict(current)
                verdict.arguments = dict(decision.arguments or {})
            else:
                if decision.keep_original:
                    outcome.original = verdict.text if verdict.text is not None else self.case.text
                verdict.text = decision.text
            verdict.outcomes.append(outcome)
            return True
        if isinstance(decision, Replace):
            problem = f"returned Replace({'text' if wants == 'arguments' else 'arguments'}=...)"
            problem += f"; a {stage} guardrail replaces {wants}=..."
        else:
            problem = (
                f"returned {_shown(decision)}, not a decision: return PASS, Block(reason) or "
                f"Replace({wants}=...)"
            )
        self.fail(guardrail, GuardrailError(f"guardrail {guardrail.name!r} {problem}"), started)
        return False

    def fail(self, guardrail: Guardrail, error: BaseException, started: float) -> None:
        """The guardrail failed: judging ends, failing closed."""
        line = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        if not isinstance(error, GuardrailError):
            failure = GuardrailError(
                f"guardrail {guardrail.name!r} ({guardrail.stage}) raised {line}"
            )
            failure.__cause__ = error
        else:
            failure, line = error, str(error)
        self.verdict.outcomes.append(
            GuardrailOutcome(
                guardrail=guardrail.name,
                stage=guardrail.stage,
                decision="error",
                reason=_cut(line.splitlines()[0] if line else ""),
                parallel=self.parallel,
                duration_ms=int((time.monotonic() - started) * 1000),
            )
        )
        self.verdict.error = failure


def _cut(text: str) -> str:
    return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 1] + "…"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def unjudged_inputs(transcript: list[Message]) -> list[Message]:
    """The user messages the next model call answers that input guardrails have not passed:
    those after the latest finished answer (usually one), oldest first."""
    found: list[Message] = []
    for message in reversed(transcript):
        if not message.is_finished:
            continue
        if message.role == "assistant":
            break
        if message.role == "user" and not _input_passed(message):
            found.append(message)
    return found[::-1]


def _input_passed(message: Message) -> bool:
    judged = [outcome for outcome in message.guardrails if outcome.stage == "input"]
    return bool(judged) and all(outcome.decision in ("passed", "replaced") for outcome in judged)


class Guards:
    """A chat's guardrails, and what their verdicts do to its messages and tool calls."""

    def __init__(self, store: ChatStore, emit: Callable[..., None], chat: Any) -> None:
        self.store = store
        self.emit = emit
        self.chat = chat
        guardrails: list[Guardrail] = list(store.config.get_guardrails())
        self.input = [g for g in guardrails if g.stage == "input" and not g.run_in_parallel]
        self.parallel = [g for g in guardrails if g.stage == "input" and g.run_in_parallel]
        self.output = [g for g in guardrails if g.stage == "output"]
        self.tool = [g for g in guardrails if g.stage == "tool"]

    def panels(
        self,
        guardrails: list[Guardrail],
        cases: list[Case],
        transcript: list[Message],
        *,
        parallel: bool = False,
    ) -> list[Panel]:
        before = tuple(finished(transcript))
        return [
            Panel(
                guardrails,
                case,
                chat=self.chat,
                transcript=tuple(m for m in before if m is not case.message),
                background=self.store.runs.background,
                parallel=parallel,
            )
            for case in cases
        ]

    def input_panels(
        self, transcript: list[Message], guardrails: list[Guardrail], *, parallel: bool = False
    ) -> list[Panel]:
        """Panels for the user messages the next model call answers (none without
        ``guardrails``, or when every one has passed them)."""
        if not guardrails:
            return []
        cases = [Case("input", m.content, message=m) for m in unjudged_inputs(transcript)]
        return self.panels(guardrails, cases, transcript, parallel=parallel)

    def answer_panels(
        self, response: ModelResponse, model: str, transcript: list[Message]
    ) -> list[Panel]:
        """Panels for an answer's text: every text a model shows is judged before it is
        kept, a final answer (even an empty one) and the words that come with tool calls
        (none without output guardrails, or for calls that come with no text)."""
        if not self.output or not (response.content or not response.tool_calls):
            return []
        answer = Message(role="assistant", content=response.content,
                         tool_calls=response.tool_calls, model=response.model or model)  # fmt: skip
        return self.panels(self.output, [Case("output", answer.content, answer)], transcript)

    def tool_guardrails(self, call: ToolCall) -> list[Guardrail]:
        return [guardrail for guardrail in self.tool if guardrail.applies_to(call)]

    # -- what verdicts do ----------------------------------------------------------------------
    def settle_input(self, panels: list[Panel], verdicts: list[Verdict]) -> None:
        """Each user message keeps its verdict (one write each; a replaced text is its text
        from now on, and what the model is sent). A block marks it blocked (kept, never
        sent) and stops the chat; a failure fails it (the message is kept as it was)."""
        for panel, verdict in zip(panels, verdicts, strict=False):
            message = panel.case.message
            assert message is not None  # noqa: S101 - input cases are messages
            kept = [outcome for outcome in message.guardrails if outcome.stage != "input"]
            message.guardrails = kept + verdict.outcomes
            if verdict.passed and verdict.text is not None:
                message.content = verdict.text
            if verdict.blocked is not None:
                message.status = MessageStatus.BLOCKED
            self.store.transcript.save_guardrails(message)
            if not verdict.passed:
                self.fail_or_stop(verdict)

    def fail_or_stop(self, verdict: Verdict, *, announce: bool = True) -> None:
        """A verdict that did not pass ends the verb: a failure raises its
        ``GuardrailError``; a block is recorded (with ``announce``, "guardrail_blocked" is
        sent) and raises ``GuardrailBlockedError`` (the release marks the chat stopped)."""
        if verdict.error is not None:
            raise verdict.error
        blocked = verdict.blocked
        assert blocked is not None  # noqa: S101 - not passed: blocked or failed
        if announce:
            self.emit("guardrail_blocked", blocked, True)
        reason = stop_reason(blocked)
        self.store.stopping.record_stop(reason)
        self.emit("stopped", reason)
        raise GuardrailBlockedError(reason, guardrail=blocked.guardrail, stage=blocked.stage)


#: why the usage row of a call the input guardrails did not let stand keeps no answer.
ABANDONED = "abandoned: the input guardrails did not pass the message"


#: ... and of a call whose answer a cancel stopped while guardrails judged it.
UNJUDGED = "cancelled while guardrails judged the answer"


#: longest wait for a check's decision between two looks at the cancel and its time limit.
SLICE = 0.05


#: the run's cancel checkpoint while a check decides: raises ``CancelledError`` at a cancel.
Watch = Callable[[], None]


#: ... from a coroutine (the flag is read as a database phase).
AsyncWatch = Callable[[], Awaitable[None]]


#: wraps work run on a thread of its own (the Django store closes its connections).
Wrap = Callable[[Callable[[], Any]], Callable[[], Any]]


async def _awaited(value: Any) -> Any:
    return await value


def _same(function: Callable[[], Any]) -> Callable[[], Any]:
    return function


def _decide(guardrail: Guardrail, context: GuardrailContext) -> Any:
    """The check's decision, here (an ``async def`` check on an event loop of its own)."""
    decision = guardrail.check(context)
    if inspect.isawaitable(decision):
        decision = async_to_sync(_awaited)(decision)
    return decision


def _on_a_thread(
    guardrail: Guardrail,
    context: GuardrailContext,
    wrap: Wrap,
    deliver: Callable[[Any, BaseException | None], None],
) -> None:
    """Decide on a daemon thread of its own (in a copy of this context), then ``deliver``
    the decision or the error; a thread nobody waits for any more runs on harmlessly."""

    def run() -> None:
        try:
            decision = _decide(guardrail, context)
        except BaseException as exc:  # delivered: the verb fails closed on it
            deliver(None, exc)
        else:
            deliver(decision, None)

    work = partial(contextvars.copy_context().run, wrap(run))
    threading.Thread(target=work, name="agentloop-guardrail", daemon=True).start()


def _timed_out(guardrail: Guardrail, limit: float) -> GuardrailError:
    source = "its timeout=" if guardrail.timeout is not None else "GUARDRAIL_TIMEOUT"
    return GuardrailError(
        f"guardrail {guardrail.name!r} ({guardrail.stage}) did not decide within its "
        f"{limit:g} s time limit ({source})"
    )


def _left(deadline: float | None) -> float:
    if deadline is None:
        return SLICE
    return max(0.0, min(SLICE, deadline - time.monotonic()))


class _Decision:
    """What a check on a thread delivered, once ``done`` is set."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None

    def deliver(self, value: Any, error: BaseException | None) -> None:
        self.value, self.error = value, error
        self.done.set()

    def came(self, started: float, limit: float | None, watch: Watch | None) -> bool:
        """Wait for it: True once it came, False past ``limit``; ``watch`` looks at the
        run's cancel in between (and raises at one)."""
        deadline = None if limit is None else started + limit
        while not self.done.wait(_left(deadline)):
            if watch is not None:
                watch()
            if deadline is not None and time.monotonic() >= deadline:
                return False
        return True


def judge(panels: list[Panel], wrap: Wrap = _same, watch: Watch | None = None) -> list[Verdict]:
    """Judge each panel's case in order, until one does not pass. Each check decides on a
    thread of its own (``wrap`` wraps its work) within its time limit; ``watch`` (the run's
    cancel checkpoint) is looked at while it does."""
    verdicts = []
    for panel in panels:
        for guardrail in panel.guardrails:
            started = time.monotonic()
            limit = guardrail.time_limit()
            decision = _Decision()
            _on_a_thread(guardrail, panel.context(guardrail), wrap, decision.deliver)
            if not decision.came(started, limit, watch):
                assert limit is not None  # noqa: S101 - only a limit ends the wait early
                panel.fail(guardrail, _timed_out(guardrail, limit), started)
                break
            if decision.error is not None:
                panel.fail(guardrail, decision.error, started)
                break
            if not panel.take(guardrail, decision.value, started):
                break
        verdicts.append(panel.verdict)
        if not panel.verdict.passed:
            break
    return verdicts


async def _acheck(guardrail: Guardrail, context: GuardrailContext) -> Any:
    decision = guardrail.check(context)
    if inspect.isawaitable(decision):
        decision = await decision
    return decision


def _deliver_to(
    loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], value: Any, error: Any
) -> None:
    """Hand a thread's decision to a coroutine waiting on ``loop``."""

    def settle() -> None:
        if future.done():  # abandoned meanwhile (cancelled)
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    try:
        loop.call_soon_threadsafe(settle)
    except RuntimeError:  # its loop is closed: nobody waits for it
        pass


def _forget(future: asyncio.Future[Any]) -> None:
    """A decision nobody waits for any more: its error, if any, is read (so that asyncio
    doesn't report it as never retrieved)."""
    if not future.cancelled():
        future.exception()


async def _acame(
    pending: asyncio.Future[Any], started: float, limit: float | None, watch: AsyncWatch | None
) -> bool:
    deadline = None if limit is None else started + limit
    while True:
        done, _ = await asyncio.wait([pending], timeout=_left(deadline))
        if done:
            return True
        if watch is not None:
            await watch()
        if deadline is not None and time.monotonic() >= deadline:
            return False


async def ajudge(
    panels: list[Panel], wrap: Wrap = _same, watch: AsyncWatch | None = None
) -> list[Verdict]:
    """``judge`` from a coroutine: ``async def`` checks as tasks of this loop, sync ones on
    a thread of their own (``wrap`` wraps its work); each within its time limit, ``watch``
    looking at the run's cancel meanwhile."""
    loop = asyncio.get_running_loop()
    verdicts = []
    for panel in panels:
        for guardrail in panel.guardrails:
            started = time.monotonic()
            limit = guardrail.time_limit()
            context = panel.context(guardrail)
            pending: asyncio.Future[Any]
            if guardrail.is_async():
                pending = asyncio.ensure_future(_acheck(guardrail, context))
            else:
                pending = loop.create_future()
                _on_a_thread(guardrail, context, wrap, partial(_deliver_to, loop, pending))
            try:
                came = await _acame(pending, started, limit, watch)
            finally:
                if not pending.done():  # a cancel, or past its limit: abandoned
                    pending.add_done_callback(_forget)
                    pending.cancel()
            if not came:
                assert limit is not None  # noqa: S101 - only a limit ends the wait early
                panel.fail(guardrail, _timed_out(guardrail, limit), started)
                break
            try:
                decision = pending.result()
            except Exception as exc:
                panel.fail(guardrail, exc, started)
                break
            if not panel.take(guardrail, decision, started):
                break
        verdicts.append(panel.verdict)
        if not panel.verdict.passed:
            break
    return verdicts


class Judging:
    """Input guardrails judging while the model call is in flight (``run_in_parallel``)."""

    def __init__(self, panels: list[Panel]) -> None:
        self.panels = panels
        #: set once the verdict will not let the call stand (a block, a replacement, an
        #: error): the call in flight is abandoned (see agentloop.engine._drivers).
        self.stopped = threading.Event()
        #: set once the verdicts are in (``settle``): a waiter may wait on it, bounded.
        self.verdicts_in = threading.Event()
        self.verdicts: list[Verdict] = []
        #: the task judging (the async driver's), cancelled when the verb ends first.
        self.task: Any = None
        #: the verb has applied the verdicts (``Guards.settle_input``).
        self.applied = False

    def settle(self, verdicts: list[Verdict]) -> None:
        self.verdicts = verdicts
        if not all(verdict.clean for verdict in verdicts):
            self.stopped.set()
        self.verdicts_in.set()

    def settle_failed(self, error: BaseException) -> None:
        """The judging itself broke (not a guardrail's own failure): fail closed."""
        panel = self.panels[0]
        if panel.verdict.error is None:
            panel.fail(panel.guardrails[0], error, time.monotonic())
        self.settle([panel.verdict])

    @property
    def settled(self) -> bool:
        return self.verdicts_in.is_set()

    @property
    def passed(self) -> bool:
        """Settled, and every case passed as it was."""
        return self.verdicts_in.is_set() and not self.stopped.is_set()

    def wait(self) -> list[Verdict]:
        self.verdicts_in.wait()
        return self.verdicts


class Judged(Exception):  # noqa: N818 - an outcome, never seen outside the verb
    """The input guardrails judging during the model call did not let it stand."""

    def __init__(self, verdicts: list[Verdict]) -> None:
        super().__init__("the input guardrails did not pass the message")
        self.verdicts = verdicts


def unkept_usage(
    provider: Provider,
    provider_name: str,
    model_id: str,
    started: float,
    response: ModelResponse | None,
    *,
    why: str,
    reservation: Any = None,
) -> UsageRecord:
    """The usage row of a model call whose answer is not kept for ``why`` (the input
    guardrails did not let the call stand; a cancel came while its answer was judged): what
    the provider reported, when it answered. It settles the call's budget ``reservation``."""
    usage = response.usage if response is not None else None
    return UsageRecord(
        provider=provider_name,
        model=model_id,
        status="cancelled",
        usage=usage or TokenUsage(),
        cost=provider.cost(model_id, usage) if usage is not None else None,
        error=why,
        duration_ms=int((time.monotonic() - started) * 1000),
        reservation=reservation,
    )

"""A chat's guardrails (:mod:`agentloop.guardrails`) and what their verdicts do.

A stage's guardrails judge a case (a user message, an answer, a tool call) in order: each
sees the text as the one before left it (a replacement carries on), and the first that does
not pass ends the judging. A :class:`Panel` is a stage's guardrails with the case they judge;
its :class:`Verdict` fills as they decide. Running the checks is an effect (:mod:`.effects`)
the driver performs with :mod:`.judging` (each check bounded by its time limit and the run's
cancel). What the verdicts do (the outcomes kept on the message or call, a replaced text, a
block that stops the chat, an error that fails it) is :class:`Guards`'.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..exceptions import GuardrailBlockedError, GuardrailError
from ..guardrails import Block, Guardrail, GuardrailContext, Pass, Replace
from ..messages import GuardrailOutcome, Message, MessageStatus, ModelResponse, ToolCall
from .store import ChatStore
from .transcript_reading import finished

__all__ = [
    "Case",
    "Guards",
    "Panel",
    "Verdict",
    "stop_reason",
    "unjudged_inputs",
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

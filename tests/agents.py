"""Agents for tests, importable by path so persisted chats can rebuild them in any process.

Their model is ``"agents:test"``: register a :class:`ByInstructions` provider as "agents"
(see :func:`register_agents_provider`), which answers each chat from its own script,
chosen by a marker in the chat's system message. Parent and child chats then never
take each other's replies, whatever order they run in.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from pydantic import BaseModel

from agentloop import Agent, providers
from agentloop.testing import FunctionProvider
from agentloop.tools import AskPerson
from tests.guardrail_checks import no_leaks, no_secrets
from tests.tools import add, step_two, transfer

MODEL = "agents:test"


class Research(Agent):
    """Researches a topic and reports back."""

    model = MODEL
    instructions = "You are RESEARCH. You research {topic}."
    inputs = {"topic": "The subject to research."}


class Writer(Agent):
    """Writes a short text on the task (on a smaller model)."""

    model = "agents:small"
    instructions = "You are WRITER."


class Briefing(Agent):
    """Briefs a reader on a topic."""

    model = MODEL
    instructions = "You are BRIEFING. Brief {reader} on {topic}."
    inputs = ["topic", "reader"]


class Calculator(Agent):
    """Adds numbers with a tool."""

    model = MODEL
    instructions = "You are CALCULATOR."
    tools = [add]
    tool_options = {"calls": "one"}
    temperature = 0.2
    limits = {"max_model_calls": 5}


class Payer(Agent):
    """Pays what it is told to; each transfer waits for a person's approval."""

    model = MODEL
    instructions = "You are PAYER."
    tools = [transfer]


class Interviewer(Agent):
    """Asks the person a question before answering."""

    model = MODEL
    instructions = "You are INTERVIEWER."
    tools = [AskPerson]


class Lead(Agent):
    """Hands research and payments to subagents."""

    model = MODEL
    instructions = "You are LEAD."
    tools = [Research, Payer]


class Director(Agent):
    """Hands whole projects to a lead, who has subagents of its own."""

    model = MODEL
    instructions = "You are DIRECTOR."
    tools = [Lead]


class Verdict(BaseModel):
    guilty: bool
    reason: str


class Judge(Agent):
    """Gives a verdict as structured output."""

    model = MODEL
    instructions = "You are JUDGE."
    schema = Verdict


class Formatter(Agent):
    """Its instructions contain braces that are not inputs."""

    model = MODEL
    instructions = "You are FORMATTER. Reply as {answer} with {{no}} inputs."


class Stepper(Agent):
    """Runs step_two (which can crash its process); model "scripted:test"."""

    model = "scripted:test"
    instructions = "You are STEPPER."
    tools = [step_two]


class ByInstructions(FunctionProvider):
    """Answers each chat from the script whose marker its system message contains (FIFO).

    A reply is anything a scripted reply can be, or a callable taking the request and
    returning one (to signal a test, e.g. that a child started streaming).
    """

    def __init__(self) -> None:
        super().__init__(self._answer)
        self._lock = threading.Lock()
        self.scripts: dict[str, deque[Any]] = {}
        #: (marker, request) per request, in order.
        self.seen: list[tuple[str, Any]] = []

    def script(self, marker: str, *replies: Any) -> ByInstructions:
        """Queue replies for chats whose system message contains ``marker``."""
        with self._lock:
            self.scripts.setdefault(marker, deque()).extend(replies)
        return self

    def requests_of(self, marker: str) -> list[Any]:
        return [request for seen, request in self.seen if seen == marker]

    def assert_complete(self) -> None:
        left = {marker: len(replies) for marker, replies in self.scripts.items() if replies}
        if left:
            raise AssertionError(f"scripted replies left unused: {left}")

    def _answer(self, request: Any) -> Any:
        system = " ".join(m.content for m in request.messages if m.role == "system")
        with self._lock:
            for marker, replies in self.scripts.items():
                if marker in system:
                    self.seen.append((marker, request))
                    if not replies:
                        raise AssertionError(f"no scripted reply left for {marker}")
                    item = replies.popleft()
                    break
            else:
                raise AssertionError(f"no script for a chat instructed {system!r}")
        return item(request) if callable(item) else item


def register_agents_provider() -> ByInstructions:
    """A fresh :class:`ByInstructions` registered as "agents" (unregister it after)."""
    provider = ByInstructions()
    providers.register("agents", provider)
    return provider


class GuardedAgent(Agent):
    """Answers under guardrails (on the "scripted" test model)."""

    model = "scripted:test"
    instructions = "You are GUARDED."
    guardrails = [no_secrets, no_leaks]


class Vetted(Agent):
    """Does a task, under an input guardrail (its task is a user message it judges)."""

    model = MODEL
    instructions = "You are VETTED."
    guardrails = [no_secrets]


class Manager(Agent):
    """Hands tasks to a vetted subagent."""

    model = MODEL
    instructions = "You are MANAGER."
    tools = [Vetted]

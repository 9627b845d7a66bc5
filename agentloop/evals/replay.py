"""Replaying one turn: a stored conversation up to a user turn, answered by a candidate.

The replay is an in-memory conversation (no ``Chat`` row, no ``Usage`` row): nothing of it
reaches an owner's chat list, usage charts or budgets. Its tools answer from the recording:
a call whose tool name and arguments equal a recorded call's gets that call's result; any
other gets an error result saying there is no recording (and is counted). A tool named in
``live`` runs for real. No replayed call waits for a person: approvals and deferred results
have no one to come from in an eval.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from ..engine import Conversation, MemoryStore
from ..exceptions import AgentloopError, ConfigurationError, ToolError
from ..import_paths import load_by_path
from ..messages import Message, MessageStatus
from ..tools import Tool, format_result, load_tool

__all__ = [
    "DEFAULT_LIMITS",
    "NO_RECORDING",
    "Attempt",
    "Candidate",
    "Recording",
    "Replaying",
    "Turn",
    "attempt_of",
    "replay",
    "start_replay",
]

#: a replay's limits unless its run's ``settings["limits"]`` says otherwise.
DEFAULT_LIMITS: dict[str, Any] = {"max_model_calls": 20}

#: the result of a call that matches no recorded call.
NO_RECORDING = "No recording: this eval has no recorded result of {name} with these arguments."


def _key(name: str, arguments: dict[str, Any]) -> tuple[str, str]:
    return name, json.dumps(arguments, sort_keys=True, default=str)


class Recording:
    """Recorded tool results by tool name and arguments, served in the order recorded (the
    last one again once they are used up)."""

    def __init__(self, messages: list[Message]) -> None:
        results = {m.tool_call_id: m for m in messages if m.role == "tool"}
        self._results: dict[tuple[str, str], deque[tuple[str, bool]]] = defaultdict(deque)
        self._last: dict[tuple[str, str], tuple[str, bool]] = {}
        for message in messages:
            for call in message.tool_calls:
                result = results.get(call.id)
                if result is not None:
                    key = _key(call.name, call.arguments)
                    self._results[key].append((result.content, result.is_error))
                    self._last[key] = (result.content, result.is_error)
        self._lock = threading.Lock()

    def take(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool] | None:
        """The next recorded (content, is_error) of this call; None when there is none."""
        key = _key(name, arguments)
        with self._lock:
            queue = self._results.get(key)
            if queue:
                return queue.popleft()
            return self._last.get(key)


@dataclass
class Turn:
    """What one case replays: the history up to and including the user turn, and the
    recorded messages of the whole conversation (the tool results to serve)."""

    history: list[Message]
    recorded: list[Message]
    #: the source chat's tool references (offered when the candidate names none).
    tools: list[str] = field(default_factory=list)


@dataclass
class Candidate:
    """What answers: a model and, optionally, instructions, tools, an agent, settings."""

    model: str
    provider: str | None = None
    instructions: str | None = None
    tools: list[str] = field(default_factory=list)
    agent_path: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    #: tool names that run for real.
    live_tools: list[str] = field(default_factory=list)


@dataclass
class Attempt:
    """What the candidate did with one turn."""

    answer: str = ""
    #: one dict per call: name, arguments, result, is_error, source.
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    unmatched_calls: int = 0
    cost: Decimal | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    latency_ms: int = 0
    error: str = ""
    #: the replay's messages after the user turn.
    messages: list[Message] = field(default_factory=list)


class _Calls:
    """The calls one replay made (tools may run on threads)."""

    def __init__(self) -> None:
        self.made: list[dict[str, Any]] = []
        self.unmatched = 0
        self._lock = threading.Lock()

    def add(self, entry: dict[str, Any], unmatched: bool = False) -> None:
        with self._lock:
            self.made.append(entry)
            self.unmatched += unmatched


def _replayed(original: type[Tool], recording: Recording, calls: _Calls, live: bool) -> type:
    """``original`` as the model sees it (name, description, parameters), answered from the
    recording, or run for real when ``live``."""

    def execute(self: Tool, *args: Any, **arguments: Any) -> Any:
        raw = dict(self.tool_call.arguments)
        entry: dict[str, Any] = {"name": self.name, "arguments": raw}
        if live:
            try:
                result = original.execute(self, *args, **arguments)
            except Exception as exc:
                calls.add({**entry, "result": str(exc), "is_error": True, "source": "ran"})
                raise
            shown = format_result(result)
            calls.add({**entry, "result": shown, "is_error": False, "source": "ran"})
            return result
        found = recording.take(self.name, raw)
        if found is None:
            text = NO_RECORDING.format(name=self.name)
            calls.add({**entry, "result": text, "is_error": True, "source": "no recording"}, True)
            raise ToolError(text)
        content, is_error = found
        calls.add({**entry, "result": content, "is_error": is_error, "source": "recorded"})
        if is_error:
            raise ToolError(content)
        return content

    attributes = {
        "name": original.name, "description": original.description, "execute": execute,
        "__module__": original.__module__, "requires_approval": False, "deferred": False,
        "transactional": False,
    }  # fmt: skip
    return type(f"Replayed{original.__name__}", (original,), attributes)


def _conversation(turn: Turn, candidate: Candidate) -> Conversation[Message]:
    """An in-memory conversation configured as the candidate, holding the history."""
    store = MemoryStore()
    conversation: Conversation[Message] = Conversation(store)
    references = candidate.tools or turn.tools
    if references:
        conversation.with_tools(*(load_tool(reference) for reference in references))
    # Configured before the history goes in: instructions set here are the first message,
    # and the recorded ones are then left out.
    if candidate.agent_path:
        load_by_path(candidate.agent_path).configure(conversation)
    conversation.with_model(candidate.model, candidate.provider or None)
    if candidate.instructions is not None:
        conversation.with_instructions(candidate.instructions)
    instructed = any(m.role == "system" for m in store.messages)
    for n, message in enumerate(turn.history):
        if instructed and message.role == "system":
            continue
        copy = message.model_copy(deep=True, update={"key": None, "created_at": None})
        stored = store.append_message(copy)
        for call in stored.tool_calls:
            call.key = f"{call.id}@history{n}"
    settings = candidate.settings
    if settings.get("temperature") is not None:
        conversation.with_temperature(settings["temperature"])
    if settings.get("max_output_tokens") is not None:
        conversation.with_max_output_tokens(settings["max_output_tokens"])
    if settings.get("provider_options"):
        conversation.with_provider_options(**settings["provider_options"])
    # A candidate that keeps calling tools must not hold a worker forever.
    conversation.with_limits(**{**DEFAULT_LIMITS, **(settings.get("limits") or {})})
    return conversation


@dataclass
class Replaying:
    """A turn being replayed: the in-memory conversation (configured as the candidate, its
    tools answering from the recording) and the calls its tools were asked so far."""

    conversation: Conversation[Message]
    calls: _Calls


def start_replay(
    turn: Turn,
    candidate: Candidate,
    *,
    so_far: list[Message] | tuple[Message, ...] = (),
    calls_so_far: list[dict[str, Any]] | tuple[dict[str, Any], ...] = (),
) -> Replaying:
    """The conversation of ``turn`` as ``candidate`` answers it, continued from ``so_far``
    (the messages a batch round left after the user turn, whose tool calls are
    ``calls_so_far``: their recorded results are not served again). Raises
    ConfigurationError (and the candidate's own setup errors) when it can't be set up."""
    if not turn.history or turn.history[-1].role != "user":
        raise ConfigurationError("An eval turn's history must end with a user message.")
    calls = _Calls()
    recording = Recording(turn.recorded)
    for entry in calls_so_far:
        calls.add(dict(entry), entry.get("source") == "no recording")
        if entry.get("source") == "recorded":
            recording.take(entry["name"], entry["arguments"])
    conversation = _conversation(
        Turn([*turn.history, *so_far], turn.recorded, turn.tools), candidate
    )
    live = set(candidate.live_tools)
    tools = [
        _replayed(tool, recording, calls, name in live)
        for name, tool in conversation.tools().items()
    ]
    if tools:
        conversation.with_tools(*tools, replace=True)
    return Replaying(conversation, calls)


def attempt_of(replaying: Replaying, error: str = "", latency_ms: int = 0) -> Attempt:
    """What the replay came to so far: the answer, the calls, the cost and tokens of the
    model calls made in this conversation, and its error (``error``, else its stop)."""
    conversation = replaying.conversation
    store: Any = conversation.store
    attempt = Attempt(error=error, latency_ms=latency_ms)
    costs = [record.cost for _, record in store.usage if record.cost is not None]
    attempt.cost = sum(costs, Decimal(0)) if costs else None
    attempt.input_tokens = sum(record.usage.input_tokens for _, record in store.usage)
    attempt.output_tokens = sum(record.usage.output_tokens for _, record in store.usage)
    transcript = conversation.messages
    turn_at = max(i for i, m in enumerate(transcript) if m.role == "user")
    attempt.messages = transcript[turn_at + 1 :]
    answers = [
        m for m in attempt.messages if m.role == "assistant" and m.status != MessageStatus.PARTIAL
    ]
    attempt.answer = answers[-1].content if answers else ""
    attempt.tool_calls, attempt.unmatched_calls = replaying.calls.made, replaying.calls.unmatched
    if not attempt.error and store.stop_reason:
        attempt.error = f"stopped: {store.stop_reason}"
    return attempt


def replay(turn: Turn, candidate: Candidate) -> Attempt:
    """Answer ``turn`` with ``candidate``: its final answer, its calls, cost and latency (an
    error of the candidate or its provider is the attempt's ``error``, never raised)."""
    if not turn.history or turn.history[-1].role != "user":
        raise ConfigurationError("An eval turn's history must end with a user message.")
    try:
        replaying = start_replay(turn, candidate)
    except (AgentloopError, ImportError, ValueError) as exc:
        return Attempt(error=f"The candidate could not be set up: {exc}")
    started = time.perf_counter()
    error = ""
    try:
        replaying.conversation.complete()
    except AgentloopError as exc:
        error = str(exc) or type(exc).__name__
    return attempt_of(replaying, error, round((time.perf_counter() - started) * 1000))

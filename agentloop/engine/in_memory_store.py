"""The in-memory store: a chat kept in this process's memory (``agentloop.chat()``).

One object is every part of this store (``store.config`` is ``store``, and so on): its
state is a handful of Python lists and dicts that every part reads, so splitting them
would only add references between the pieces."""

from __future__ import annotations

import itertools
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from ..exceptions import ChatBusyError, ConcurrentWriteError, DecisionConflictError
from ..messages import Message, MessageStatus, ToolCall, ToolCallState
from ._chat_config import ChatConfig
from ._transcript_reading import pending_round
from .store import (
    SUPERSEDED_DECISION,
    ChatStore,
    Configuration,
    Costs,
    Edits,
    Forks,
    Handoffs,
    Inbox,
    RunClaim,
    Stopping,
    Superseded,
    ToolCalls,
    Tracing,
    Transcript,
    UsageRecord,
)

__all__ = ["MemoryStore"]


def _now() -> datetime:
    return datetime.now(UTC)


class MemoryStore(
    ChatStore, Configuration, RunClaim, Transcript, ToolCalls, Stopping, Inbox, Costs, Tracing,
    Handoffs, Edits, Forks,
):  # fmt: skip
    """Transcript, usage and the cancel flag as Python objects; returns engine Messages.
    Every part but ``transactions`` and ``budgets`` (no database to share, no budgets)."""

    def __init__(self, config: ChatConfig | None = None) -> None:
        self.config = self.runs = self.transcript = self.tool_calls = self.stopping = self
        self.inbox = self.costs = self.tracing = self.handoffs = self.edits = self.forks = self
        self.chat_config = config or ChatConfig()
        self.tools: list[Any] = []
        self.guardrails: list[Any] = []
        self.messages: list[Message] = []
        self.usage: list[tuple[datetime, UsageRecord]] = []
        self.tool_errors: dict[str, str] = {}
        #: who decided what about waiting calls, by call id.
        self.decisions: dict[str, dict[str, Any]] = {}
        self.stop_reason: str = ""
        #: the latest answer's key and its reported input tokens (compaction's estimate).
        self.reported_input: tuple[Any, int] | None = None
        #: a halt asked for during the run, applied before its next model call.
        self.halt_reason: str = ""
        self._cancel_requested_at: datetime | None = None
        self._notice = threading.Event()
        self.cancel_notice = self._notice
        self._keys = itertools.count(1)
        # cancel() comes from other threads; everything else from the running one.
        self._lock = threading.Lock()
        #: user messages sent while a verb held the chat, added when it can take them.
        self.queued: list[Message] = []
        #: the thread whose verb holds the chat.
        self._holder: int | None = None
        #: the current turn's trace context, and how spans name the chat and its agent.
        self.trace_carrier: dict[str, str] = {}
        self.agent_name = ""
        self._trace_id = ""
        #: the agent this chat follows (``Agent.chat()``, a handoff), the inputs it was given
        #: and the digest of what was applied (see ``agentloop.agents.agent_refresh``).
        self.agent: Any = None
        self.agent_inputs: dict[str, Any] = {}
        self.agent_digest = ""
        #: a fork's origin: the store it was forked from and the key of the message it was
        #: forked at (None: not a fork).
        self.forked_from: tuple[MemoryStore, Any] | None = None
        #: something was superseded once (superseded_calls() has something to look at).
        self._edited = False

    def trace_names(self) -> tuple[str, str]:
        if not self._trace_id:  # made on first use: an untraced chat never pays for it
            self._trace_id = uuid.uuid4().hex
        return self._trace_id, self.agent_name

    def trace_context(self) -> dict[str, str]:
        return self.trace_carrier

    def set_trace_context(self, carrier: dict[str, str]) -> None:
        self.trace_carrier = carrier

    def queue_message(self, message: Message) -> None:
        with self._lock:
            self.queued.append(message)

    def has_queued(self) -> bool:
        return bool(self.queued)

    def take_queued(self) -> list[Message]:
        with self._lock:
            taken, self.queued = self.queued, []
        return taken

    def claim(self) -> bool:
        me = threading.get_ident()
        with self._lock:
            if self._holder not in (None, me):
                raise ChatBusyError("Another thread is running a verb of this chat.")
            if self._holder == me:
                return False  # a verb inside a verb: the outer one releases
            self._holder = me
            return True

    def release(self, next_move: str | None, *, failure: BaseException | None = None) -> None:
        with self._lock:
            if self._holder != threading.get_ident():
                return
            self._holder = None
            if failure is None and next_move == "done":
                # A cancel that came as the turn finished has nothing left to stop.
                self._cancel_requested_at = None

    def get_config(self) -> ChatConfig:
        return self.chat_config

    def update_config(self, **changes: Any) -> None:
        self.chat_config = self.chat_config.model_copy(update=changes)

    def set_tools(self, tools: list[Any]) -> None:
        self.tools = list(tools)

    def get_tools(self) -> list[Any]:
        return self.tools

    def set_guardrails(self, guardrails: list[Any]) -> None:
        self.guardrails = list(guardrails)

    def get_guardrails(self) -> list[Any]:
        return self.guardrails

    def load_transcript(self) -> list[Message]:
        # Copies, so the engine's view can't be changed behind its back.
        return [
            message.model_copy(deep=True) for message in self.messages if not message.superseded
        ]

    def load_history(self) -> list[Message]:
        return [message.model_copy(deep=True) for message in self.messages]

    def _add(self, message: Message) -> Message:
        stored = message.model_copy(
            update={"key": next(self._keys), "created_at": message.created_at or _now()}
        )
        self.messages.append(stored)
        return stored

    def _find(self, key: Any) -> Message:
        for message in self.messages:
            if message.key == key:
                return message
        raise KeyError(key)

    def append_message(self, message: Message) -> Message:
        if message.role == "user":
            self.stop_reason = self.halt_reason = ""
            with self._lock:
                self._cancel_requested_at = None  # a new turn never inherits a cancel
        stored = self._add(message)
        message.key, message.created_at = stored.key, stored.created_at
        return stored

    @contextmanager
    def atomic(self) -> Iterator[None]:
        # What a handoff changes (configuration, tools, instructions, agent) is put back
        # when it fails halfway, as a database transaction would be.
        saved = (
            self.chat_config, list(self.tools), list(self.guardrails),
            [m.model_copy(deep=True) for m in self.messages],
            self.agent, self.agent_inputs, self.agent_digest, self.agent_name,
        )  # fmt: skip
        try:
            yield
        except BaseException:
            (self.chat_config, self.tools, self.guardrails, self.messages, self.agent,
             self.agent_inputs, self.agent_digest, self.agent_name) = saved  # fmt: skip
            raise

    def save_guardrails(self, message: Message) -> None:
        stored = self._find(message.key)
        stored.content, stored.status = message.content, message.status
        stored.guardrails = [outcome.model_copy() for outcome in message.guardrails]

    def replace_instructions(self, text: str) -> None:
        first = next((m for m in self.messages if m.role == "system"), None)
        if first is None:
            self._add(Message(role="system", content=text))
            return
        first.content = text
        self.messages = [m for m in self.messages if m.role != "system" or m is first]

    def save_partial(self, content: str, partial_key: Any, model: str) -> Any:
        if partial_key is None:
            partial = Message(
                role="assistant", content=content, status=MessageStatus.PARTIAL, model=model
            )
            return self._add(partial).key
        self._find(partial_key).content = content
        return partial_key

    def save_answer(
        self,
        message: Message,
        usage: UsageRecord,
        partial_key: Any = None,
        *,
        release: str | None = None,
    ) -> Message:
        for call in message.tool_calls:
            call.key = f"{call.id}@{next(self._keys)}"
        original = message
        message = message.model_copy(deep=True)
        if partial_key is not None:
            index = self.messages.index(self._find(partial_key))
            stored = message.model_copy(
                update={"key": partial_key, "created_at": self.messages[index].created_at}
            )
            self.messages[index] = stored
        else:
            stored = self._add(message)
        self.usage.append((_now(), usage))
        if usage.usage.input_tokens and message.role == "assistant":  # not a summary's call
            self.reported_input = (stored.key, usage.usage.input_tokens)
        self.stop_reason = ""
        original.key = stored.key
        if release is not None:
            self.release(release)  # the same write gives the claim up, as the contract says
        return stored

    def record_usage(self, usage: UsageRecord) -> None:
        self.usage.append((_now(), usage))

    def last_input_tokens(self) -> tuple[Any, int] | None:
        return self.reported_input

    def _call(self, call: ToolCall) -> ToolCall:
        for message in self.messages:
            for stored in message.tool_calls:
                if stored.key == call.key:
                    return stored
        raise KeyError(call.key)

    def fail_partial(self, partial_key: Any) -> None:
        self._find(partial_key).status = MessageStatus.FAILED

    def mark_tool_running(self, call: ToolCall) -> bool:
        stored = self._call(call)
        if stored.state != call.state:
            return False
        stored.state = ToolCallState.RUNNING
        self._keep_guardrails(call, stored)
        return True

    @staticmethod
    def _keep_guardrails(call: ToolCall, stored: ToolCall) -> None:
        if call.guardrails:
            stored.guardrails = [outcome.model_copy() for outcome in call.guardrails]
            stored.arguments = dict(call.arguments)
            if call.original_arguments is not None:
                stored.original_arguments = dict(call.original_arguments)

    def save_tool_guardrails(self, call: ToolCall) -> None:
        self._keep_guardrails(call, self._call(call))

    def save_tool_result(
        self,
        call: ToolCall,
        message: Message,
        state: ToolCallState,
        error: str | None,
        *,
        release: str | None = None,
    ) -> Message:
        if any(m.role == "tool" and m.tool_call_id == call.id for m in self.messages):
            raise ConcurrentWriteError(f"Tool call {call.id!r} already has a result.")
        self._call(call).state = state
        if error:
            self.tool_errors[call.id] = error
        stored = self._add(message)
        message.key = stored.key
        if release is not None:
            self.release(release)  # the same write gives the claim up, as the contract says
        return stored

    def mark_tool_waiting(self, call: ToolCall, reason: str, question: str | None = None) -> None:
        stored = self._call(call)
        stored.state = ToolCallState.WAITING
        stored.wait_reason = reason
        stored.question = question
        self._keep_guardrails(call, stored)

    def record_handoff(self, call: ToolCall, handoff: dict[str, Any]) -> None:
        self._call(call).handoff = dict(handoff)

    def record_decision(
        self, call: ToolCall, decision: str, *, by: Any, reason: str, result: Message | None
    ) -> Message | None:
        stored = self._call(call)
        if stored.state != ToolCallState.WAITING or stored.wait_reason != call.wait_reason:
            raise DecisionConflictError(
                f"Tool call {call.id!r} ({call.name}) is no longer waiting: another decision "
                "(or the run) got there first. Nothing was changed."
            )
        stored.decision = decision
        stored.decision_digest = call.arguments_digest()
        if call.original_arguments is not None:
            stored.arguments, stored.original_arguments = call.arguments, call.original_arguments
        self.decisions[call.id] = {"decision": decision, "by": by, "reason": reason, "at": _now()}
        if result is None:
            stored.state = ToolCallState.PENDING  # approved: runs at the next step
            return None
        state = ToolCallState.FAILED if result.is_error else ToolCallState.SUCCEEDED
        return self.save_tool_result(call, result, state, None)

    def native_message(self, message: Message) -> Message:
        return self._find(message.key)

    def native_tool_call(self, call: ToolCall) -> ToolCall:
        return call

    # -- editing -------------------------------------------------------------------------
    def supersede(self, first: Message) -> Superseded:
        start = self.messages.index(self._find(first.key))
        answered = {m.tool_call_id for m in self.messages if m.role == "tool"}
        done = (ToolCallState.SUCCEEDED, ToolCallState.FAILED, ToolCallState.CANCELLED)
        marked = Superseded()
        for message in self.messages[start:]:
            if message.role == "system" or message.superseded:
                continue  # the instructions are configuration, not conversation
            message.superseded = True
            marked.keys.append(message.key)
            for call in message.tool_calls:
                if call.id in answered or call.state in done:
                    continue
                if call.state == ToolCallState.WAITING:
                    call.decision = SUPERSEDED_DECISION
                    self.decisions[call.id] = {
                        "decision": SUPERSEDED_DECISION, "by": None, "reason": "", "at": _now(),
                    }  # fmt: skip
                call.state = ToolCallState.CANCELLED
                marked.open_calls.append(call.model_copy())
        if self.reported_input is not None and self.reported_input[0] in marked.keys:
            self.reported_input = None  # that request held rows no request sends again
        self._edited = self._edited or bool(marked.keys)
        return marked

    def superseded_calls(self) -> list[ToolCall]:
        if not self._edited:
            return []
        return [call for m in self.messages if m.superseded for call in m.tool_calls]

    def fork(self, at: Message, open_call_result: str) -> MemoryStore:
        forked = MemoryStore(self.chat_config.model_copy(deep=True))
        forked.tools = list(self.tools)
        forked.agent_name = self.agent_name
        forked.agent, forked.agent_inputs = self.agent, dict(self.agent_inputs)
        forked.agent_digest = self.agent_digest
        forked.forked_from = (self, at.key)
        current = [m for m in self.messages if not m.superseded]
        end = next(i for i, m in enumerate(current) if m.key == at.key)
        rows = [m for m in current[: end + 1] if m.status != MessageStatus.PARTIAL]
        answered = {m.tool_call_id for m in rows if m.role == "tool"}
        keys: dict[Any, Any] = {}
        open_calls: list[ToolCall] = []
        for message in rows:
            copy = message.model_copy(deep=True, update={"key": None, "created_at": None})
            through = copy.provider_data.get("summarizes_through")
            if copy.role == "summary" and through in keys:
                copy.provider_data = {**copy.provider_data, "summarizes_through": keys[through]}
            stored = forked._add(copy)
            keys[message.key] = stored.key
            for call in stored.tool_calls:
                call.key = f"{call.id}@{next(forked._keys)}"
                if call.id not in answered:
                    call.state = ToolCallState.CANCELLED
                    open_calls.append(call)
        for call in open_calls:  # answered at the end of the copy: the fork never runs them
            forked._add(
                Message(
                    role="tool", content=open_call_result, tool_call_id=call.id,
                    tool_name=call.name, is_error=True,
                )
            )  # fmt: skip
        return forked

    def cancel_requested_at(self) -> datetime | None:
        return self._cancel_requested_at

    def request_cancel(self) -> bool:
        waiting = any(
            call.state == ToolCallState.WAITING for m in self.messages for call in m.tool_calls
        )
        with self._lock:
            if self._holder is None and not waiting:
                return False  # nothing runs: nothing to cancel, and nothing is left set
            if self._cancel_requested_at is None:
                self._cancel_requested_at = _now()
        self._notice.set()
        return True

    def record_cancellation(
        self,
        requested_at: datetime | None,
        *,
        partial: Message | None,
        partial_key: Any,
        usage: UsageRecord | None,
        unanswered: list[ToolCall],
    ) -> None:
        with self._lock:
            flag = self._cancel_requested_at
            if flag is not None and (requested_at is None or flag <= requested_at):
                self._cancel_requested_at = None
        if partial is not None:
            if partial_key is not None:
                stored = self._find(partial_key)
                stored.content = partial.content
                stored.status = MessageStatus.CANCELLED
            else:
                self._add(partial.model_copy(update={"status": MessageStatus.CANCELLED}))
        elif partial_key is not None:
            # An earlier attempt's partial, its retry cut short before any text came.
            self._find(partial_key).status = MessageStatus.CANCELLED
        if usage is not None:
            self.usage.append((_now(), usage))
        for call in unanswered:
            left = self._call(call)
            if left.state in (ToolCallState.SUCCEEDED, ToolCallState.FAILED):
                continue  # a decision answered it first
            if left.state == ToolCallState.WAITING:
                self._decide_cancelled(left)
            left.state = ToolCallState.CANCELLED

    def _decide_cancelled(self, call: ToolCall) -> None:
        call.decision = "cancelled"
        self.decisions[call.id] = {"decision": "cancelled", "by": None, "reason": "", "at": _now()}

    def cancel_held(self, result: str) -> list[Message] | None:
        with self._lock:
            round_ = pending_round(self.messages)  # the stored calls themselves
            held = (ToolCallState.WAITING, ToolCallState.PENDING)
            if self._holder is not None or not any(
                call.state in held for call in round_.unanswered
            ):
                return None
            self._cancel_requested_at = None
            records = []
            for call in round_.unanswered:
                if call.state == ToolCallState.WAITING and call.wait_reason != "subagent":
                    self._decide_cancelled(call)
                elif call.state != ToolCallState.PENDING:
                    continue
                call.state = ToolCallState.CANCELLED
                answer = Message(
                    role="tool", content=result, tool_call_id=call.id, tool_name=call.name,
                    is_error=True,
                )  # fmt: skip
                records.append(self._add(answer))
            return records

    def record_stop(self, reason: str) -> None:
        self.stop_reason, self.halt_reason = reason, ""

    def request_halt(self, reason: str) -> bool:
        with self._lock:
            if self._holder is None:
                return False  # nothing runs: nothing to halt, and nothing is left set
            self.halt_reason = reason
        return True

    def halt_requested(self) -> str:
        return self.halt_reason

    def turn_cost(self, since: datetime) -> Decimal:
        return sum(
            (record.cost for at, record in self.usage if at >= since and record.cost is not None),
            Decimal(0),
        )

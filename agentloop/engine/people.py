"""People in the loop: approvals, questions, and calls waiting on subagents."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..exceptions import DecisionConflictError, InvalidArgumentsError, ToolCallNotWaitingError
from ..messages import Message, ToolCall, ToolCallState
from ..tools import arguments_problem, format_result
from .store import ChatStore
from .tool_runner import DENIED_RESULT
from .transcript_reading import pending_round

__all__ = ["PeopleInTheLoop"]

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

"""An MCP server's questions on a call's ``ToolCall`` row: written and read by the process
whose call is held open (:class:`QuestionDesk`), answered by a person (:func:`respond`).

While a question is pending the row keeps ``state="running"`` (the call runs: its server
waits) with ``wait_reason="elicitation"``, the server's message in ``question`` and
``elicitation`` = ``{"server", "message", "schema", "response": null}``. The first of a
person's answer and the holder's timeout or stop clears ``wait_reason`` in one conditional
UPDATE and writes the response; the other finds nothing to change. The holder reads the row
between naps and gives its connection back after each read (``waiting.release_connection``).
"""

from __future__ import annotations

import json
from typing import Any

from django.db.models import Model, QuerySet
from django.db.models.functions import Now
from django.utils import timezone

from ..exceptions import DecisionConflictError, InvalidAnswerError, ToolCallNotWaitingError
from ..messages import ToolCallState
from ..tools.mcp.elicitation import ACTIONS, ELICITATION, content_problem
from .waiting import release_connection

__all__ = ["QuestionDesk", "find_question", "pending_questions", "respond"]


class QuestionDesk:
    """One call's questions, for the process holding the call open (docs/mcp.md)."""

    def __init__(self, calls: QuerySet[Any], key: Any) -> None:
        self.rows = calls.filter(pk=key)
        self.using = calls.db
        self.asked: dict[str, Any] = {}

    def open(self, server: str, message: str, schema: dict[str, Any]) -> None:
        self.asked = {"server": server, "message": message, "schema": schema, "response": None}
        self.rows.update(
            wait_reason=ELICITATION, question=message, waiting_since=Now(), elicitation=self.asked
        )
        release_connection(self.using)

    def response(self) -> dict[str, Any] | None:
        stored = self.rows.values_list("elicitation", flat=True).first()
        release_connection(self.using)  # a person may take minutes: hold nothing meanwhile
        answer = stored.get("response") if isinstance(stored, dict) else None
        return answer if isinstance(answer, dict) else None

    def settle(self, action: str, reason: str) -> dict[str, Any]:
        response = {"action": action, "content": None, "reason": reason, "at": _now()}
        closed = self.rows.filter(wait_reason=ELICITATION).update(
            wait_reason="", elicitation={**self.asked, "response": response}
        )
        if not closed:  # a person answered at the same moment: that answer stands
            response = self.response() or response
        release_connection(self.using)
        return response


def _now() -> str:
    return timezone.now().isoformat()


def pending_questions(calls: QuerySet[Any]) -> list[Any]:
    """The calls among ``calls`` whose MCP server waits for a person's answer."""
    return list(calls.filter(state=ToolCallState.RUNNING, wait_reason=ELICITATION).order_by("id"))


def find_question(calls: QuerySet[Any], tool_call_id: Any) -> Any:
    """The call named by ``tool_call_id`` (a row, its pk, or its provider call id) when its
    server waits for an answer now; None otherwise."""
    key = getattr(tool_call_id, "pk", tool_call_id)
    for call in pending_questions(calls):
        if call.pk == key or str(call.pk) == str(key) or call.call_id == key:
            return call
    return None


def respond(call: Model, action: str, content: Any = None, by: Any = None) -> None:
    """A person's answer to ``call``'s pending question: ``accept`` with ``content`` (checked
    against the requested schema: ``InvalidAnswerError``, nothing written), ``decline`` or
    ``cancel``. ``DecisionConflictError`` when it stopped waiting meanwhile."""
    if action not in ACTIONS:
        raise InvalidAnswerError(f"An answer's action is one of {', '.join(ACTIONS)}: {action!r}.")
    asked: dict[str, Any] = getattr(call, "elicitation", None) or {}
    if action == "accept":
        if isinstance(content, str):
            try:
                content = json.loads(content)
            except ValueError as exc:
                raise InvalidAnswerError(
                    f"Invalid answer to {getattr(call, 'name', '')!r}: not JSON ({exc})."
                ) from None
        problem = content_problem(asked.get("schema") or {}, content)
        if problem is not None:
            raise InvalidAnswerError(f"Invalid answer to {getattr(call, 'name', '')!r}: {problem}")
    else:
        content = None
    response = {
        "action": action,
        "content": content,
        "by": getattr(by, "pk", None),
        "at": _now(),
        "reason": "",
    }
    rows = type(call)._default_manager.using(call._state.db)
    changed = rows.filter(pk=call.pk, state=ToolCallState.RUNNING, wait_reason=ELICITATION).update(
        wait_reason="", elicitation={**asked, "response": response}
    )
    if not changed:
        raise DecisionConflictError(
            f"Tool call {getattr(call, 'call_id', call.pk)!r} no longer waits for an answer: "
            "the question timed out, was answered, or its call ended. Nothing was changed."
        )


def not_a_question(tool_call_id: Any) -> ToolCallNotWaitingError:
    """The error for a decline of a call whose server asks nothing now."""
    return ToolCallNotWaitingError(
        f"Tool call {getattr(tool_call_id, 'pk', tool_call_id)!r} has no question from an MCP "
        "server waiting for an answer."
    )

"""An MCP server's questions (elicitation) answered by a person, while its call is held open.

A server with ``"elicitation": True`` in its ``MCP_SERVERS`` entry may ask for input while
one of its tools runs (``elicitation/create``: a message and the JSON schema of the answer
it wants). The call stays open in the process running it (a Celery worker, or the one
driving the chat in-process): the question is written on the call's ``ToolCall`` row
(:class:`QuestionDesk`, given by the chat), the chat lists it among its pending questions,
and this thread reads the row every ``ANSWER_POLL_INTERVAL`` seconds, giving its database
connection back between reads, until a person answers (accept with content, decline, or
cancel), the chat is cancelled, or ``elicitation_timeout`` passes (the server then hears
"cancel"). The answer goes back to the server on the same session and the call goes on.

Why held open rather than run again once answered: an MCP tool may have done half its work
before it asks (booked, charged, sent), and nothing in the protocol says a tool is
idempotent; running it a second time to replay an answer could do that work twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from ...conf import agentloop_settings
from ._connections import Stopped
from ._settings import ServerSettings

__all__ = [
    "ACTIONS",
    "ANSWER_POLL_INTERVAL",
    "ELICITATION",
    "QuestionDesk",
    "content_problem",
    "person_answers",
]

#: the ``wait_reason`` of a call whose server waits for a person's answer.
ELICITATION = "elicitation"
#: what a person may answer: accept (with content), decline, or cancel (dismiss).
ACTIONS = ("accept", "decline", "cancel")
#: seconds between two reads of a pending question's row (or CANCEL_POLL_INTERVAL, if longer).
ANSWER_POLL_INTERVAL = 0.5


class QuestionDesk(Protocol):
    """Where one call's questions are written and their answers read (a chat provides it)."""

    def open(self, server: str, message: str, schema: dict[str, Any]) -> None:
        """Write the question on the call: it is pending from now on."""

    def response(self) -> dict[str, Any] | None:
        """The person's answer (``{"action", "content"}``), None while there is none."""

    def settle(self, action: str, reason: str) -> dict[str, Any]:
        """Close the question with ``action`` (a timeout, a stop) unless a person answered
        first; the answer that stands."""


def content_problem(schema: dict[str, Any], content: Any) -> str | None:
    """Why ``content`` doesn't answer a question asking for ``schema`` (one line), or None."""
    # Local: jsonschema comes with the mcp extra (the SDK depends on it; no type stubs).
    import jsonschema  # type: ignore[import-untyped]

    if not isinstance(content, dict):
        return f"an answer must be a JSON object, not {type(content).__name__}"
    try:
        validator_class = jsonschema.validators.validator_for(schema)
        validator_class.check_schema(schema)
    except jsonschema.SchemaError:
        return "the server's requested schema is invalid, so no answer can be checked"
    error = jsonschema.exceptions.best_match(validator_class(schema).iter_errors(content))
    if error is None:
        return None
    where = ".".join(str(part) for part in error.absolute_path)
    text = f"{where}: {error.message}" if where else error.message
    return " ".join(text.split())[:300]


def person_answers(
    desk: QuestionDesk | None, server: str, settings: ServerSettings
) -> Callable[[Any, Callable[[], bool] | None, Callable[[], bool]], Any]:
    """The ``answer(params, stop, gone)`` of a call's :class:`Asking`: asks through ``desk``
    (None: nobody can be asked, and the server hears "cancel")."""

    def answer(params: Any, stop: Callable[[], bool] | None, gone: Callable[[], bool]) -> Any:
        # Local: the mcp package is an optional extra (a question comes only through it).
        from mcp.types import ElicitRequestFormParams, ElicitResult

        if desk is None:
            return ElicitResult(action="cancel")
        if not isinstance(params, ElicitRequestFormParams):
            # URL mode sends the person to a page of the server's: not offered here.
            return ElicitResult(action="decline")
        schema = params.requested_schema
        desk.open(server, params.message, dict(schema))
        deadline = time.monotonic() + settings.elicitation_timeout
        # A person answers in seconds at best: half a second adds nothing they notice, and
        # a question left open for minutes costs a fraction of the reads.
        interval = max(agentloop_settings.CANCEL_POLL_INTERVAL, ANSWER_POLL_INTERVAL)
        try:
            while True:
                response = desk.response()
                if response is None and stop is not None and stop():
                    desk.settle("cancel", "the chat was cancelled")
                    raise Stopped
                if response is None and (gone() or time.monotonic() >= deadline):
                    reason = "the call ended" if gone() else "no answer in time"
                    response = desk.settle("cancel", reason)
                if response is not None:
                    return ElicitResult(action=response["action"], content=response.get("content"))
                time.sleep(interval)
        except Stopped:
            raise
        except BaseException:
            desk.settle("cancel", "the question could not be read")
            raise

    return answer

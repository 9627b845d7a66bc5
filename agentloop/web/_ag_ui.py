"""The AG-UI protocol (Agent-User Interaction, 1.0): a chat's run as AG-UI events over SSE.

A client (``@ag-ui/client``'s ``HttpAgent``, CopilotKit) posts a ``RunAgentInput``:
``threadId`` (the chat's pk), ``runId``, ``messages``, ``tools``, ``context``, ``state``,
``forwardedProps`` and, after a run that ended in an interrupt, ``resume``. Only three
things are taken from it (:func:`parse_run_input`): a new user message (the last message,
when it is the user's and not one the server sent), the answers to interrupts (``resume``
entries, or tool messages after the last assistant message), or neither: then the stream
replays the persisted chat (``MESSAGES_SNAPSHOT``) and follows the run in flight, if any,
which is how a client picks a chat up after a reload. The history, the tools, the state
and the props a client sends change nothing: the chat's own are in the database.

The events (each one ``data: <JSON>`` line, as the protocol's SSE encoding has them):

- ``RUN_STARTED`` (``threadId``, ``runId``), then ``STATE_SNAPSHOT`` ``{"chat", "state"}``
  and a ``STATE_DELTA`` (a JSON Patch replacing ``/state``) whenever the chat's state
  changes while the stream follows it;
- an answer: ``TEXT_MESSAGE_START`` / ``_CONTENT`` / ``_END`` (role ``assistant``) and per
  call ``TOOL_CALL_START`` / ``_ARGS`` / ``_END`` (``parentMessageId``: the answer's message);
  streamed as it comes (Redis: chunk by chunk; without Redis: as the partial answer grows);
- a tool result: ``TOOL_CALL_RESULT`` (``messageId`` ``t<pk>``, ``content``; a call a cancel
  kept from running gets one saying so);
- an MCP server asking for input while its call runs (docs/mcp.md): a ``CUSTOM``
  ``agentloop.question`` event with the server's ``schema``, while the run goes on (the call
  is held open); the next run's ``resume`` (the content asked for, or dismissed) answers it;
- a call waiting for a person: a ``CUSTOM`` event (``agentloop.approval_requested`` or
  ``agentloop.question``), and the run ends with ``RUN_FINISHED`` whose ``outcome`` is
  ``{"type": "interrupt", "interrupts": [...]}``: one per call, its ``id`` the ``ToolCall``
  pk, ``reason`` ``tool_approval`` or ``input_required``, ``toolCallId``, ``message`` and a
  ``responseSchema`` for the answer;
- the end: ``RUN_FINISHED`` (``outcome`` ``success``; ``cancelled`` after a cancel; a limit's
  stop has ``result: {"stopReason"}``) or ``RUN_ERROR`` (the chat's one-line error).

When a saved answer differs from what streamed (a retried answer), the run's last events
before the end include a ``MESSAGES_SNAPSHOT`` read from the database, which replaces what
the client holds. Message ids: ``u<pk>`` (a user row), ``m<pk>`` (an answer; an answer
streamed through Redis has a stream-made id until the next snapshot), ``r<pk>`` (its
thinking), ``t<pk>`` (a tool result).

The translation (:class:`AgUiTranslator`) is pure; :class:`AgUiFollower` reads a chat's live
events into it (``agentloop.web._live``: the same in-flight rules as the ``useChat`` stream);
:func:`decide` turns answers into the chat's approve, deny and answer verbs; the view is
``agentloop.web.views.ag_ui``. Texts from models and tools are passed on as data.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..engine import CANCELLED_TOOL_RESULT
from ..exceptions import (
    DecisionConflictError,
    InvalidAnswerError,
    InvalidArgumentsError,
    ToolCallNotWaitingError,
)
from ..tools.mcp.elicitation import ELICITATION
from ._live import RunFollower
from ._translator import Chunk, Translator
from ._ui_protocol import encode, error_line, parse_approval_id, row_payload

__all__ = [
    "APPROVAL_EVENT",
    "APPROVAL_REASON",
    "HEADERS",
    "QUESTION_EVENT",
    "QUESTION_REASON",
    "AgUiFollower",
    "AgUiTranslator",
    "Answer",
    "RunRequest",
    "decide",
    "messages_snapshot",
    "parse_run_input",
]

#: the response headers (the events are SSE ``data:`` lines; nginx passes them on as they come).
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
#: an interrupt's ``reason`` for a call waiting for approval, and for one waiting for an answer.
APPROVAL_REASON = "tool_approval"
QUESTION_REASON = "input_required"
#: the ``CUSTOM`` events' names that show a waiting call before the run ends.
APPROVAL_EVENT = "agentloop.approval_requested"
QUESTION_EVENT = "agentloop.question"
#: what an approval's resume ``payload`` looks like.
APPROVAL_SCHEMA = {
    "type": "object",
    "properties": {"approved": {"type": "boolean"}, "reason": {"type": "string"}},
    "required": ["approved"],
}
#: what a question's resume ``payload`` looks like (a plain string is taken too).
QUESTION_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}},
    "required": ["answer"],
}
#: the reason a denial gets when the person dismissed the interrupt (``status: cancelled``).
DISMISSED = "The person dismissed the request."
_MAX_ID = 200  # characters of a runId or message id
_MAX_REASON = 2000  # characters of a denial's reason (as the deny view)


# -- the request ---------------------------------------------------------------------------------
@dataclass
class Answer:
    """A person's answer to a waiting call (``call``: its ``ToolCall`` pk, or the toolCallId
    of a tool message): resolved with ``payload``, or dismissed (``cancelled``)."""

    call: int | str
    cancelled: bool = False
    payload: Any = None


@dataclass
class RunRequest:
    """What a ``RunAgentInput`` asks for: ``text`` (a new user message; ``message_id`` its
    client id), ``answers`` (resume entries), ``tool_answers`` (tool messages after the last
    assistant message), or nothing new (the chat is replayed); ``problem`` when it is refused."""

    chat_pk: int | None = None
    run_id: str = ""
    text: str = ""
    message_id: str = ""
    answers: list[Answer] = field(default_factory=list)
    tool_answers: list[Answer] = field(default_factory=list)
    problem: str = ""


def parse_run_input(body: Any) -> RunRequest:
    """Read a ``RunAgentInput``; the fields agentloop does not use are checked for their
    type only (``tools``, ``context``: lists; ``state``, ``forwardedProps``: anything)."""
    if not isinstance(body, dict):
        return RunRequest(problem="The request must be a JSON object (a RunAgentInput).")
    thread = body.get("threadId")
    chat_pk = parse_approval_id(thread)
    if chat_pk is None:
        return RunRequest(problem="threadId must be the chat's id.")
    run_id = body.get("runId")
    if not isinstance(run_id, str) or not run_id or len(run_id) > _MAX_ID:
        return RunRequest(chat_pk, problem="runId must be a string of 1 to 200 characters.")
    asked = RunRequest(chat_pk, run_id)
    for name in ("tools", "context"):
        if not isinstance(body.get(name, []), list):
            asked.problem = f"{name} must be a list."
            return asked
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        asked.problem = "messages must be a list of messages."
        return asked
    resume = body.get("resume")
    if resume is not None:
        asked.problem = _read_resume(resume, asked.answers)
        if asked.problem:
            return asked
    last = messages[-1] if messages else {}
    if last.get("role") == "user":
        asked.text = _text(last.get("content")).strip()
        message_id = last.get("id")
        asked.message_id = message_id if isinstance(message_id, str) else ""
        if not asked.text:
            asked.problem = "The last message is the user's, and has no text."
        elif asked.answers:
            asked.problem = "Send the interrupts' answers (resume) without a new message."
        return asked
    if not asked.answers:
        asked.tool_answers = _tool_answers(messages)
    return asked


def _read_resume(resume: Any, into: list[Answer]) -> str:
    if not isinstance(resume, list):
        return "resume must be a list of {interruptId, status, payload}."
    for entry in resume:
        if not isinstance(entry, dict):
            return "resume must be a list of {interruptId, status, payload}."
        call_pk = parse_approval_id(entry.get("interruptId"))
        if call_pk is None:
            return "A resume entry's interruptId must be an interrupt's id."
        status = entry.get("status")
        if status not in ("resolved", "cancelled"):
            return 'A resume entry\'s status must be "resolved" or "cancelled".'
        into.append(Answer(call_pk, status == "cancelled", entry.get("payload")))
    return ""


def _tool_answers(messages: list[dict[str, Any]]) -> list[Answer]:
    """The tool messages after the last message of another role (a client's answers to
    calls; those that answer no waiting call are left alone by :func:`decide`)."""
    answers: list[Answer] = []
    for message in reversed(messages):
        if message.get("role") != "tool":
            break
        tool_call_id = message.get("toolCallId")
        if isinstance(tool_call_id, str) and tool_call_id:
            answers.insert(0, Answer(tool_call_id, False, _text(message.get("content"))))
    return answers


def _text(content: Any) -> str:
    """A message's text: a string, or its text parts joined (other parts are not taken)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict)
            and part.get("type") == "text"
            and isinstance(part.get("text"), str)
        )
    return ""


# -- decisions -----------------------------------------------------------------------------------
def decide(chat: Any, user: Any, answers: list[Answer]) -> tuple[int, str] | None:
    """Apply answers with the chat's verbs: an approval's payload ``{"approved": true}``
    approves, ``false`` denies (with its ``reason``), a question's answer (its payload's
    ``answer``, or the payload itself as text) answers, a dismissed interrupt is denied.
    ``(status, one line)`` when one is refused (nothing of the refused one is written);
    None when at least one was applied. Answers naming no waiting call of this chat (tool
    messages the client was sent earlier) are left alone; with none left, 409."""
    call_model = type(chat)._meta.get_field("tool_calls").related_model
    applied = 0
    for answer in answers:
        by_pk = isinstance(answer.call, int)
        found = call_model.objects.filter(
            chat_id=chat.pk, **({"pk": answer.call} if by_pk else {"call_id": answer.call})
        ).first()
        asked_by_server = found is not None and _asked_by_server(found)
        if found is None or (found.state != "waiting" and not asked_by_server):
            if by_pk:  # an interrupt's id: it must name a waiting call of this chat
                return 409, f"Interrupt {answer.call} is not waiting for an answer in this chat."
            continue
        refused = _apply(chat, user, found, answer)
        if refused:
            return refused
        applied += 1
    if not applied:
        return 409, "Nothing in the request answers a call waiting for a person."
    return None


def _asked_by_server(call: Any) -> bool:
    # An MCP server's question: its call runs (held open) while the person decides.
    return bool(call.state == "running" and call.wait_reason == ELICITATION)


def _apply(chat: Any, user: Any, call: Any, answer: Answer) -> tuple[int, str] | None:
    payload = answer.payload
    if call.wait_reason == ELICITATION:
        return _respond(chat, user, call, answer)
    if isinstance(payload, str) and call.wait_reason == "approval":
        try:  # a tool message's content: the JSON of the payload
            payload = json.loads(payload)
        except ValueError:
            return 400, 'An approval\'s answer must be {"approved": true or false}.'
    try:
        if answer.cancelled:
            chat.deny(call.pk, reason=DISMISSED, by=user)
        elif call.wait_reason == "approval":
            approved = payload.get("approved") if isinstance(payload, dict) else payload
            if not isinstance(approved, bool):
                return 400, 'An approval\'s answer must be {"approved": true or false}.'
            reason = payload.get("reason") if isinstance(payload, dict) else ""
            reason = reason[:_MAX_REASON] if isinstance(reason, str) else ""
            if approved:
                chat.approve(call.pk, by=user)
            else:
                chat.deny(call.pk, reason=reason, by=user)
        else:
            text = payload.get("answer") if isinstance(payload, dict) else payload
            if not isinstance(text, str) or not text.strip():
                return 400, 'An answer needs some text ({"answer": "..."}).'
            chat.answer(call.pk, text, by=user)
    except (ToolCallNotWaitingError, InvalidArgumentsError) as exc:
        return 409, str(exc)
    return None


def _respond(chat: Any, user: Any, call: Any, answer: Answer) -> tuple[int, str] | None:
    """An MCP server's question: the content it asked for (a JSON object, or its text) goes
    back to it; a dismissed interrupt is the protocol's ``cancel`` (no choice made)."""
    try:
        if answer.cancelled:
            chat.decline(call.pk, by=user, action="cancel")
        else:
            payload = answer.payload
            chat.answer(
                call.pk, payload if isinstance(payload, str) else json.dumps(payload), by=user
            )
    except InvalidAnswerError as exc:
        return 400, str(exc)
    except (ToolCallNotWaitingError, DecisionConflictError) as exc:
        return 409, str(exc)
    return None


# -- the transcript ------------------------------------------------------------------------------
def messages_snapshot(chat: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The chat's finished messages as AG-UI messages (oldest first; instructions, summaries
    and superseded rows left out), and the rows' payloads (``row_payload``) for a translator
    to :meth:`~AgUiTranslator.know`."""
    rows = _rows(chat)
    payloads = [row_payload(row) for row in rows]
    messages: list[dict[str, Any]] = []
    for row, payload in zip(rows, payloads, strict=True):
        if row.role == "user":
            messages.append({"id": f"u{row.pk}", "role": "user", "content": row.content})
        elif row.role == "assistant":
            if payload.get("thinking"):
                messages.append(
                    {"id": f"r{row.pk}", "role": "reasoning", "content": payload["thinking"]}
                )
            message: dict[str, Any] = {"id": f"m{row.pk}", "role": "assistant"}
            if payload["content"]:
                message["content"] = payload["content"]
            calls = payload.get("tool_calls") or []
            if calls:
                message["toolCalls"] = [_tool_call(call) for call in calls]
            if len(message) > 2:
                messages.append(message)
            for call in row.tool_calls.all():
                if call.state == "cancelled":  # no result row: the client is told why
                    messages.append(
                        _tool_message(f"c{call.pk}", call.call_id, CANCELLED_TOOL_RESULT, True)
                    )
        elif row.role == "tool" and row.tool_call is not None:
            messages.append(
                _tool_message(f"t{row.pk}", row.tool_call.call_id, row.content, row.is_error)
            )
    return messages, payloads


def _rows(chat: Any) -> list[Any]:
    message_model = type(chat)._meta.get_field("messages").related_model
    return list(
        message_model.objects.filter(chat_id=chat.pk, superseded_at__isnull=True)
        .exclude(status="partial")
        .exclude(role__in=("system", "summary"))
        .select_related("tool_call")
        .prefetch_related("tool_calls")
        .order_by("id")
    )


def _tool_call(call: dict[str, Any]) -> dict[str, Any]:
    arguments = json.dumps(call["arguments"], ensure_ascii=False)
    return {
        "id": call["call_id"],
        "type": "function",
        "function": {"name": call["name"], "arguments": arguments},
    }


def _tool_message(message_id: str, tool_call_id: str, content: str, error: bool) -> dict[str, Any]:
    message = {"id": message_id, "role": "tool", "toolCallId": tool_call_id, "content": content}
    if error:
        message["error"] = content
    return message


# -- the stream ----------------------------------------------------------------------------------
@dataclass
class _Answer:
    """The answer streaming now: what the client was sent of it."""

    message_id: str
    text_open: bool = False
    text: str = ""
    tools: dict[int, str] = field(default_factory=dict)  # delta index -> toolCallId
    open_tools: list[str] = field(default_factory=list)


class AgUiTranslator(Translator):
    """Turns one chat's live events into AG-UI events (one stream, one run, one reader).

    It has the interface ``RunFollower`` drives (``know``, ``event``, ``cancel_calls``,
    ``pending``, ``end``, ``sent_rows``, ``calls``), and remembers what it sent."""

    def __init__(self, thread_id: str, run_id: str) -> None:
        super().__init__()
        self.thread_id = thread_id
        self.run_id = run_id
        #: ``ToolCall`` pk -> (name, arguments), for interrupts.
        self.call_details: dict[int, tuple[str, Any]] = {}
        #: a saved answer differed from what streamed: the client needs a snapshot.
        self.diverged = False
        self.interrupts: list[dict[str, Any]] = []
        #: the pks of calls whose MCP server's question was shown (they end no run).
        self._asked_by_servers: set[str] = set()
        self._state: str | None = None
        self._answer: _Answer | None = None
        self._used_ids: set[str] = set()
        self._count = 0

    # -- what the client has already ------------------------------------------------------
    def know(self, payload: dict[str, Any]) -> None:
        """Note a message row (``row_payload``) the client holds already."""
        super().know(payload)
        for call in payload.get("tool_calls") or []:
            self.call_details[call["id"]] = (call["name"], call["arguments"])

    # -- the run --------------------------------------------------------------------------
    def start(self, state: str, messages: list[dict[str, Any]] | None = None) -> list[Chunk]:
        """The first events: the run, the chat's state, and (a replay) its messages."""
        self._state = state
        out: list[Chunk] = [
            {"type": "RUN_STARTED", "threadId": self.thread_id, "runId": self.run_id},
            {"type": "STATE_SNAPSHOT", "snapshot": {"chat": self.thread_id, "state": state}},
        ]
        if messages is not None:
            out.append(snapshot_event(messages))
        return out

    def state(self, state: str) -> list[Chunk]:
        """A ``STATE_DELTA`` when the chat's state changed since the last one sent."""
        if not state or state == self._state:
            return []
        self._state = state
        return [
            {"type": "STATE_DELTA", "delta": [{"op": "replace", "path": "/state", "value": state}]}
        ]

    def pending(self, calls: list[dict[str, Any]]) -> list[Chunk]:
        """A ``CUSTOM`` event per shown call waiting for a person (``{"id", "wait_reason",
        "question"}`` rows), once each; they become the run's interrupts."""
        out: list[Chunk] = []
        known = {interrupt["id"] for interrupt in self.interrupts} | self._asked_by_servers
        for call in calls:
            pk = call["id"]
            tool_call_id = self.calls.get(pk)
            if tool_call_id is None or str(pk) in known:
                continue  # not a call of this chat's answers (a subagent's), or told already
            name, arguments = self.call_details.get(pk, ("", {}))
            if call.get("wait_reason") == "approval":
                message = f"Approve the call of {name}?"
                interrupt = self._interrupt(
                    pk, APPROVAL_REASON, tool_call_id, message, APPROVAL_SCHEMA
                )
                value = {"toolName": name, "arguments": arguments}
                out.append(self._custom(APPROVAL_EVENT, interrupt, value))
            elif call.get("wait_reason") == "question":
                question = str(call.get("question") or "")
                interrupt = self._interrupt(
                    pk, QUESTION_REASON, tool_call_id, question, QUESTION_SCHEMA
                )
                out.append(self._custom(QUESTION_EVENT, interrupt, {"question": question}))
            elif call.get("wait_reason") == ELICITATION:
                # Asked while the run goes on (it ends no run); the next run's resume answers.
                self._asked_by_servers.add(str(pk))
                question, schema = str(call.get("question") or ""), call.get("schema") or {}
                interrupt = self._interrupt(
                    pk, QUESTION_REASON, tool_call_id, question, schema, ends_the_run=False
                )
                value = {"question": question, "schema": schema}
                out.append(self._custom(QUESTION_EVENT, interrupt, value))
        return out

    def end(self, state: str, error: str = "", stop_reason: str = "") -> list[Chunk]:
        """The last events, for a run that is over in ``state``: what is still open is
        closed, then ``RUN_ERROR`` or ``RUN_FINISHED`` with the run's outcome."""
        out = self._close()
        if state == "failed":
            return [
                *out,
                {"type": "RUN_ERROR", "message": error_line(error), "code": "chat_failed"},
            ]
        finished: Chunk = {"type": "RUN_FINISHED", "threadId": self.thread_id, "runId": self.run_id}
        if self.cancelled:
            finished["outcome"] = {"type": "cancelled"}
        elif state == "waiting" and self.interrupts:
            finished["outcome"] = {"type": "interrupt", "interrupts": list(self.interrupts)}
        else:
            finished["outcome"] = {"type": "success"}
            if state == "stopped":
                finished["result"] = {
                    "stopReason": error_line(stop_reason) if stop_reason else "stopped"
                }
        return [*out, finished]

    # -- helpers --------------------------------------------------------------------------
    def _interrupt(
        self,
        pk: int,
        reason: str,
        tool_call_id: str,
        message: str,
        schema: dict[str, Any],
        *,
        ends_the_run: bool = True,
    ) -> dict[str, Any]:
        interrupt = {
            "id": str(pk),
            "reason": reason,
            "message": message,
            "toolCallId": tool_call_id,
            "responseSchema": schema,
        }
        if ends_the_run:
            self.interrupts.append(interrupt)
        return interrupt

    @staticmethod
    def _custom(name: str, interrupt: dict[str, Any], value: dict[str, Any]) -> Chunk:
        shown = {"interruptId": interrupt["id"], "toolCallId": interrupt["toolCallId"], **value}
        return {"type": "CUSTOM", "name": name, "value": shown}

    def _fresh_id(self, message_id: str) -> str:
        """``message_id``, unless this stream used it for a message already (a retried
        answer's row keeps its pk): then a new one (the snapshot at the end has the row's)."""
        if message_id not in self._used_ids:
            return message_id
        self._count += 1
        return f"{message_id}-{self._count}"

    def _open(self, out: list[Chunk], message_id: str | None = None) -> _Answer:
        """The answer streaming now (its message id: ``message_id``, else a new one)."""
        if self._answer is None:
            self._count += 1
            self._answer = _Answer(message_id or f"{self.run_id}-{self._count}")
            self._used_ids.add(self._answer.message_id)
        return self._answer

    def _text(self, text: str, message_id: str | None = None) -> list[Chunk]:
        if not text:
            return []
        out: list[Chunk] = []
        answer = self._open(out, message_id)
        if not answer.text_open:
            answer.text_open = True
            out.append(
                {"type": "TEXT_MESSAGE_START", "messageId": answer.message_id, "role": "assistant"}
            )
        out.append({"type": "TEXT_MESSAGE_CONTENT", "messageId": answer.message_id, "delta": text})
        answer.text += text
        return out

    def _partial(self, data: dict[str, Any]) -> list[Chunk]:
        """The database backend's answer so far (its row's pk gives the message id)."""
        content = str(data.get("content") or "")
        message_id = f"m{data['id']}" if data.get("id") is not None else None
        answer = self._answer
        if answer is not None and not content.startswith(answer.text):
            # Not a continuation (the answer was retried): what streamed is closed, and the
            # snapshot at the end replaces it.
            self.diverged = True
            out = self._close()
            return out + self._text(content, self._fresh_id(message_id) if message_id else None)
        return self._text(
            content[len(answer.text) :] if answer is not None else content, message_id
        )

    def _tool_start(self, answer: _Answer, tool_call_id: str, name: str) -> Chunk:
        answer.open_tools.append(tool_call_id)
        return {
            "type": "TOOL_CALL_START",
            "toolCallId": tool_call_id,
            "toolCallName": name,
            "parentMessageId": answer.message_id,
        }

    def _tool_arguments(self, tool_call_id: str, text: str) -> Chunk:
        return {"type": "TOOL_CALL_ARGS", "toolCallId": tool_call_id, "delta": text}

    def _close(self) -> list[Chunk]:
        """End what is open of the answer streaming now (a cancel, a retry, the end)."""
        answer, self._answer = self._answer, None
        if answer is None:
            return []
        out: list[Chunk] = []
        if answer.text_open:
            out.append({"type": "TEXT_MESSAGE_END", "messageId": answer.message_id})
        out += [{"type": "TOOL_CALL_END", "toolCallId": call} for call in answer.open_tools]
        return out

    def _saved_answer(self, data: dict[str, Any]) -> list[Chunk]:
        """A saved answer: it closes the answer that streamed it, or is sent whole."""
        pk = data["id"]
        answer = self._answer
        if pk in self.sent_rows:
            return self._close()  # sent already: whatever streamed since was this again
        self.know(data)
        if data.get("status") == "cancelled":
            self.cancelled = True
        content = str(data.get("content") or "")
        calls = data.get("tool_calls") or []
        # What streamed may lag behind the saved text (the last partial save, the last
        # chunks): the rest is sent in the same message. Anything else was another answer.
        continued = (
            answer is not None
            and content.startswith(answer.text)
            and set(answer.tools.values()) <= {call["call_id"] for call in calls}
        )
        out: list[Chunk] = []
        if answer is not None and not continued:
            self.diverged = True
            out += self._close()
            answer = None
        if answer is not None:
            out += self._text(content[len(answer.text) :])
        else:
            if not (content or calls):
                return out  # nothing to show (an answer cancelled before its first word)
            message_id = self._fresh_id(f"m{pk}")
            out += self._text(content, message_id)
            answer = self._open(out, message_id)  # opened by _text, unless it has no text
        if answer.text_open:
            out.append({"type": "TEXT_MESSAGE_END", "messageId": answer.message_id})
            answer.text_open = False
        streamed = set(answer.tools.values())
        for call in calls:
            if call["call_id"] not in streamed:
                out += _whole_call(call, answer.message_id)
        out += [{"type": "TOOL_CALL_END", "toolCallId": call} for call in answer.open_tools]
        self._answer = None
        return out

    def _result_part(self, tool_call_id: str, data: dict[str, Any]) -> Chunk:
        return _result_event(f"t{data['id']}", tool_call_id, str(data.get("content") or ""))

    def _cancelled_call(self, pk: int, tool_call_id: str) -> Chunk:
        return _result_event(f"c{pk}", tool_call_id, CANCELLED_TOOL_RESULT)


def _whole_call(call: dict[str, Any], parent: str) -> list[Chunk]:
    arguments = json.dumps(call["arguments"], ensure_ascii=False)
    return [
        {
            "type": "TOOL_CALL_START",
            "toolCallId": call["call_id"],
            "toolCallName": call["name"],
            "parentMessageId": parent,
        },
        {"type": "TOOL_CALL_ARGS", "toolCallId": call["call_id"], "delta": arguments},
        {"type": "TOOL_CALL_END", "toolCallId": call["call_id"]},
    ]


def _result_event(message_id: str, tool_call_id: str, content: str) -> Chunk:
    return {
        "type": "TOOL_CALL_RESULT",
        "messageId": message_id,
        "toolCallId": tool_call_id,
        "content": content,
        "role": "tool",
    }


def snapshot_event(messages: list[dict[str, Any]]) -> Chunk:
    """``MESSAGES_SNAPSHOT``: the messages a client should hold, replacing its own."""
    return {"type": "MESSAGES_SNAPSHOT", "messages": messages}


class AgUiFollower(RunFollower):
    """The AG-UI stream's reader: the ``useChat`` stream's loop and in-flight rules, its
    events translated by an :class:`AgUiTranslator`, the chat's state changes sent as
    ``STATE_DELTA`` and, when a saved answer differed from what streamed, a
    ``MESSAGES_SNAPSHOT`` before the end. No ``[DONE]`` line: the run's last event ends it."""

    headers = HEADERS
    closing = b""
    translator: AgUiTranslator

    def poll(self) -> list[bytes]:
        """The ``useChat`` reader's poll, and a ``STATE_DELTA`` when the state changed."""
        frames = super().poll()
        if self.gone:
            return frames
        delta = self.translator.state(self.state.get("state", ""))
        return [*(encode(chunk) for chunk in delta), *frames]

    def before_end(self) -> list[Chunk]:
        """The chat's messages from the database when what streamed was not what was saved."""
        if not self.translator.diverged:
            return []
        chat = self.chat_model(pk=self.chat_pk)
        return [snapshot_event(messages_snapshot(chat)[0])]

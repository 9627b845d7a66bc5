"""The AI SDK's UI message protocol (what ``useChat`` speaks): a chat as ``UIMessage`` objects,
and its live events as the UI message stream.

The stream's translation is pure (no database, no request): :class:`UIStreamTranslator`
(an ``agentloop.web._translator.Translator``) takes the events of ``agentloop.live_events``
(saved ``message`` rows, streamed ``chunk`` and ``tool_call_delta`` pieces, ``partial``
answers of the database backend) and the chat's state, and returns the protocol's parts,
as dicts; :func:`encode` writes one as an SSE ``data:`` line. ``agentloop.web._live`` reads
the events and drives it; the views serve it.

One assistant UI message per turn (everything that answers a user message, tool rounds
included), id ``a<pk of that user message>``; each model answer is one step in it:

- streamed text: ``text-start`` / ``text-delta`` / ``text-end``; streamed tool calls:
  ``tool-input-start`` / ``tool-input-delta``;
- the saved answer: ``tool-input-available`` per call (``dynamic``: the page knows no
  tool types), then ``finish-step``. The saved row is the truth: when it differs from
  what was streamed (a retried answer, thinking that is only saved, not streamed), the
  step is sent again from it after a ``reset-step``;
- a tool result: ``tool-output-available``, ``tool-output-error``, or
  ``tool-output-denied`` for a call a person denied;
- a call waiting for a person's approval: ``tool-approval-request`` (the approval id is
  the ``ToolCall`` row's pk); a question: a ``data-agentloop-question`` part;
- a ``with_schema`` answer's structured output: a ``data-agentloop-output`` part per
  ``partial_output`` event while it streams (the object so far; one id per step, so each
  part replaces the last), and, once the answer is saved, its validated ``parsed`` under
  the same id;
- the end of the run: ``finish`` (``stop``; ``tool-calls`` when it waits for a person;
  ``other`` when a limit stopped it, the reason in the message's metadata), ``abort``
  after a cancel (metadata ``{"cancelled": true}``, and ``cancelledCalls``: the ids of the
  calls the cancel kept from running, each sent as a ``tool-output-error`` saying so), or one
  ``error`` line when it failed.

The history a page starts from (:func:`ui_messages`) is read from the database (never from
a client): a user message per user row (``u<pk>``), and one assistant message per turn
(``a<pk of the user message it answers>``) holding a ``step-start`` per model answer, its
``reasoning`` and ``text``, and a ``dynamic-tool`` part per call whose state follows the
call: waiting for approval (``approval-requested``, approval id = the ``ToolCall`` pk), run
(``output-available`` / ``output-error``), denied (``output-denied``), cancelled before it
ran (``output-error`` saying so, its id in the message's ``metadata.cancelledCalls``), or not
run yet (``input-available``). A call waiting for an answer also gets a ``data-agentloop-question``
part; an answer with structured output, a ``data-agentloop-output`` part holding it. The
ids are those the stream uses, so a resumed stream replaces the very message it continues.

Texts from models and tools are passed on as data; the page must show them as text.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from ..engine import CANCELLED_TOOL_RESULT
from ..live_events import blocked_reason, message_payload
from ..storable_text import storable_text
from ._translator import Chunk, Translator

__all__ = [
    "ChatRequest",
    "DONE",
    "HEADERS",
    "OUTPUT_PART",
    "QUESTION_PART",
    "TurnStart",
    "UIStreamTranslator",
    "answer_message_id",
    "approval_id",
    "encode",
    "error_line",
    "parse_approval_id",
    "parse_chat_request",
    "row_payload",
    "start_turn",
    "turn_rows",
    "ui_messages",
    "user_message_id",
]


#: the response headers the protocol names (version 1 of the UI message stream).
HEADERS = {
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # nginx: pass parts on as they come
    "x-vercel-ai-ui-message-stream": "v1",
}
#: the last line of a stream.
DONE = b"data: [DONE]\n\n"
#: the wait reasons of a call asking a person something: a tool's question, an MCP server's.
_ASKED = ("question", "elicitation")
#: the type of the data part that shows a call's question to a person.
QUESTION_PART = "data-agentloop-question"
#: the type of the data part that holds a structured answer's output (partial, then final).
OUTPUT_PART = "data-agentloop-output"
#: the longest error line sent (a chat's ``error`` is one line already; this bounds it).
_ERROR_CHARACTERS = 500


def encode(chunk: Chunk) -> bytes:
    """One part as an SSE event: ``data: <JSON>`` and a blank line."""
    body = json.dumps(chunk, ensure_ascii=False, separators=(",", ":"), default=str)
    # A lone surrogate (model text) has no UTF-8: shown as U+FFFD, as it is stored.
    return b"data: " + storable_text(body).encode() + b"\n\n"


def user_message_id(pk: Any) -> str:
    """The UI message id of a user message row."""
    return f"u{pk}"


def answer_message_id(user_pk: Any) -> str:
    """The UI message id of the turn answering the user message ``user_pk`` (``a0``: the
    rows before any user message)."""
    return f"a{user_pk or 0}"


def approval_id(call_pk: Any) -> str:
    """The approval id of a waiting call: its ``ToolCall`` pk, as text."""
    return str(call_pk)


def parse_approval_id(value: Any) -> int | None:
    """The ``ToolCall`` pk an approval id names, or None when it names none."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 20:
        return int(value)
    return None


def error_line(text: str) -> str:
    """What a page is told of a failure: the first line, bounded (no traceback)."""
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    line = line or "The chat failed."
    return line if len(line) <= _ERROR_CHARACTERS else line[: _ERROR_CHARACTERS - 1] + "…"


@dataclass
class ChatRequest:
    """What a ``useChat`` request asks for: a new user message (``text``), or decisions on
    waiting calls: approvals (``(call pk, approved, reason)``) and answers to questions
    (``(toolCallId, text)``, from ``addToolOutput``); ``problem`` when it asks for none."""

    chat_pk: int | None = None
    text: str = ""
    decisions: list[tuple[int, bool, str]] = field(default_factory=list)
    answers: list[tuple[str, str]] = field(default_factory=list)
    problem: str = ""


def parse_chat_request(body: Any) -> ChatRequest:
    """Read the AI SDK's chat request (``{"id", "messages", "trigger", ...}``).

    Only the last message counts: a user message's text parts (the history comes from
    the database, so an edited history changes nothing), or an assistant message's
    approval responses (tool parts in state ``approval-responded``) and tool outputs
    (``output-available``: the answer to a call waiting for one; others are ignored).
    """
    if not isinstance(body, dict):
        return ChatRequest(problem="The request must be a JSON object.")
    chat_id = body.get("id")
    chat_pk = parse_approval_id(str(chat_id)) if isinstance(chat_id, str | int) else None
    if chat_pk is None or isinstance(chat_id, bool):
        return ChatRequest(problem="id must be the chat's id.")
    trigger = body.get("trigger", "submit-message")
    if trigger != "submit-message":
        return ChatRequest(chat_pk, problem="Only new messages and approvals are taken here.")
    messages = body.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages else None
    parts = last.get("parts") if isinstance(last, dict) else None
    if not isinstance(parts, list):
        return ChatRequest(chat_pk, problem="messages must end with a message with parts.")
    parts = [part for part in parts if isinstance(part, dict)]
    if last.get("role") == "user":  # type: ignore[union-attr]
        texts = [
            p["text"] for p in parts if p.get("type") == "text" and isinstance(p.get("text"), str)
        ]
        text = "".join(texts).strip()
        return ChatRequest(chat_pk, text=text, problem="" if text else "The message has no text.")
    if last.get("role") == "assistant":  # type: ignore[union-attr]
        decisions, answers = _decisions(parts), _answers(parts)
        problem = "" if decisions or answers else "The last message decides nothing."
        return ChatRequest(chat_pk, decisions=decisions, answers=answers, problem=problem)
    return ChatRequest(chat_pk, problem="The last message must be the user's, or approvals.")


def _tool_parts(parts: list[dict[str, Any]], state: str) -> Iterator[dict[str, Any]]:
    """The message's tool parts (``dynamic-tool`` or ``tool-<name>``) in ``state``."""
    for part in parts:
        kind = str(part.get("type") or "")
        if (kind == "dynamic-tool" or kind.startswith("tool-")) and part.get("state") == state:
            yield part


def _decisions(parts: list[dict[str, Any]]) -> list[tuple[int, bool, str]]:
    decisions: dict[int, tuple[int, bool, str]] = {}
    for part in _tool_parts(parts, "approval-responded"):
        approval = part.get("approval")
        if not isinstance(approval, dict):
            continue
        call_pk = parse_approval_id(approval.get("id"))
        if call_pk is None or not isinstance(approval.get("approved"), bool):
            continue
        reason = approval.get("reason")
        reason = reason[:2000] if isinstance(reason, str) else ""
        decisions.setdefault(call_pk, (call_pk, approval["approved"], reason))
    return list(decisions.values())


def _answers(parts: list[dict[str, Any]]) -> list[tuple[str, str]]:
    answers: dict[str, tuple[str, str]] = {}
    for part in _tool_parts(parts, "output-available"):
        tool_call_id = part.get("toolCallId")
        if not isinstance(tool_call_id, str):
            continue
        output = part.get("output")
        text = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
        answers.setdefault(tool_call_id, (tool_call_id, text))
    return list(answers.values())


@dataclass
class _Step:
    """The answer streaming now: what the page was sent of it."""

    text_id: str | None = None  # the open text part
    text: str = ""
    tools: dict[int, str] = field(default_factory=dict)  # delta index -> toolCallId
    output_id: str | None = None  # the data part of its structured output


class UIStreamTranslator(Translator):
    """Turns one chat's events into UI message stream parts (one stream, one reader).

    It remembers what it sent: the message rows (a row read twice is sent once), the
    calls it showed (results and approvals refer to them), the approvals asked for.
    """

    def __init__(self) -> None:
        super().__init__()
        self._requested: set[int] = set()
        self._asked: set[int] = set()
        self._step: _Step | None = None
        self._count = 0

    # -- the stream ---------------------------------------------------------------------
    def start(self, message_id: str) -> list[Chunk]:
        """The first part: the UI message the parts that follow belong to."""
        return [{"type": "start", "messageId": message_id}]

    def pending(self, calls: list[dict[str, Any]]) -> list[Chunk]:
        """Parts for the calls waiting for a person (``{"id", "wait_reason", "question"}``
        rows): an approval request, or a question, once each, for calls the page shows."""
        out: list[Chunk] = []
        for call in calls:
            pk = call["id"]
            tool_call_id = self.calls.get(pk)
            if tool_call_id is None:
                continue  # not a call of this answer (a subagent's, or never shown)
            if call.get("wait_reason") == "approval" and pk not in self._requested:
                self._requested.add(pk)
                out.append(
                    {
                        "type": "tool-approval-request",
                        "approvalId": approval_id(pk),
                        "toolCallId": tool_call_id,
                    }
                )
            elif call.get("wait_reason") in _ASKED and pk not in self._asked:
                self._asked.add(pk)
                data = {
                    "callId": pk,
                    "toolCallId": tool_call_id,
                    "question": call.get("question") or "",
                }
                if "schema" in call:  # an MCP server's: answered with a JSON object
                    data["schema"] = call["schema"]
                out.append({"type": QUESTION_PART, "id": f"question-{pk}", "data": data})
        return out

    def end(self, state: str, error: str = "", stop_reason: str = "") -> list[Chunk]:
        """The last parts, for a run that is over in ``state`` (idle, waiting, stopped,
        failed)."""
        out = self._close_step()
        if state == "failed":
            return [*out, {"type": "error", "errorText": error_line(error)}]
        if self.cancelled:
            metadata: dict[str, Any] = {"cancelled": True}
            if self.cancelled_calls:
                metadata["cancelledCalls"] = list(self.cancelled_calls.values())
            out.append({"type": "message-metadata", "messageMetadata": metadata})
            return [*out, {"type": "abort", "reason": "cancelled"}]
        if state == "waiting":
            return [*out, {"type": "finish", "finishReason": "tool-calls"}]
        if state == "stopped":
            metadata = {"stopReason": error_line(stop_reason) if stop_reason else "stopped"}
            return [*out, {"type": "finish", "finishReason": "other", "messageMetadata": metadata}]
        return [*out, {"type": "finish", "finishReason": "stop"}]

    # -- streaming pieces ---------------------------------------------------------------
    def _new_id(self, kind: str) -> str:
        self._count += 1
        return f"{kind}-{self._count}"

    def _open(self, out: list[Chunk]) -> _Step:
        if self._step is None:
            self._step = _Step()
            out.append({"type": "start-step"})
        return self._step

    def _text(self, text: str) -> list[Chunk]:
        if not text:
            return []
        out: list[Chunk] = []
        step = self._open(out)
        if step.text_id is None:
            step.text_id = self._new_id("text")
            out.append({"type": "text-start", "id": step.text_id})
        out.append({"type": "text-delta", "id": step.text_id, "delta": text})
        step.text += text
        return out

    def _partial(self, data: dict[str, Any]) -> list[Chunk]:
        """The database backend's answer so far: the part of it the page lacks."""
        content = str(data.get("content") or "")
        step = self._step
        if step is not None and not content.startswith(step.text):
            # Not a continuation (the answer was retried): the step starts over.
            self._step = _Step()
            return [{"type": "reset-step"}, *self._text(content)]
        return self._text(content[len(step.text) :] if step is not None else content)

    def _partial_output(self, value: Any) -> list[Chunk]:
        out: list[Chunk] = []
        step = self._open(out)
        out.append(self._output(step, value))
        return out

    def _tool_start(self, answer: _Step, tool_call_id: str, name: str) -> Chunk:
        return {
            "type": "tool-input-start",
            "toolCallId": tool_call_id,
            "toolName": name,
            "dynamic": True,
        }

    def _tool_arguments(self, tool_call_id: str, text: str) -> Chunk:
        return {"type": "tool-input-delta", "toolCallId": tool_call_id, "inputTextDelta": text}

    def _output(self, step: _Step, value: Any) -> Chunk:
        """The structured output so far (or the saved one), under the step's one id."""
        if step.output_id is None:
            step.output_id = self._new_id("output")
        return {"type": OUTPUT_PART, "id": step.output_id, "data": value}

    def _close_step(self) -> list[Chunk]:
        step, self._step = self._step, None
        if step is None:
            return []
        out = [{"type": "text-end", "id": step.text_id}] if step.text_id else []
        return [*out, {"type": "finish-step"}]

    # -- saved rows ---------------------------------------------------------------------
    def _saved_answer(self, data: dict[str, Any]) -> list[Chunk]:
        """A saved answer: it closes (or replaces) the step that streamed it."""
        pk = data["id"]
        step = self._step
        if pk in self.sent_rows:
            # Sent already (read from the database before its event came): whatever
            # streamed since was this answer again.
            self._step = None
            return [{"type": "reset-step"}, {"type": "finish-step"}] if step else []
        self.know(data)
        if data.get("status") == "cancelled":
            self.cancelled = True
        content = str(data.get("content") or "")
        thinking = str(data.get("thinking") or "")
        calls = data.get("tool_calls") or []
        if step is None and not (content or thinking or calls):
            return []  # nothing to show (an answer cancelled before its first word)
        out: list[Chunk] = []
        streamed_as_saved = (
            step is not None
            and step.text == content
            and not thinking
            and set(step.tools.values()) <= {call["call_id"] for call in calls}
        )
        if step is None:
            out.append({"type": "start-step"})
        elif streamed_as_saved:
            if step.text_id:
                out.append({"type": "text-end", "id": step.text_id})
        else:
            out.append({"type": "reset-step"})
        if not streamed_as_saved:
            out += self._whole_answer(content, thinking)
        if data.get("parsed") is not None:
            # The validated output replaces the partials (a reset step starts a new id).
            kept = step if streamed_as_saved and step is not None else _Step()
            out.append(self._output(kept, data["parsed"]))
        for call in calls:
            out.append(
                {
                    "type": "tool-input-available",
                    "toolCallId": call["call_id"],
                    "toolName": call["name"],
                    "input": call["arguments"],
                    "dynamic": True,
                }
            )
        self._step = None
        return [*out, {"type": "finish-step"}]

    def _whole_answer(self, content: str, thinking: str) -> list[Chunk]:
        """A saved answer's thinking and text, each a whole part of its own."""
        out: list[Chunk] = []
        for kind, text in (("reasoning", thinking), ("text", content)):
            if text:
                part_id = self._new_id(kind)
                out += [
                    {"type": f"{kind}-start", "id": part_id},
                    {"type": f"{kind}-delta", "id": part_id, "delta": text},
                    {"type": f"{kind}-end", "id": part_id},
                ]
        return out

    def _result_part(self, tool_call_id: str, data: dict[str, Any]) -> Chunk:
        """A tool result (``decision`` added by the reader: "denied" for a denial)."""
        if data.get("decision") == "denied":
            return {"type": "tool-output-denied", "toolCallId": tool_call_id}
        content = str(data.get("content") or "")
        if data.get("is_error"):
            return {"type": "tool-output-error", "toolCallId": tool_call_id, "errorText": content}
        return {"type": "tool-output-available", "toolCallId": tool_call_id, "output": content}

    def _cancelled_call(self, pk: int, tool_call_id: str) -> Chunk:
        return {
            "type": "tool-output-error",
            "toolCallId": tool_call_id,
            "errorText": CANCELLED_TOOL_RESULT,
        }


#: rows a page never shows: the instructions, and compaction summaries of older messages.
_HIDDEN_ROLES = ("system", "summary")


def _message_model(chat: Any) -> Any:
    return type(chat)._meta.get_field("messages").related_model


def _finished_rows(chat: Any, *, include_superseded: bool = False) -> Any:
    rows = _message_model(chat).objects.filter(chat_id=chat.pk)
    if not include_superseded:
        rows = rows.filter(superseded_at__isnull=True)  # replaced by an edit: not shown
    return (
        rows.exclude(status="partial")
        .exclude(role__in=_HIDDEN_ROLES)
        .select_related("tool_call")
        .prefetch_related("tool_calls")
        .order_by("id")
    )


def row_payload(row: Any) -> dict[str, Any]:
    """A saved row as the stream's ``message`` event data, with a tool result's
    ``decision`` (the page shows a denial apart from an error)."""
    payload = message_payload(row)
    if row.role == "tool":
        call = getattr(row, "tool_call", None)
        payload["decision"] = call.decision if call is not None else ""
    return payload


def turn_rows(chat: Any) -> tuple[int, list[Any]]:
    """The pk of the chat's latest user message (0: none) and the finished rows after it:
    what a resumed stream sends again before the live events."""
    user_pk = (
        _message_model(chat)
        .objects.filter(chat_id=chat.pk, role="user", superseded_at__isnull=True)
        .order_by("-id")
        .values_list("id", flat=True)
        .first()
    ) or 0
    return user_pk, list(_finished_rows(chat).filter(id__gt=user_pk))


@dataclass
class TurnStart:
    """How a ``useChat`` stream of a turn begins: its translator, the pk of the latest row
    the page has or is sent (``floor``: rows above it are the run's), and its first lines."""

    translator: UIStreamTranslator
    floor: int
    head: list[bytes]


def start_turn(chat: Any, rows: Literal["added", "shown", "replayed"]) -> TurnStart:
    """The stream of the chat's latest turn, begun: the ``start`` part of its answer, and the
    rows after its user message (:func:`turn_rows`) as the page has them: none but a user
    message just ``added``; ``shown`` already (its calls get results in this stream); or
    ``replayed`` now, in the first lines (a resumed stream)."""
    translator = UIStreamTranslator()
    user_pk, finished = turn_rows(chat)
    chunks = translator.start(answer_message_id(user_pk))
    for row in finished if rows != "added" else []:
        if rows == "shown":
            translator.know(row_payload(row))
        else:
            chunks += translator.event({"type": "message", "data": row_payload(row)})
    floor = max([user_pk, *(row.pk for row in finished)])
    return TurnStart(translator, floor, [encode(chunk) for chunk in chunks])


def ui_messages(chat: Any, *, include_superseded: bool = False) -> list[dict[str, Any]]:
    """The chat's finished messages as ``UIMessage`` dicts, oldest first (the answer
    streaming now comes from the resume stream). Messages an edit or a regenerated answer
    superseded are left out; with ``include_superseded`` they are in, in their place, with
    ``metadata.superseded`` true."""
    messages: list[dict[str, Any]] = []
    answer: dict[str, Any] | None = None
    parts_of_calls: dict[Any, dict[str, Any]] = {}
    user_pk: Any = 0
    for row in _finished_rows(chat, include_superseded=include_superseded):
        if row.role == "user":
            answer, user_pk = None, row.pk
            text = [{"type": "text", "text": row.content}] if row.content else []
            shown: dict[str, Any] = {"id": user_message_id(row.pk), "role": "user", "parts": text}
            if row.status == "blocked":  # the user's own words, marked
                shown["metadata"] = {"blocked": blocked_reason(row)}
            messages.append(shown)
            _mark_superseded(shown, row)
        elif row.role == "assistant":
            if answer is None:
                answer = {"id": answer_message_id(user_pk), "role": "assistant", "parts": []}
                messages.append(answer)
            if row.status == "blocked":  # nothing of a blocked answer is shown
                answer["metadata"] = {"blocked": blocked_reason(row)}
                continue
            answer["parts"] += _answer_parts(row, parts_of_calls)
            cancelled_calls = [c.call_id for c in row.tool_calls.all() if c.state == "cancelled"]
            if row.status == "cancelled" or cancelled_calls:
                answer["metadata"] = {**answer.get("metadata", {}), "cancelled": True}
            if cancelled_calls:
                answer["metadata"]["cancelledCalls"] = [
                    *answer["metadata"].get("cancelledCalls", []),
                    *cancelled_calls,
                ]
            _mark_superseded(answer, row)
        elif row.role == "tool" and row.tool_call_id in parts_of_calls:
            _settle(parts_of_calls[row.tool_call_id], row)
    return messages


def _mark_superseded(message: dict[str, Any], row: Any) -> None:
    if row.superseded_at is not None:
        message["metadata"] = {**message.get("metadata", {}), "superseded": True}


def _answer_parts(row: Any, parts_of_calls: dict[Any, dict[str, Any]]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "step-start"}]
    if row.thinking:
        parts.append({"type": "reasoning", "text": row.thinking, "state": "done"})
    if row.content:
        parts.append({"type": "text", "text": row.content, "state": "done"})
    if row.parsed is not None:
        parts.append({"type": OUTPUT_PART, "id": f"output-{row.pk}", "data": row.parsed})
    for call in row.tool_calls.all():
        part: dict[str, Any] = {
            "type": "dynamic-tool",
            "toolName": call.name,
            "toolCallId": call.call_id,
            "input": call.arguments,
            "state": "input-available",
        }
        if call.state == "waiting" and call.wait_reason == "approval":
            part["state"] = "approval-requested"
            part["approval"] = {"id": approval_id(call.pk)}
        elif call.state == "cancelled":  # no result yet: the next message gives it this one
            part["state"] = "output-error"
            part["errorText"] = CANCELLED_TOOL_RESULT
        parts_of_calls[call.pk] = part
        parts.append(part)
        asked_by_server = call.state == "running" and call.wait_reason == "elicitation"
        if (call.state == "waiting" and call.wait_reason == "question") or asked_by_server:
            question = {"callId": call.pk, "toolCallId": call.call_id, "question": call.question}
            if asked_by_server:
                question["schema"] = (getattr(call, "elicitation", None) or {}).get("schema") or {}
            parts.append({"type": QUESTION_PART, "id": f"question-{call.pk}", "data": question})
    return parts


def _settle(part: dict[str, Any], row: Any) -> None:
    """A call's part once its result is saved."""
    call = row.tool_call
    if call is not None and call.decision == "denied":
        part["state"] = "output-denied"
        part["approval"] = {"id": approval_id(call.pk), "approved": False}
        if call.decision_reason:
            part["approval"]["reason"] = call.decision_reason
        return
    if call is not None and call.decision == "approved":
        part["approval"] = {"id": approval_id(call.pk), "approved": True}
    if row.is_error:
        part["state"] = "output-error"
        part["errorText"] = row.content
    else:
        part["state"] = "output-available"
        part["output"] = row.content

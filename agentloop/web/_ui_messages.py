"""A persisted chat as the AI SDK's ``UIMessage`` list (``useChat``'s ``messages``).

The history a page starts from, read from the database (never from a client): a user
message per user row (``u<pk>``), and one assistant message per turn (``a<pk of the user
message it answers>``) holding a ``step-start`` per model answer, its ``reasoning`` and
``text``, and a ``dynamic-tool`` part per call whose state follows the call: waiting for
approval (``approval-requested``, approval id = the ``ToolCall`` pk), run
(``output-available`` / ``output-error``), denied (``output-denied``), or not run yet
(``input-available``). A call waiting for an answer also gets a
``data-agentloop-question`` part. The ids are those ``agentloop.web._ui_protocol`` streams, so
a resumed stream replaces the very message it continues.
"""

from __future__ import annotations

from typing import Any

from ..live_events import blocked_reason, message_payload
from ._ui_protocol import QUESTION_PART, answer_message_id, approval_id, user_message_id

__all__ = ["row_payload", "turn_rows", "ui_messages"]

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
            if row.status == "cancelled":
                answer["metadata"] = {**answer.get("metadata", {}), "cancelled": True}
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
        parts_of_calls[call.pk] = part
        parts.append(part)
        if call.state == "waiting" and call.wait_reason == "question":
            question = {"callId": call.pk, "toolCallId": call.call_id, "question": call.question}
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

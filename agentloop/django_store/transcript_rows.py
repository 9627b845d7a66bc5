"""A chat's transcript as the rows of one SELECT, and those rows as ``Message`` objects.

One query reads the messages joined with their tool calls (``values_list``: no model
instances). The rows are our own, so messages are built without validation (see
:func:`trusted`) and JSON columns are decoded here, not by Django's converters.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, TypeAdapter

from ..attachments import Attachment, attachments_adapter
from ..messages import GuardrailOutcome, Message, MessageStatus, ToolCall, ToolCallState

__all__ = [
    "JSON_COLUMNS",
    "MESSAGE_COLUMNS",
    "held_calls",
    "kept_values",
    "messages_from_rows",
    "messages_from_values",
    "transcript_query",
    "trusted",
]

_Model = TypeVar("_Model", bound=BaseModel)


def trusted(cls: type[_Model], values: dict[str, Any]) -> _Model:
    """An instance built from ``values`` that are already valid, with every field given.

    For stores reading their own rows: no validation, no defaults to fill (several times
    faster than ``model_construct``, which matters at hundreds of messages per step).
    """
    instance = cls.__new__(cls)
    object.__setattr__(instance, "__dict__", values)
    object.__setattr__(instance, "__pydantic_fields_set__", set(values))
    object.__setattr__(instance, "__pydantic_extra__", None)
    object.__setattr__(instance, "__pydantic_private__", None)
    return instance


MESSAGE_COLUMNS = (
    "id",
    "role",
    "content",
    "status",
    "is_error",
    "parsed",
    "model",
    "finish_reason",
    "thinking",
    "provider_data",
    "attachments",
    "guardrails",
    "recall",
    "tool_call__call_id",
    "tool_call__name",
    "tool_calls__id",
    "tool_calls__call_id",
    "tool_calls__name",
    "tool_calls__arguments",
    "tool_calls__state",
    "tool_calls__provider_data",
    "tool_calls__wait_reason",
    "tool_calls__question",
    "tool_calls__decision",
    "tool_calls__decision_digest",
    "tool_calls__handoff",
    # Read for a call judged before a person was asked: approved as it was, it is not
    # judged again; edited, it is (nearly always "[]" and NULL).
    "tool_calls__guardrails",
    "tool_calls__original_arguments",
)


# Columns of MESSAGE_COLUMNS holding JSON: read raw (the store's PreparedSelect skips their
# converters) and decoded by _json or _attachments (most are "{}", "[]" or NULL).
JSON_COLUMNS = frozenset(
    MESSAGE_COLUMNS.index(name)
    for name in (
        "parsed",
        "provider_data",
        "attachments",
        "guardrails",
        "recall",
        "tool_calls__arguments",
        "tool_calls__provider_data",
        "tool_calls__handoff",
        "tool_calls__guardrails",
        "tool_calls__original_arguments",
    )
)
_MESSAGE_STATUS = {status.value: status for status in MessageStatus}
_TOOL_CALL_STATE = {state.value: state for state in ToolCallState}


def _json(value: Any, empty: Any) -> Any:
    """A JSON column as the driver returned it: text (decoded here), or already decoded."""
    if value is None:
        return None if empty is None else type(empty)()
    if isinstance(value, str):
        if value == "{}":
            return {}
        if value == "[]":
            return []
        return json.loads(value)
    return value


def _attachments(value: Any) -> list[Attachment]:
    """The attachments column: nearly always empty; else validated back into Attachments."""
    if not value or value == "[]":
        return []
    if isinstance(value, str):
        return attachments_adapter.validate_json(value)
    return attachments_adapter.validate_python(value)


_outcomes = TypeAdapter(list[GuardrailOutcome])


def _guardrails(value: Any) -> list[GuardrailOutcome]:
    """The guardrails column: nearly always empty; else validated back into outcomes."""
    if not value or value == "[]":
        return []
    if isinstance(value, str):
        return _outcomes.validate_json(value)
    return _outcomes.validate_python(value)


def transcript_query(message_model: Any, chat_pk: Any) -> Any:
    """The transcript's query: ``MESSAGE_COLUMNS`` of the chat's messages with their tool calls.

    The chat row itself is not joined: a verb's claim has just read it (cancel flag included),
    so the start checkpoint costs no query of its own. Superseded messages are left out."""
    return (
        # Superseded rows (an edit, a regenerated answer) are never read into a transcript.
        message_model.objects.filter(chat_id=chat_pk, superseded_at__isnull=True)
        .order_by("id", "tool_calls__id")
        .values_list(*MESSAGE_COLUMNS)
    )


def messages_from_rows(rows: list[Any]) -> list[Message]:
    """The transcript's rows (see ``transcript_query``) as messages, each with its tool calls."""
    # The per-row work is spelled out (no helper calls for the usual empty columns, the
    # instances made as ``trusted`` makes them): at hundreds of messages a step, this loop
    # is most of what reading a transcript costs in Python.
    messages: list[Message] = []
    append = messages.append
    new, set_attribute = Message.__new__, object.__setattr__
    statuses = _MESSAGE_STATUS
    last: Message | None = None
    last_key: Any = None
    for row in rows:
        (key, role, content, status, is_error, parsed, model, finish_reason, thinking,
         provider_data, attachments, guardrails, recall, answers_id, answers_name, call_key,
         call_id, call_name, call_arguments, call_state, call_provider_data, wait_reason,
         question, decision, decision_digest, handoff, call_guardrails,
         original_arguments) = row  # fmt: skip
        if last is None or last_key != key:
            # Rows are our own: built without validation, as ``trusted`` builds them.
            values = {
                "role": role,
                "content": content,
                "status": statuses[status],
                "tool_calls": [],
                "tool_call_id": answers_id,
                "tool_name": answers_name,
                "is_error": is_error,
                "attachments": [] if attachments == "[]" else _attachments(attachments),
                "parsed": None if parsed is None else _json(parsed, None),
                "model": model or None,
                "finish_reason": finish_reason or None,
                "thinking": thinking,
                "provider_data": {} if provider_data == "{}" else _json(provider_data, {}),
                "guardrails": [] if guardrails == "[]" else _guardrails(guardrails),
                "recall": None if recall is None else _json(recall, None),
                "created_at": None,  # read on demand: turn_started_at()
                "key": key,
                "superseded": False,  # the transcript's query leaves superseded rows out
            }
            last = new(Message)
            set_attribute(last, "__dict__", values)
            set_attribute(last, "__pydantic_fields_set__", set(_MESSAGE_FIELDS))
            set_attribute(last, "__pydantic_extra__", None)
            set_attribute(last, "__pydantic_private__", None)
            last_key = key
            append(last)
        if call_key is not None:
            last.tool_calls.append(
                trusted(
                    ToolCall,
                    {
                        "id": call_id,
                        "name": call_name,
                        "arguments": _json(call_arguments, {}),
                        "state": _TOOL_CALL_STATE[call_state],
                        "provider_data": _json(call_provider_data, {}),
                        "wait_reason": wait_reason or None,
                        "question": question or None,
                        "decision": decision or None,
                        "decision_digest": decision_digest or None,
                        "original_arguments": _json(original_arguments, None),
                        "guardrails": (
                            [] if call_guardrails in (None, "[]") else _guardrails(call_guardrails)
                        ),
                        "handoff": _json(handoff, None),
                        "key": call_key,
                    },
                )
            )
    return messages


#: every field of a message read back (its ``__pydantic_fields_set__``).
_MESSAGE_FIELDS = frozenset(Message.model_fields)
#: the fields set of the messages ``messages_from_values`` makes: one set for all of them
#: (pydantic only ever adds a field name to it, and every name is in it already).
_ALL_MESSAGE_FIELDS = set(_MESSAGE_FIELDS)
_ALL_CALL_FIELDS = set(ToolCall.model_fields)


def kept_values(messages: list[Message]) -> list[dict[str, Any]]:
    """The values of ``messages`` (built by ``messages_from_rows``, or by
    ``messages_from_values``), sharing nothing that can be changed in place with them: their
    lists, calls and JSON values are copies too.

    For a store that keeps the messages it read: what a verb does to its messages can't reach
    the values kept, and a message's values compare equal to them (``__dict__``) until
    something changes it. Kept as values, not messages: they are never handed out."""
    return [_detached(message.__dict__) for message in messages]


def messages_from_values(kept: list[dict[str, Any]]) -> list[Message]:
    """Messages of values ``kept_values`` kept, each with values of its own. Several times
    cheaper than building them from their rows again (no JSON to decode); made as
    ``messages_from_rows`` makes them."""
    messages: list[Message] = []
    append = messages.append
    new, set_attribute, detached, fields = _new, _set_attribute, _detached, _ALL_MESSAGE_FIELDS
    for values in kept:
        message = new(Message)
        set_attribute(message, "__dict__", detached(values))
        set_attribute(message, "__pydantic_fields_set__", fields)
        set_attribute(message, "__pydantic_extra__", None)
        set_attribute(message, "__pydantic_private__", None)
        append(message)
    return messages


def _detached(message_values: dict[str, Any]) -> dict[str, Any]:
    """A copy of a message's values sharing nothing that can be changed in place with them."""
    values = message_values.copy()
    calls = values["tool_calls"]
    values["tool_calls"] = [_copied_call(call) for call in calls] if calls else []
    data = values["provider_data"]
    values["provider_data"] = _thawed(data) if data else {}
    if values["parsed"] is not None:
        values["parsed"] = _thawed(values["parsed"])
    if values["recall"] is not None:
        values["recall"] = _thawed(values["recall"])
    attachments, guardrails = values["attachments"], values["guardrails"]
    values["attachments"] = (
        [item.model_copy(deep=True) for item in attachments] if attachments else []
    )
    values["guardrails"] = [item.model_copy(deep=True) for item in guardrails] if guardrails else []
    return values


def _copied_call(call: ToolCall) -> ToolCall:
    values = call.__dict__.copy()
    values["arguments"] = _thawed(values["arguments"])
    values["provider_data"] = _thawed(values["provider_data"])
    values["original_arguments"] = _thawed(values["original_arguments"])
    values["handoff"] = _thawed(values["handoff"])
    values["guardrails"] = [item.model_copy(deep=True) for item in values["guardrails"]]
    copy = _new(ToolCall)
    _set_attribute(copy, "__dict__", values)
    _set_attribute(copy, "__pydantic_fields_set__", _ALL_CALL_FIELDS)
    _set_attribute(copy, "__pydantic_extra__", None)
    _set_attribute(copy, "__pydantic_private__", None)
    return copy


def _thawed(value: Any) -> Any:
    """A copy of a decoded JSON value: its dicts and lists new, the rest (immutable) shared."""
    kind = type(value)
    if kind is dict:
        return {key: _thawed(item) for key, item in value.items()}
    if kind is list:
        return [_thawed(item) for item in value]
    return value


_new, _set_attribute = object.__new__, object.__setattr__


def held_calls(messages: list[Message]) -> set[Any]:
    """Keys of the latest round's calls held for a person (only that round can be held)."""
    for message in reversed(messages):
        if message.role == "assistant":
            return {call.key for call in message.tool_calls if call.state == ToolCallState.WAITING}
    return set()

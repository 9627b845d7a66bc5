"""Making eval sets: from stored chats (a queryset, the admin's action) or a JSONL file of
conversations, and turning a set's item back into the turn a case replays."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..exceptions import ConfigurationError
from ..messages import Message, MessageStatus
from ..models import EvalSet
from .replay import Turn

__all__ = ["item_turn", "set_from_chats", "set_from_jsonl"]


def _finished(messages: list[Message]) -> list[Message]:
    return [m for m in messages if m.status != MessageStatus.PARTIAL]


def _answer_after(messages: list[Message], index: int) -> str:
    """The text of the last answer of the turn starting at ``messages[index]``."""
    answer = ""
    for message in messages[index + 1 :]:
        if message.role == "user":
            break
        if message.role == "assistant" and message.content:
            answer = message.content
    return answer


def set_from_chats(
    name: str, chats: Iterable[Any], *, turns: str = "last", description: str = ""
) -> EvalSet:
    """A set of the chats' user turns: ``turns="last"`` one item per chat (its latest user
    message), ``"all"`` one per user message. Each item keeps the turn's text and the answer
    recorded for it."""
    if turns not in ("last", "all"):
        raise ConfigurationError(f"turns must be 'last' or 'all', not {turns!r}")
    items: list[dict[str, Any]] = []
    for chat in chats:
        messages = _finished(chat.conversation.messages)
        users = [i for i, m in enumerate(messages) if m.role == "user"]
        for index in users[-1:] if turns == "last" else users:
            items.append(
                {
                    "chat": chat.pk,
                    "turn": messages[index].key,
                    "input": messages[index].content,
                    "reference": _answer_after(messages, index),
                }
            )
    return EvalSet.objects.create(name=name, description=description, items=items)


def set_from_jsonl(
    name: str, source: str | Path | Iterable[str], *, description: str = ""
) -> EvalSet:
    """A set of conversations from JSONL: one JSON object per line with ``messages`` (role,
    content, tool_calls, tool_call_id... as ``agentloop.Message``), replayed at its last user
    message (what follows it is the recorded answer and its tool results), and optionally
    ``expected`` (the answer scorers compare with) and ``tools`` (tool import paths).

    A bad line is a ConfigurationError naming its number; nothing is saved then."""
    lines = Path(source).read_text().splitlines() if isinstance(source, str | Path) else source
    items: list[dict[str, Any]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
                raise ValueError("a line is a JSON object with a 'messages' list")
            messages = [Message.model_validate(m) for m in data["messages"]]
        except (ValueError, ValidationError) as exc:
            first = str(exc).splitlines()[0]
            raise ConfigurationError(f"line {number} of the eval set: {first}") from exc
        users = [i for i, m in enumerate(messages) if m.role == "user"]
        if not users:
            raise ConfigurationError(f"line {number} of the eval set has no user message")
        item: dict[str, Any] = {
            "messages": [m.model_dump(mode="json", exclude_defaults=True) for m in messages],
            "input": messages[users[-1]].content,
            "reference": _answer_after(messages, users[-1]),
        }
        if "expected" in data:
            item["expected"] = str(data["expected"])
        if data.get("tools"):
            item["tools"] = [str(reference) for reference in data["tools"]]
        items.append(item)
    return EvalSet.objects.create(name=name, description=description, items=items)


def item_turn(item: dict[str, Any], chat_model: Any) -> Turn:
    """The turn a set's item replays (its chat read now, one query); ConfigurationError when
    the chat or its turn is gone."""
    if "messages" in item:
        messages = [Message.model_validate(m) for m in item["messages"]]
        last_user = max(i for i, m in enumerate(messages) if m.role == "user")
        return Turn(messages[: last_user + 1], messages, list(item.get("tools", [])))
    chat = chat_model._default_manager.filter(pk=item["chat"]).first()
    if chat is None:
        raise ConfigurationError(f"chat {item['chat']} is gone")
    messages = _finished(chat.conversation.messages)
    at = next((i for i, m in enumerate(messages) if str(m.key) == str(item["turn"])), None)
    if at is None or messages[at].role != "user":
        raise ConfigurationError(f"message {item['turn']} is not a user turn of chat {chat.pk}")
    return Turn(messages[: at + 1], messages, list(chat.tools))

"""Small helpers the tests share: a chat's transcript read back in a comparable shape, a
one-question model request for the provider tests, and polling until something happens."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from agentloop.messages import Message, ModelRequest

__all__ = ["roles", "transcript", "user_request", "wait_until"]

_DEFAULT_FIELDS = ("role", "content")


def _messages(chat: Any) -> list[Any]:
    """A chat's messages in order: rows of a persisted chat, or an in-memory chat's list."""
    messages = chat.messages
    if isinstance(messages, list):  # an in-memory chat (agentloop.chat())
        return messages
    return list(messages.select_related("tool_call").order_by("id"))


def _field(message: Any, name: str) -> Any:
    if name == "call_id":  # the id of the call a tool message answers (rows hold a foreign key)
        if hasattr(message, "tool_call_id") and not isinstance(message.tool_call_id, str):
            return message.tool_call.call_id if message.tool_call_id else None
        return message.tool_call_id
    return getattr(message, name)


def transcript(chat: Any, *fields: str) -> list[tuple[Any, ...]]:
    """The chat's messages in order as tuples of ``fields`` (default: role and content).

    ``"call_id"`` is the id of the tool call a tool message answers (None on other messages).
    """
    names = fields or _DEFAULT_FIELDS
    return [tuple(_field(message, name) for name in names) for message in _messages(chat)]


def roles(chat: Any) -> list[str]:
    """The roles of the chat's messages in order."""
    return [message.role for message in _messages(chat)]


def user_request(model: str, text: str = "Hi", **fields: Any) -> ModelRequest:
    """A request to ``model`` holding one user message (``fields``: the request's others)."""
    return ModelRequest(model=model, messages=[Message(role="user", content=text)], **fields)


def wait_until(
    condition: Callable[[], Any],
    what: str,
    timeout: float = 60.0,
    on_timeout: Callable[[], str] = str,
    poll: float = 0.02,
) -> Any:
    """Poll ``condition`` until it is true and return its value; at ``timeout`` (generous:
    a loaded 2-core machine) fail saying ``what`` and ``on_timeout()``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:.0f} s waiting for {what}\n{on_timeout()}"
            )
        time.sleep(poll)

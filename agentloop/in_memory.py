"""``agentloop.chat()``: an in-memory chat, no database (scripts, tests, notebooks)."""

from __future__ import annotations

from typing import Any

from .conf import agentloop_settings
from .engine import Conversation, MemoryStore
from .messages import Message

__all__ = ["chat"]


def chat(
    model: str | None = None,
    *,
    provider: str | None = None,
    instructions: str | None = None,
    tools: tuple[Any, ...] | list[Any] = (),
) -> Conversation[Message]:
    """An in-memory chat (no database): the same verbs as the persisted ``Chat``; they return
    :class:`agentloop.Message`."""
    conversation: Conversation[Message] = Conversation(MemoryStore())
    conversation.with_model(model or agentloop_settings.DEFAULT_MODEL, provider)
    if instructions:
        conversation.with_instructions(instructions)
    if tools:
        conversation.with_tools(*tools)
    return conversation

"""agentloop: persisted LLM chats and a resumable, cancellable agent loop for Django.

Importing this package never imports Django models, so it is safe in settings
modules and plain scripts. The persisted chat is ``agentloop.models.Chat``.
"""

from __future__ import annotations

from typing import Any

from .agents import Agent
from .engine import Conversation, MemoryStore
from .exceptions import (
    AgentloopError,
    CancelledError,
    ConcurrentWriteError,
    ConfigurationError,
    LimitReachedError,
    NeedsInput,
    PendingToolCallsError,
    ProviderError,
    ToolError,
)
from .messages import Message, ToolCall
from .tools import Tool, tool

__all__ = [
    "Agent",
    "AgentloopError",
    "CancelledError",
    "ConcurrentWriteError",
    "ConfigurationError",
    "Conversation",
    "LimitReachedError",
    "Message",
    "NeedsInput",
    "PendingToolCallsError",
    "ProviderError",
    "Tool",
    "ToolCall",
    "ToolError",
    "chat",
    "tool",
]

__version__ = "0.1.0"


def chat(
    model: str | None = None,
    *,
    provider: str | None = None,
    instructions: str | None = None,
    tools: tuple[Any, ...] | list[Any] = (),
) -> Conversation:
    """An in-memory chat (no database): the same verbs as the persisted ``Chat``."""
    from .conf import agentloop_settings

    conversation = Conversation(MemoryStore())
    conversation.with_model(model or agentloop_settings.DEFAULT_MODEL, provider)
    if instructions:
        conversation.with_instructions(instructions)
    if tools:
        conversation.with_tools(*tools)
    return conversation

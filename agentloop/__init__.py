"""agentloop: persisted LLM chats and a resumable, cancellable agent loop for Django.

Importing this package never imports Django models, so it is safe in settings
modules and plain scripts. The persisted chat is ``agentloop.models.Chat``.
"""

from __future__ import annotations

from typing import Any

# The old import paths of moved modules keep working, with a warning, until 0.3.
from . import _deprecated  # noqa: F401  (installs the finder of old paths)

# agentloop.providers (register, the provider classes) is public: imported on purpose, not
# only because other modules happen to use it.
from . import providers as providers
from .agents import Agent
from .embeddings import Embeddings, aembed, embed
from .engine import Conversation
from .exceptions import (
    AgentloopError,
    BatchError,
    BudgetExceededError,
    CancelledError,
    ChatBusyError,
    ChatStoppedError,
    ConcurrentWriteError,
    ConfigurationError,
    DecisionConflictError,
    EditError,
    GuardrailBlockedError,
    GuardrailError,
    InvalidAnswerError,
    InvalidArgumentsError,
    LimitReachedError,
    NeedsInput,
    PendingToolCallsError,
    ProviderError,
    ToolError,
)
from .in_memory import chat
from .messages import Attachment, Message, ToolCall
from .tools import Tool, tool

__all__ = [
    "Agent",
    "AgentloopError",
    "Attachment",
    "BatchError",
    "BudgetExceededError",
    "CancelledError",
    "ChatBusyError",
    "ChatStoppedError",
    "ConcurrentWriteError",
    "ConfigurationError",
    "Conversation",
    "DecisionConflictError",
    "EditError",
    "Embeddings",
    "GuardrailBlockedError",
    "GuardrailError",
    "InvalidAnswerError",
    "InvalidArgumentsError",
    "LimitReachedError",
    "Message",
    "NeedsInput",
    "PendingToolCallsError",
    "ProviderError",
    "Tool",
    "ToolCall",
    "ToolError",
    "aembed",
    "batch",
    "chat",
    "embed",
    "tool",
]

__version__ = "0.1.0"


def batch(chats: Any, *, auto_continue: bool = False) -> Any:
    """Send the next model call of many persisted chats as one provider batch (about half
    the price, answered within a day); returns the ``agentloop.models.Batch``.

    Every chat must be awaiting the model; ``BatchError`` names those that aren't. The
    periodic task ``agentloop.poll_batches`` appends each answer to its chat; with
    ``auto_continue`` chats whose answers ask for tools run them and go into the next batch.
    """
    # Function-local: batches need the ORM's models; importing agentloop must not load them.
    from .batches import submit

    return submit(chats, auto_continue=auto_continue)

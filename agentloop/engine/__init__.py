"""The agent loop: verbs, checkpoints and tool running over a store interface.

Nothing here imports Django; the Django layer is one store among others.
"""

from .chat_config import ChatConfig, Limits, ToolOptions
from .conversation import CANCELLED_TOOL_RESULT, Conversation, StreamCallback
from .in_memory_store import MemoryStore
from .store import ChatStore, ToolTransaction, UsageRecord

__all__ = [
    "CANCELLED_TOOL_RESULT",
    "ChatConfig",
    "ChatStore",
    "Conversation",
    "Limits",
    "MemoryStore",
    "StreamCallback",
    "ToolOptions",
    "ToolTransaction",
    "UsageRecord",
]

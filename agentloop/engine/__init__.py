"""The agent loop: verbs, checkpoints and tool running over a store interface.

Nothing here imports Django; the Django layer is one store among others. Public: the names
below and the modules ``store`` (the store interface and its parts), ``in_memory_store``,
``rate_limiting``, ``compaction`` and ``tracing``; the ``_`` modules are the loop's
internals, one concept each (docs/design.md says which holds what).
"""

from ._chat_config import ChatConfig, Limits, MemoryOptions, ToolOptions
from ._conversation import CANCELLED_TOOL_RESULT, Conversation, StreamCallback
from .in_memory_store import MemoryStore
from .store import ChatStore, ToolTransaction, UsageRecord

__all__ = [
    "CANCELLED_TOOL_RESULT",
    "ChatConfig",
    "ChatStore",
    "Conversation",
    "Limits",
    "MemoryOptions",
    "MemoryStore",
    "StreamCallback",
    "ToolOptions",
    "ToolTransaction",
    "UsageRecord",
]

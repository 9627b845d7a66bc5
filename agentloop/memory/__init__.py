"""Memory across chats (docs/memory.md): the tools a model calls (``remember``, ``recall``,
``forget``, ``update_working_memory``), the recall a chat ``with_memory`` gets before each
model call (``ChatMemories``, the Django store's ``store.memory``), and whose memories a
chat reaches (``MemoryScope``). The rows are ``agentloop.models.Memory`` and
``WorkingMemory``."""

from __future__ import annotations

from ._memory_tools import MEMORY_TOOLS, forget, recall, remember, update_working_memory
from ._recalling import ChatMemories, render_memories
from ._scope import MemoryScope

__all__ = [
    "MEMORY_TOOLS",
    "ChatMemories",
    "MemoryScope",
    "forget",
    "recall",
    "remember",
    "render_memories",
    "update_working_memory",
]

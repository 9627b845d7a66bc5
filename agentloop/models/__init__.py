"""Persisted chats: abstract mixins and the concrete ``Chat``, ``Message``, ``ToolCall``, ``Usage``.

A project can make its own model a chat by subclassing the abstract classes, as
long as the related names match (``messages``, ``tool_calls``, ``usage_records``).

Each module holds one kind of row, its states, queryset and abstract mixin:

- ``chat``: ``Chat`` (its verbs delegate to ``chat.conversation``);
  ``chat_events``: the signals, live events and subagent hooks its conversation's events fire;
- ``messages``: ``Message`` and ``ToolCall``;
- ``usage``: ``Usage``, one row per provider attempt;
- ``batches``: ``Batch`` and ``BatchItem``;
- ``budgets``: ``Budget`` (a subject's limits and counters), its reservations and slots;
- ``memories``: ``Memory`` (what an owner's chats keep across conversations, with its
  embedding);
- ``past_chat_embeddings``: ``MessageEmbedding`` (past chats' messages embedded for search
  across an owner's chats, opt-in);
- ``evals``: ``EvalSet``, ``EvalRun`` and ``EvalCase`` (docs/evals.md);
- ``mcp_tokens``: ``MCPToken`` (a user's key to the agents served over MCP);
- ``rate_limits``: ``RateLimitBucket`` (the database's rate-limit buckets);
- ``bulk``: the set-based verbs of ``ChatQuerySet`` (``cancel``, ``halt``, ``resume``...)
  and what they return, ``BulkResult``.
"""

from .batches import (
    AbstractBatch,
    Batch,
    BatchItem,
    BatchItemStatus,
    BatchQuerySet,
    BatchStatus,
)
from .budgets import Budget, BudgetReservation, BudgetSlot
from .bulk import BulkResult
from .chat import AbstractChat, Chat, ChatQuerySet, ChatState
from .evals import EvalCase, EvalCaseState, EvalRun, EvalSet
from .mcp_tokens import MCPToken, MCPTokenQuerySet
from .memories import AbstractMemory, Memory, MemoryQuerySet, WorkingMemory
from .message import (
    AbstractMessage,
    AbstractToolCall,
    Message,
    MessageQuerySet,
    Role,
    ToolCall,
    ToolResultField,
)
from .past_chat_embeddings import MessageEmbedding, MessageEmbeddingQuerySet
from .rate_limits import RateLimitBucket
from .usage import AbstractUsage, Usage, UsageQuerySet, UsageStatus

__all__ = [
    "AbstractBatch",
    "AbstractChat",
    "AbstractMemory",
    "AbstractMessage",
    "AbstractToolCall",
    "AbstractUsage",
    "Batch",
    "BatchItem",
    "BatchItemStatus",
    "BatchQuerySet",
    "BatchStatus",
    "Budget",
    "BudgetReservation",
    "BudgetSlot",
    "BulkResult",
    "Chat",
    "ChatQuerySet",
    "ChatState",
    "EvalCase",
    "EvalCaseState",
    "EvalRun",
    "EvalSet",
    "MCPToken",
    "MCPTokenQuerySet",
    "Memory",
    "MemoryQuerySet",
    "Message",
    "MessageEmbedding",
    "MessageEmbeddingQuerySet",
    "MessageQuerySet",
    "RateLimitBucket",
    "Role",
    "ToolCall",
    "ToolResultField",
    "Usage",
    "UsageQuerySet",
    "UsageStatus",
    "WorkingMemory",
]

"""A chat's config: the data a worker in any process needs to continue it (``ChatConfig``),
and its parts. Plain data, validated; :mod:`._conversation` holds the ``with_*`` methods that
change it through the store."""

from __future__ import annotations

from decimal import Decimal
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..messages import Caching, Thinking

__all__ = ["ChatConfig", "Compaction", "Limits", "MemoryOptions", "ToolOptions"]


class ToolOptions(BaseModel):
    """How tools are offered and run (``with_tool_options``)."""

    model_config = ConfigDict(extra="forbid")

    #: "auto" (default), "none", "required", or the name of one tool.
    choice: str | None = None
    #: "one" asks the provider for one tool call per answer and runs only the first.
    calls: Literal["many", "one"] = "many"
    #: None: one after another; "threads": one thread per call; int: a pool of that size.
    concurrency: Literal["threads"] | int | None = None

    @field_validator("concurrency")
    @classmethod
    def _positive(cls, value: Any) -> Any:
        if isinstance(value, int) and value < 1:
            raise ValueError("concurrency must be at least 1")
        return value


class Limits(BaseModel):
    """Per-turn budgets (a turn starts at the last user message)."""

    model_config = ConfigDict(extra="forbid")

    max_model_calls: int | None = Field(default=None, ge=1)
    max_tool_calls: int | None = Field(default=None, ge=1)
    max_seconds: float | None = Field(default=None, gt=0)
    max_cost: Decimal | None = Field(default=None, gt=0)

    def is_set(self) -> bool:
        return any(value is not None for value in self.model_dump().values())


class Compaction(BaseModel):
    """When and how a long chat is summarised (``with_compaction``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: compact when the estimated input passes this share of the context window.
    at: float = Field(default=0.8, gt=0, le=1)
    #: the latest messages kept as they are (moved back so a tool call keeps its results).
    keep_recent: int = Field(default=8, ge=1)
    #: the model that writes the summary ("provider:model"); None: the chat's own.
    model: str | None = None


class MemoryOptions(BaseModel):
    """Memories given to the model before each call (``with_memory``; docs/memory.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: at most this many memories, the nearest the latest user message.
    k: int = Field(default=5, ge=1, le=100)
    #: none less similar than this (cosine similarity, -1 to 1).
    min_similarity: float = Field(default=0.0, ge=-1, le=1)
    #: the recalled memories' text within about this many tokens (nearest first).
    max_tokens: int = Field(default=500, ge=1)
    #: the memories of the chat's agent only (its import path), not the subject's shared ones.
    per_agent: bool = False
    #: the subject's working memory (a profile the model keeps) goes with the instructions.
    working: bool = False
    #: the embedding model ("provider:model"); None: ``agentloop.embed``'s default.
    model: str | None = None


class ChatConfig(BaseModel):
    """Everything about a chat that is not its transcript."""

    model_config = ConfigDict(extra="forbid")

    model: str = ""
    provider: str | None = None
    #: tools by import path (persisted chats) ...
    tool_paths: list[str] = Field(default_factory=list)
    tool_options: ToolOptions = Field(default_factory=ToolOptions)
    temperature: float | None = None
    max_output_tokens: int | None = None
    provider_options: dict[str, Any] = Field(default_factory=dict)
    headers: dict[str, str] = Field(default_factory=dict)
    #: JSON schema of the structured output, and the pydantic model's path when there is one.
    output_schema: dict[str, Any] | None = None
    schema_path: str | None = None
    limits: Limits = Field(default_factory=Limits)
    #: prompt caching (``with_caching``); None: none asked for.
    caching: Caching | None = None
    #: thinking (``with_thinking``); None: the model's default.
    thinking: Thinking | None = None
    #: the model's context window in tokens (``with_context_window``); None: the catalog's.
    context_window: int | None = Field(default=None, ge=1)
    #: compaction (``with_compaction``); None: off.
    compaction: Compaction | None = None
    #: models tried in order when a call to ``model`` fails in a way retrying can't fix.
    fallbacks: list[str] = Field(default_factory=list)
    #: guardrails by import path (persisted chats; ``with_guardrails``).
    guardrail_paths: list[str] = Field(default_factory=list)
    #: memories recalled before each model call (``with_memory``); None: off.
    memory: MemoryOptions | None = None

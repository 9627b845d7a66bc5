"""The conversation's data types, shared by the engine, the stores and the providers.

These are plain pydantic models with no Django in them: the engine reads a
transcript as a list of :class:`Message`, hands providers a :class:`ModelRequest`
and gets a :class:`ModelResponse` back. Streamed pieces are :data:`Chunk` values; what a
stream callback gets is a :data:`StreamUpdate`: the chunks, and a ``with_schema`` answer's
:class:`PartialOutput` as it grows.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationInfo,
    field_validator,
)

from .attachments import Attachment
from .storable_text import storable_json

__all__ = [
    "MAX_COST",
    "MAX_TOKENS",
    "Caching",
    "Chunk",
    "GuardrailOutcome",
    "Message",
    "MessageStatus",
    "ModelRequest",
    "ModelResponse",
    "PartialOutput",
    "Role",
    "StreamUpdate",
    "TextDelta",
    "Thinking",
    "ThinkingDelta",
    "TokenUsage",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallState",
    "ToolDefinition",
    "checked_cost",
    "chunk_adapter",
    "messages_adapter",
    "reported_tokens",
    "token_count",
]

logger = logging.getLogger(__name__)

#: "summary" is a compaction's summary of older messages: kept in the transcript, sent to
#: providers by the engine as context (see ``engine.compaction``), never as its own role.
Role = Literal["system", "user", "assistant", "tool", "summary"]


class MessageStatus(StrEnum):
    """Whether a message is a finished part of the conversation."""

    COMPLETE = "complete"
    #: written while an answer streams in; a crash leaves it like this.
    PARTIAL = "partial"
    #: a streamed answer cut short by cancel(); kept for the record.
    CANCELLED = "cancelled"
    #: a streamed answer whose model call then failed for good; kept for the record.
    FAILED = "failed"
    #: a user message or an answer a guardrail blocked; kept for the record, never sent.
    BLOCKED = "blocked"


class ToolCallState(StrEnum):
    """Where a tool call is in its life."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    #: its round was cancelled before it got a result.
    CANCELLED = "cancelled"
    #: held by a person (approval, question) or a subagent.
    WAITING = "waiting"


GuardrailStage = Literal["input", "output", "tool"]
GuardrailDecision = Literal["passed", "blocked", "replaced", "error"]


class GuardrailOutcome(BaseModel):
    """What one guardrail decided about a user message, an answer or a tool call (kept on
    the message or the call it judged; see docs/guardrails.md)."""

    model_config = ConfigDict(extra="forbid")

    #: the guardrail's name.
    guardrail: str
    stage: GuardrailStage
    decision: GuardrailDecision
    #: why it blocked (its own words), or what went wrong ("error").
    reason: str = ""
    #: what a replacement replaced (the text, or the tool call's arguments), when kept.
    original: str | dict[str, Any] | None = None
    #: it ran while the model call was in flight (an input guardrail ``run_in_parallel``).
    parallel: bool = False
    duration_ms: int | None = None


class ToolCall(BaseModel):
    """A tool the model asked to run."""

    model_config = ConfigDict(extra="forbid")

    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    state: ToolCallState = ToolCallState.PENDING
    #: opaque per-provider data that must be sent back (e.g. Gemini thought signatures).
    provider_data: dict[str, Any] = Field(default_factory=dict)
    #: why a WAITING call waits: "approval", "question", "subagent" or "deferred".
    wait_reason: str | None = None
    #: the question put to a person (wait_reason "question").
    question: str | None = None
    #: a decision: "approved", "denied", "answered" or "submitted" (a deferred result).
    decision: str | None = None
    #: digest of the arguments the decision was made for (see ``arguments_digest``).
    decision_digest: str | None = None
    #: the model's arguments, when an approver edited them (``arguments`` ran instead).
    original_arguments: dict[str, Any] | None = None
    #: the handoff this call made (``{"from": ..., "to": ..., "inputs": {...}}``), if any.
    handoff: dict[str, Any] | None = None
    #: what the chat's tool guardrails decided before it ran.
    guardrails: list[GuardrailOutcome] = Field(default_factory=list)
    #: the store's key for this call (a primary key for the Django store).
    key: Any = None

    def arguments_digest(self) -> str:
        """A stable digest of the arguments: an approval holds for exactly these. They are
        digested as stored (``storable_json``), so the arguments read back digest alike."""
        canonical = json.dumps(
            storable_json(self.arguments), sort_keys=True, separators=(",", ":"), default=str
        )
        return hashlib.sha256(f"{self.name}\n{canonical}".encode()).hexdigest()


class Message(BaseModel):
    """One message of a transcript."""

    model_config = ConfigDict(extra="forbid")

    role: Role
    content: str = ""
    status: MessageStatus = MessageStatus.COMPLETE
    #: tool calls requested by an assistant message.
    tool_calls: list[ToolCall] = Field(default_factory=list)
    #: for a tool message: the id of the call it answers, and that tool's name.
    tool_call_id: str | None = None
    tool_name: str | None = None
    #: for a tool message: the result is an error the model should see as one.
    is_error: bool = False
    #: images and documents sent with the message (user messages; tool results on the wire).
    attachments: list[Attachment] = Field(default_factory=list)
    #: structured output, when the chat has a schema.
    parsed: Any = None
    #: the model's readable thinking (reasoning summary) behind an assistant message; model
    #: text, untrusted. What must go back to the provider verbatim is in ``provider_data``.
    thinking: str = ""
    model: str | None = None
    finish_reason: str | None = None
    provider_data: dict[str, Any] = Field(default_factory=dict)
    #: what the chat's input (user message) or output (answer) guardrails decided about it.
    guardrails: list[GuardrailOutcome] = Field(default_factory=list)
    #: for an answer of a chat ``with_memory``: the memories it was given
    #: (``[{"id": ..., "similarity": ...}]``); None: no recall was made for it.
    recall: list[dict[str, Any]] | None = None
    created_at: datetime | None = None
    key: Any = None
    #: replaced by an edit or a regenerated answer: kept for the record, never sent again
    #: (stores leave such messages out of the transcript; see docs/editing.md).
    superseded: bool = False

    @property
    def is_finished(self) -> bool:
        """A complete message that is not superseded; partial, cancelled and blocked messages,
        and messages an edit or a regenerated answer replaced, don't count."""
        return self.status == MessageStatus.COMPLETE and not self.superseded


class TextDelta(BaseModel):
    """A piece of streamed answer text."""

    kind: Literal["text"] = "text"
    text: str


class ToolCallDelta(BaseModel):
    """A piece of a streamed tool call: its id and name first, then argument JSON text."""

    kind: Literal["tool_call"] = "tool_call"
    index: int = 0
    id: str | None = None
    name: str | None = None
    arguments: str = ""


class ThinkingDelta(BaseModel):
    """A piece of streamed thinking text, apart from the answer's text."""

    kind: Literal["thinking"] = "thinking"
    text: str


Chunk = Annotated[TextDelta | ToolCallDelta | ThinkingDelta, Field(discriminator="kind")]
chunk_adapter: TypeAdapter[TextDelta | ToolCallDelta | ThinkingDelta] = TypeAdapter(Chunk)


class PartialOutput(BaseModel):
    """The structured output of a ``with_schema`` answer while it streams: the JSON written
    so far, parsed (the objects and lists still open closed, the string being written cut
    where it is, a number still being written left out) and, with a pydantic model, valid as
    far as it goes (only fields still to come are missing). A stream callback gets one after
    a text chunk whenever it differs from the last; the saved message's ``parsed`` is the
    final, validated one."""

    kind: Literal["partial_output"] = "partial_output"
    #: JSON values: dicts, lists, strings, numbers, booleans, None.
    value: Any


#: what a stream callback is called with: the provider's chunks, and the engine's partials.
StreamUpdate = TextDelta | ToolCallDelta | ThinkingDelta | PartialOutput


# -- numbers a provider reports: read at one boundary -------------------------------------------
#: the most tokens counted for one attempt: what a usage row holds (an ``integer`` column on
#: PostgreSQL), far beyond any model's window. A larger count is counted as this.
MAX_TOKENS = 2**31 - 1
#: the largest cost recorded for one attempt (``Usage.cost``: 14 digits, 8 of them decimal).
#: A larger one is recorded as this: too much rather than nothing against a budget.
MAX_COST = Decimal("999999.99999999")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def token_count(value: Any, name: str = "tokens") -> int:
    """A token count (``name``) as a provider reported it, made safe: a whole number from 0
    to :data:`MAX_TOKENS`. None (not reported) is 0; a count that is negative, not a
    number, NaN or beyond :data:`MAX_TOKENS` is logged as a warning and counted as 0 (as
    :data:`MAX_TOKENS` when too large); a fraction is rounded up. Never a credit, never
    a row that can't be written."""
    if value is None:
        return 0
    number: float | int
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, float | str | Decimal):
        try:
            number = float(value)
        except ValueError:
            number = math.nan
    else:
        number = math.nan
    if isinstance(number, float):
        if math.isnan(number):
            logger.warning("A provider reported %s=%s: counted as 0.", name, _shown(value))
            return 0
        if math.isinf(number):
            number = MAX_TOKENS + 1 if number > 0 else -1
        else:
            number = math.ceil(number)
    if number < 0:
        logger.warning("A provider reported %s=%s: counted as 0.", name, _shown(value))
        return 0
    if number > MAX_TOKENS:
        logger.warning("A provider reported %s=%s: counted as %d.", name, _shown(value), MAX_TOKENS)
        return MAX_TOKENS
    return number


def reported_tokens(data: Any, key: str) -> int:
    """The token count ``data[key]`` a provider reported, made safe (:func:`token_count`);
    0 when ``data`` is not an object."""
    return token_count(data.get(key), key) if isinstance(data, Mapping) else 0


def checked_cost(amount: Any, model: str = "") -> Decimal | None:
    """The cost of one attempt (of ``model``), made safe: None (unknown) as it is; a cost
    that is negative, NaN or not a number is logged as a warning and unknown (None: never
    a credit), one beyond :data:`MAX_COST` (infinite included) is logged and
    :data:`MAX_COST`."""
    if amount is None:
        return None
    of = f" of {model}" if model else ""
    try:
        if isinstance(amount, bool):
            raise TypeError(amount)
        value = amount if isinstance(amount, Decimal) else Decimal(str(amount))
    except (InvalidOperation, TypeError, ValueError):
        logger.warning("The cost%s is not a number (%s): recorded as unknown.", of, _shown(amount))
        return None
    if value.is_nan() or value < 0:
        logger.warning("The cost%s is %s: recorded as unknown.", of, _shown(amount))
        return None
    if value > MAX_COST:
        logger.warning("The cost%s is %s: recorded as %s.", of, _shown(amount), MAX_COST)
        return MAX_COST
    return value


class TokenUsage(BaseModel):
    """Tokens one provider attempt used.

    ``input_tokens`` is the whole prompt, cache reads and writes included (as OpenAI counts
    it); ``cache_read_tokens`` and ``cache_write_tokens`` say how much of it the provider
    read from, or wrote to, its prompt cache. ``cached_tokens`` is the older name of
    ``cache_read_tokens``, still accepted and readable. Each count is made safe as it is
    read (:func:`token_count`).
    """

    model_config = ConfigDict(populate_by_name=True)

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = Field(
        default=0, validation_alias=AliasChoices("cache_read_tokens", "cached_tokens")
    )
    cache_write_tokens: int = 0
    #: of ``cache_write_tokens``, those written for an hour (Anthropic prices them higher).
    cache_write_1h_tokens: int = 0
    reasoning_tokens: int = 0

    @field_validator(
        "input_tokens",
        "output_tokens",
        "cache_read_tokens",
        "cache_write_tokens",
        "cache_write_1h_tokens",
        "reasoning_tokens",
        mode="before",
    )
    @classmethod
    def _safe_count(cls, value: Any, info: ValidationInfo) -> int:
        return token_count(value, info.field_name or "tokens")

    @property
    def cached_tokens(self) -> int:
        """The older name of ``cache_read_tokens``."""
        return self.cache_read_tokens


CacheTTL = Literal["5m", "1h"]
ThinkingEffort = Literal["low", "medium", "high"]


class Caching(BaseModel):
    """Prompt caching asked for by ``with_caching``: Anthropic breakpoints, OpenAI's key."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: how long Anthropic keeps a cache entry ("5m" or "1h"; 1h writes cost more).
    ttl: CacheTTL = "5m"
    #: OpenAI's ``prompt_cache_key``: requests sharing it are routed to the same cache.
    key: str | None = None


class Thinking(BaseModel):
    """Thinking asked for by ``with_thinking``; each provider maps it to its own field."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: None (without a budget) turns thinking off where the model lets it be turned off.
    effort: ThinkingEffort | None = None
    #: a token budget for the thinking (Anthropic, Gemini, OpenRouter); overrides ``effort``
    #: where a provider takes a budget.
    budget_tokens: int | None = Field(default=None, ge=1)

    @property
    def enabled(self) -> bool:
        """Thinking is asked for (an effort or a budget), not turned off."""
        return self.effort is not None or self.budget_tokens is not None


class ToolDefinition(BaseModel):
    """What a provider is told about a tool."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=dict)


class ModelRequest(BaseModel):
    """Everything a provider needs for one model call."""

    model: str
    messages: list[Message]
    tools: list[ToolDefinition] = Field(default_factory=list)
    #: "auto", "none", "required", or a tool name.
    tool_choice: str | None = None
    #: False asks the provider for at most one tool call per answer.
    parallel_tool_calls: bool | None = None
    temperature: float | None = None
    max_output_tokens: int | None = None
    output_schema: dict[str, Any] | None = None
    provider_options: dict[str, Any] = Field(default_factory=dict)
    headers: dict[str, str] = Field(default_factory=dict)
    stream: bool = False
    #: prompt caching (``with_caching``); None: the provider's default behaviour.
    caching: Caching | None = None
    #: thinking (``with_thinking``); None: the model's default.
    thinking: Thinking | None = None


class ModelResponse(BaseModel):
    """One finished model answer."""

    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: TokenUsage = Field(default_factory=TokenUsage)
    finish_reason: str | None = None
    model: str | None = None
    parsed: Any = None
    #: the readable thinking text (see ``Message.thinking``).
    thinking: str = ""
    provider_data: dict[str, Any] = Field(default_factory=dict)


messages_adapter: TypeAdapter[list[Message]] = TypeAdapter(list[Message])

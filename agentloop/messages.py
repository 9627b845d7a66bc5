"""The conversation's data types, shared by the engine, the stores and the providers.

These are plain pydantic models with no Django in them: the engine reads a
transcript as a list of :class:`Message`, hands providers a :class:`ModelRequest`
and gets a :class:`ModelResponse` back. Streamed pieces are :data:`Chunk` values.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from .attachments import Attachment

__all__ = [
    "Chunk",
    "Message",
    "MessageStatus",
    "ModelRequest",
    "ModelResponse",
    "Role",
    "TextDelta",
    "TokenUsage",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallState",
    "ToolDefinition",
    "chunk_adapter",
    "messages_adapter",
]

Role = Literal["system", "user", "assistant", "tool"]


class MessageStatus(StrEnum):
    """Whether a message is a finished part of the conversation."""

    COMPLETE = "complete"
    #: written while an answer streams in; a crash leaves it like this.
    PARTIAL = "partial"
    #: a streamed answer cut short by cancel(); kept for the record.
    CANCELLED = "cancelled"
    #: a streamed answer whose model call then failed for good; kept for the record.
    FAILED = "failed"


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


class ToolCall(BaseModel):
    """A tool the model asked to run."""

    model_config = ConfigDict(extra="forbid")

    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    state: ToolCallState = ToolCallState.PENDING
    #: opaque per-provider data that must be sent back (e.g. Gemini thought signatures).
    provider_data: dict[str, Any] = Field(default_factory=dict)
    #: why a WAITING call waits: "approval", "question" or "subagent".
    wait_reason: str | None = None
    #: the question put to a person (wait_reason "question").
    question: str | None = None
    #: a person's decision: "approved", "denied" or "answered".
    decision: str | None = None
    #: digest of the arguments the decision was made for (see ``arguments_digest``).
    decision_digest: str | None = None
    #: the store's key for this call (a primary key for the Django store).
    key: Any = None

    def arguments_digest(self) -> str:
        """A stable digest of the arguments: an approval holds for exactly these."""
        canonical = json.dumps(self.arguments, sort_keys=True, separators=(",", ":"), default=str)
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
    model: str | None = None
    finish_reason: str | None = None
    provider_data: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime | None = None
    key: Any = None

    @property
    def is_finished(self) -> bool:
        """A complete message; partial and cancelled answers don't count."""
        return self.status == MessageStatus.COMPLETE


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


Chunk = Annotated[TextDelta | ToolCallDelta, Field(discriminator="kind")]
chunk_adapter: TypeAdapter[TextDelta | ToolCallDelta] = TypeAdapter(Chunk)


class TokenUsage(BaseModel):
    """Tokens one provider attempt used."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0


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


class ModelResponse(BaseModel):
    """One finished model answer."""

    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: TokenUsage = Field(default_factory=TokenUsage)
    finish_reason: str | None = None
    model: str | None = None
    parsed: Any = None
    provider_data: dict[str, Any] = Field(default_factory=dict)


messages_adapter: TypeAdapter[list[Message]] = TypeAdapter(list[Message])

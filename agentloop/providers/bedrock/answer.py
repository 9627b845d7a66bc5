"""Bedrock Converse's answers: a ``converse`` response, or the events of a
``converse-stream``, as a ``ModelResponse``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ...exceptions import InvalidResponseError
from ...messages import (
    ModelResponse,
    TextDelta,
    ThinkingDelta,
    TokenUsage,
    ToolCall,
    ToolCallDelta,
    reported_tokens,
)
from ..base import ChunkCallback
from ..common import json_text, tool_call_from_text
from ..thinking import stamped
from .mapping import CONTENT_KEY

__all__ = ["Answer", "usage_of"]

_FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "guardrail_intervened": "content_filter",
    "content_filtered": "content_filter",
}


def usage_of(usage: Mapping[str, Any]) -> TokenUsage:
    """Converse counts cache reads and writes apart from ``inputTokens``; ours is the whole
    prompt, with the reads and writes also counted apart (1-hour writes from
    ``cacheDetails``)."""
    read = reported_tokens(usage, "cacheReadInputTokens")
    written = reported_tokens(usage, "cacheWriteInputTokens")
    written_1h = sum(
        reported_tokens(detail, "inputTokens")
        for detail in usage.get("cacheDetails") or ()
        if isinstance(detail, dict) and detail.get("ttl") == "1h"
    )
    return TokenUsage(
        input_tokens=reported_tokens(usage, "inputTokens") + read + written,
        output_tokens=reported_tokens(usage, "outputTokens"),
        cache_read_tokens=read,
        cache_write_tokens=written,
        cache_write_1h_tokens=min(written_1h, written),
    )


class Answer:
    """One answer's content blocks, from a response or as streamed events arrive."""

    def __init__(self, provider: str, on_chunk: ChunkCallback | None = None) -> None:
        self.provider = provider
        self.on_chunk = on_chunk
        self.blocks: dict[int, dict[str, Any]] = {}
        self.tool_numbers: dict[int, int] = {}  # block index -> position among the calls
        self.usage: dict[str, Any] = {}
        self.stop_reason: str | None = None
        self.stopped = False

    # -- a whole response --------------------------------------------------------------------
    @classmethod
    def of(cls, provider: str, data: Any) -> Answer:
        """The answer of a ``converse`` response body."""
        message = data.get("output", {}).get("message") if isinstance(data, dict) else None
        if not isinstance(message, dict) or not isinstance(message.get("content"), list):
            raise InvalidResponseError(f"{provider} answered without output.message.content")
        answer = cls(provider)
        for index, block in enumerate(message["content"]):
            if not isinstance(block, dict):
                raise InvalidResponseError(f"{provider} answered with a content block {block!r}")
            if "toolUse" in block:
                tool_use = dict(block["toolUse"])
                tool_use["input"] = json_text(tool_use.get("input", {}))
                block = {"toolUse": tool_use}
            answer.blocks[index] = block
        answer.usage = data.get("usage") or {}
        answer.stop_reason = data.get("stopReason")
        answer.stopped = True
        return answer

    # -- streamed events ---------------------------------------------------------------------
    def event(self, kind: str, data: Mapping[str, Any]) -> None:
        """Apply one ``converse-stream`` event."""
        if kind == "contentBlockStart":
            start = data.get("start") or {}
            index = int(data["contentBlockIndex"])
            if "toolUse" in start:
                tool_use = start["toolUse"]
                self.blocks[index] = {"toolUse": {**tool_use, "input": ""}}
                self.tool_numbers[index] = len(self.tool_numbers)
                self._emit(
                    ToolCallDelta(
                        index=self.tool_numbers[index],
                        id=tool_use["toolUseId"],
                        name=tool_use["name"],
                    )
                )
            else:
                self.blocks.setdefault(index, {})
        elif kind == "contentBlockDelta":
            self._delta(int(data["contentBlockIndex"]), data.get("delta") or {})
        elif kind == "messageStop":
            self.stop_reason = data.get("stopReason")
            self.stopped = True
        elif kind == "metadata":
            self.usage = data.get("usage") or {}
        # messageStart, contentBlockStop and unknown events carry nothing we need

    def _emit(self, chunk: Any) -> None:
        if self.on_chunk is not None:
            self.on_chunk(chunk)

    def _delta(self, index: int, delta: Mapping[str, Any]) -> None:
        block = self.blocks.setdefault(index, {})
        if "text" in delta:
            block["text"] = block.get("text", "") + delta["text"]
            if delta["text"]:
                self._emit(TextDelta(text=delta["text"]))
        elif "toolUse" in delta:
            fragment = str((delta["toolUse"] or {}).get("input") or "")
            tool_use = block.setdefault("toolUse", {"input": ""})
            tool_use["input"] = tool_use.get("input", "") + fragment
            if fragment and index in self.tool_numbers:
                self._emit(ToolCallDelta(index=self.tool_numbers[index], arguments=fragment))
        elif "reasoningContent" in delta:
            piece = delta["reasoningContent"] or {}
            reasoning = block.setdefault("reasoningContent", {})
            if "redactedContent" in piece:  # encrypted thinking: kept, never shown
                redacted = reasoning.get("redactedContent", "") + piece["redactedContent"]
                reasoning["redactedContent"] = redacted
            else:
                text = reasoning.setdefault("reasoningText", {})
                if piece.get("text"):
                    text["text"] = text.get("text", "") + piece["text"]
                    self._emit(ThinkingDelta(text=piece["text"]))
                if piece.get("signature"):
                    text["signature"] = text.get("signature", "") + piece["signature"]
        else:  # citations and other blocks: kept as they come, sent back as they were
            for key, value in delta.items():
                block.setdefault(key, value)

    # -- the response --------------------------------------------------------------------------
    def response(self) -> ModelResponse:
        texts: list[str] = []
        thoughts: list[str] = []
        calls: list[ToolCall] = []
        kept: list[dict[str, Any]] = []
        opaque = False
        for index in sorted(self.blocks):
            block = self.blocks[index]
            if not block:
                continue
            if "text" in block:
                texts.append(str(block["text"]))
                kept.append({"text": block["text"]})
            elif "toolUse" in block:
                tool_use = block["toolUse"]
                calls.append(
                    tool_call_from_text(tool_use["toolUseId"], tool_use["name"], tool_use["input"])
                )
                kept.append({"toolUse": {"toolUseId": tool_use["toolUseId"]}})
            else:  # reasoningContent and others: sent back verbatim
                opaque = True
                reasoning = block.get("reasoningContent") or {}
                thought = (reasoning.get("reasoningText") or {}).get("text")
                if thought:
                    thoughts.append(str(thought))
                kept.append(block)
        provider_data: dict[str, Any] = {}
        if self.stop_reason:
            provider_data["stop_reason"] = self.stop_reason
        if opaque:
            provider_data = stamped({**provider_data, CONTENT_KEY: kept}, self.provider)
        return ModelResponse(
            content="".join(texts),
            thinking="\n\n".join(thoughts),
            tool_calls=calls,
            usage=usage_of(self.usage),
            finish_reason=_FINISH_REASONS.get(self.stop_reason or "", self.stop_reason),
            provider_data=provider_data,
        )


def payload(provider: str, raw: bytes) -> dict[str, Any]:
    """A stream event's JSON payload (an object), or InvalidResponseError."""
    try:
        data = json.loads(raw or b"{}")
    except ValueError as exc:
        raise InvalidResponseError(f"{provider} streamed an event that is not JSON") from exc
    if not isinstance(data, dict):
        raise InvalidResponseError(f"{provider} streamed an event that is not a JSON object")
    return data

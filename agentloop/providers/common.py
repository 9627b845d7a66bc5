"""Mapping helpers every provider shares: tool-call assembly and argument parsing."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from ..messages import ToolCall, ToolCallDelta

__all__ = ["INVALID_ARGUMENTS", "ToolCallAssembler", "new_call_id", "parse_arguments"]

#: provider_data key holding argument text that was not a JSON object.
INVALID_ARGUMENTS = "invalid_arguments"


def new_call_id() -> str:
    """An id for a tool call the provider sent without one (Gemini)."""
    return f"call_{uuid.uuid4().hex[:24]}"


def parse_arguments(text: str | None) -> tuple[dict[str, Any], str | None]:
    """``(arguments, None)`` for a JSON object (empty text is ``{}``), else ``({}, text)``."""
    if text is None or not text.strip():
        return {}, None
    try:
        value = json.loads(text)
    except ValueError:
        return {}, text
    if not isinstance(value, dict):
        return {}, text
    return value, None


def tool_call_from_text(
    call_id: str | None, name: str, arguments: str | None, **provider_data: Any
) -> ToolCall:
    """A ToolCall from JSON argument text; invalid text is kept for the error result."""
    parsed, invalid = parse_arguments(arguments)
    data = {key: value for key, value in provider_data.items() if value is not None}
    if invalid is not None:
        data[INVALID_ARGUMENTS] = invalid
    return ToolCall(id=call_id or new_call_id(), name=name, arguments=parsed, provider_data=data)


@dataclass
class _Partial:
    id: str | None = None
    name: str = ""
    arguments: list[str] = field(default_factory=list)
    provider_data: dict[str, Any] = field(default_factory=dict)


class ToolCallAssembler:
    """Rebuilds tool calls from streamed deltas keyed by index."""

    def __init__(self) -> None:
        self._calls: dict[int, _Partial] = {}

    def add(self, delta: ToolCallDelta, **provider_data: Any) -> None:
        call = self._calls.setdefault(delta.index, _Partial())
        if delta.id:
            call.id = delta.id
        if delta.name:
            call.name = delta.name
        if delta.arguments:
            call.arguments.append(delta.arguments)
        call.provider_data.update({k: v for k, v in provider_data.items() if v is not None})

    def __bool__(self) -> bool:
        return bool(self._calls)

    def calls(self) -> list[ToolCall]:
        """The finished calls, in index order."""
        return [
            tool_call_from_text(
                partial.id, partial.name, "".join(partial.arguments), **partial.provider_data
            )
            for _, partial in sorted(self._calls.items())
        ]

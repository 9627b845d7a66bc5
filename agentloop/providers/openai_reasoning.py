"""Thinking on Chat Completions servers: the request fields each one reads, and the
``reasoning_details`` OpenRouter sends (whole, or in pieces while streaming).

Servers speaking Chat Completions disagree on thinking; a dialect option
(``thinking_format``) says which fields a server reads:

- ``"openai"``: ``reasoning_effort`` (api.openai.com, and compatible servers);
- ``"openrouter"``: ``reasoning: {"effort"}`` or ``{"max_tokens"}`` (a budget),
  ``{"enabled": false}`` to turn it off;
- ``"deepseek"``: ``reasoning_effort`` and ``thinking: {"type": "enabled"|"disabled"}``
  (not for ``deepseek-reasoner`` and ``deepseek-chat``, whose names fix the mode).

Answers carry the thinking text in ``reasoning`` (OpenRouter, Ollama) or
``reasoning_content`` (DeepSeek), and OpenRouter adds ``reasoning_details``: signed or
encrypted blocks that must be sent back as received, with the assistant message they came
with, or thinking models behind it (Claude, Gemini 3) refuse the next request.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..messages import Thinking, TokenUsage, reported_tokens

__all__ = ["DETAILS_KEY", "ReasoningDetails", "reasoning_fields", "usage_from"]

#: Message.provider_data key holding OpenRouter's ``reasoning_details`` as received.
DETAILS_KEY = "reasoning_details"

# DeepSeek models whose name fixes whether they think: they take no ``thinking`` toggle.
_FIXED_MODE_MODELS = ("deepseek-reasoner", "deepseek-chat")
# Fields of a streamed detail that arrive in pieces; the others arrive whole.
_PIECEWISE = ("text", "summary")


def reasoning_fields(thinking: Thinking, thinking_format: str, model: str) -> dict[str, Any]:
    """The request fields that ask ``model`` for ``thinking`` on a ``thinking_format`` server."""
    effort = thinking.effort
    if thinking_format == "openrouter":
        if thinking.budget_tokens is not None:
            return {"reasoning": {"max_tokens": thinking.budget_tokens}}
        return {"reasoning": {"effort": effort} if effort else {"enabled": False}}
    fields: dict[str, Any] = {}
    if effort is not None:
        fields["reasoning_effort"] = effort
    if thinking_format == "deepseek" and model not in _FIXED_MODE_MODELS:
        fields["thinking"] = {"type": "enabled" if thinking.enabled else "disabled"}
    return fields


class ReasoningDetails:
    """Rebuilds ``reasoning_details`` from streamed pieces, keyed by each detail's index."""

    def __init__(self) -> None:
        self._details: dict[int, dict[str, Any]] = {}

    def add(self, pieces: Iterable[Any]) -> None:
        """Merge one delta's details: text pieces join, other fields arrive whole."""
        for piece in pieces:
            if not isinstance(piece, dict):
                continue
            index = piece.get("index")
            key = int(index) if isinstance(index, int) else len(self._details)
            detail = self._details.setdefault(key, {})
            for field, value in piece.items():
                if field in _PIECEWISE and isinstance(value, str) and field in detail:
                    detail[field] += value
                elif value is not None:
                    detail[field] = value

    def details(self) -> list[dict[str, Any]]:
        """The details in index order."""
        return [self._details[key] for key in sorted(self._details)]


def usage_from(data: Any) -> TokenUsage:
    """A Chat Completions ``usage`` object (with OpenRouter's cache writes) as TokenUsage."""
    if not isinstance(data, Mapping):
        return TokenUsage()
    prompt_details = data.get("prompt_tokens_details") or {}
    completion_details = data.get("completion_tokens_details") or {}
    return TokenUsage(
        input_tokens=reported_tokens(data, "prompt_tokens"),
        output_tokens=reported_tokens(data, "completion_tokens"),
        cache_read_tokens=reported_tokens(prompt_details, "cached_tokens"),
        cache_write_tokens=reported_tokens(prompt_details, "cache_write_tokens"),
        reasoning_tokens=reported_tokens(completion_details, "reasoning_tokens"),
    )

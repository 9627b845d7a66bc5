"""Thinking, shared by the providers: ``with_thinking`` mapped to each vendor's request
fields, and the rule for sending a thinking model's opaque replay data back.

A thinking model's answer carries two things: readable thinking text (``Message.thinking``)
and opaque data that must go back with later requests, verbatim (Anthropic signatures and
redacted blocks, OpenAI encrypted reasoning items, OpenRouter ``reasoning_details``,
DeepSeek ``reasoning_content``, Gemini thought signatures). Providers keep that data in
``Message.provider_data`` stamped with their own name (:data:`REPLAY_PROVIDER`), and send
it back only to the provider that made it: after a switch to another provider (another
name, even one speaking the same wire format) it stays in the database but is not sent,
since a signature made for one provider means nothing to another.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..messages import Message, Thinking

__all__ = [
    "EFFORT_BUDGETS",
    "REPLAY_PROVIDER",
    "budget_tokens",
    "replays_to",
    "stamped",
]

#: Message.provider_data key: the name of the provider whose replay data the message holds.
REPLAY_PROVIDER = "replay_provider"

#: thinking budget (tokens) for an effort, where a provider takes a budget and none was
#: given. 1024 is Anthropic's minimum; each step is four times the one before.
EFFORT_BUDGETS: dict[str, int] = {"low": 1024, "medium": 4096, "high": 16384}


def budget_tokens(thinking: Thinking) -> int | None:
    """The thinking budget: the one given, else the effort's (None: thinking is off)."""
    if thinking.budget_tokens is not None:
        return thinking.budget_tokens
    return EFFORT_BUDGETS[thinking.effort] if thinking.effort is not None else None


def stamped(provider_data: Mapping[str, Any], provider: str) -> dict[str, Any]:
    """``provider_data`` marked as replay data of ``provider``."""
    return {**provider_data, REPLAY_PROVIDER: provider}


def replays_to(message: Message, provider: str) -> bool:
    """Whether ``message``'s replay data may be sent to ``provider``: it made it, or the
    message predates the stamp (kept as it was sent before)."""
    owner = message.provider_data.get(REPLAY_PROVIDER)
    return owner is None or owner == provider

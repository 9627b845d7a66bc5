"""Options that follow the model, not the chat.

A chat keeps what ``with_thinking`` and ``with_temperature`` asked for; each request sends
an option only to a model that takes it. Every provider's body builder reads
:func:`thinking_for` and :func:`temperature_for` instead of the request's fields, so this
holds on every path (a call in process, a background step, a fallback, a batch). What a
model takes is the model catalog's word (``models.json``: ``thinking``, ``temperature``);
a model the catalog doesn't list gets what was asked for, since whoever named it (a
fine-tune, a new release, a local model) may know better.

A dropped option is logged at DEBUG, naming the option and the model: after
``with_model("openai:gpt-4.1-mini")`` on a chat that thinks, ``reasoning_effort`` would
be refused; after a fallback from ``gpt-4.1-mini`` at ``temperature=0.2`` to ``gpt-5-mini``,
the temperature would be.
"""

from __future__ import annotations

import logging
from typing import TypeVar

from ..messages import ModelRequest, Thinking
from .catalog import accepts

__all__ = ["temperature_for", "thinking_for"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


def _for_model(value: T | None, option: str, shown: str, model: str, provider: str) -> T | None:
    """``value``, or None (and a debug line) when the catalog says ``model`` refuses it."""
    if value is None or accepts(model, option) is not False:
        return value
    logger.debug(
        "%s: %s not sent to %s: the model catalog lists it without %s",
        provider,
        shown,
        model,
        option,
    )
    return None


def thinking_for(request: ModelRequest, provider: str) -> Thinking | None:
    """The thinking to send with ``request`` (None: none asked for, or the model doesn't
    think)."""
    thinking = request.thinking
    if thinking is None:
        return None
    shown = f"with_thinking(effort={thinking.effort!r}"
    if thinking.budget_tokens is not None:
        shown += f", budget_tokens={thinking.budget_tokens!r}"
    return _for_model(thinking, "thinking", shown + ")", request.model, provider)


def temperature_for(request: ModelRequest, provider: str) -> float | None:
    """The temperature to send with ``request`` (None: none asked for, or the model takes
    only its own, as OpenAI's reasoning models do)."""
    shown = f"temperature={request.temperature!r}"
    return _for_model(request.temperature, "temperature", shown, request.model, provider)

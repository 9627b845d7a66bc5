"""A chat's callbacks by event: what ``Conversation.on`` registers and its parts send."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

from ..exceptions import ConfigurationError

__all__ = ["EVENTS", "Callbacks"]

#: the events a callback can be registered for.
EVENTS = (
    "before_message",
    "after_message",
    "before_tool_call",
    "after_tool_result",
    "cancelled",
    "stopped",
    "budget_exceeded",
    "model_fallback",
    "halted",
    "handed_off",
    "claimed",
    "subagents_waiting",
    "guardrail_blocked",
    "superseded",
    "forked",
)


class Callbacks:
    """Callbacks registered per event, called in the order they were added."""

    def __init__(self) -> None:
        self._by_event: dict[str, list[Callable[..., Any]]] = defaultdict(list)

    def add(self, event: str, callback: Callable[..., Any]) -> None:
        """Register ``callback`` for ``event`` (``ConfigurationError`` for an unknown event)."""
        if event not in EVENTS:
            raise ConfigurationError(f"Unknown event {event!r}; choose from {', '.join(EVENTS)}")
        self._by_event[event].append(callback)

    def emit(self, event: str, *args: Any) -> None:
        """Call the callbacks of ``event`` with ``args``."""
        for callback in self._by_event.get(event, ()):
            callback(*args)

    def listens(self, event: str) -> bool:
        """Whether any callback waits for ``event``."""
        return bool(self._by_event.get(event))

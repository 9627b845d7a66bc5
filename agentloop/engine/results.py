"""What a step returns: the move it made, and the move a next step would make."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["MessageT", "StepResult"]

#: the message type a conversation's verbs return: ``agentloop.Message`` in memory, the
#: message model (``agentloop.models.Message``) for a persisted chat.
MessageT = TypeVar("MessageT")


@dataclass(frozen=True)
class StepResult:
    """What one step did and what comes next."""

    #: the last message the step added (the store's record), or None when it did nothing.
    message: Any
    #: "done", "wait", "tools" or "generate": the move a next step would make.
    next_move: str

"""What a running tool knows about its call (``ToolContext``), the handoff it may ask for, and
which tool runs here (``current_tool_context``: ``Agent.find()`` inside a tool of the very
chat it finds hands that chat over through it)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async

from ..exceptions import ConfigurationError
from ..messages import ToolCall

__all__ = ["Handoff", "ToolContext", "current_tool_context", "running"]


@dataclass(frozen=True)
class Handoff:
    """A handoff a running tool asked for (``ToolContext.hand_off``): the chat goes to
    ``agent`` (an ``agentloop.Agent`` class) with ``inputs`` once the call's result is saved."""

    agent: Any
    inputs: dict[str, Any] = field(default_factory=dict)


class ToolContext:
    """What a running tool knows about its call.

    ``tool_call.id`` is the provider's call id, stable across retries of the
    round: use it as an idempotency key for side effects.
    """

    def __init__(
        self,
        tool_call: ToolCall,
        chat: Any = None,
        background: bool = False,
        cancel_check: Callable[[], bool] | None = None,
    ) -> None:
        self.tool_call = tool_call
        #: the chat running the tool: a persisted ``Chat`` or an in-memory Conversation.
        self.chat = chat
        #: True when a background worker (Celery or embedded) runs this step.
        self.background = background
        self._cancel_check = cancel_check
        #: the handoff this call asked for (``hand_off``), made when its result is saved.
        self.handoff: Handoff | None = None

    def cancel_requested(self) -> bool:
        """Whether cancel() was called for this chat: a long tool may stop early.

        (The loop itself stops right after the tool returns.)"""
        return bool(self._cancel_check and self._cancel_check())

    async def acancel_requested(self) -> bool:
        """``cancel_requested()`` for an ``async def`` tool (the read runs off the loop)."""
        return await sync_to_async(self.cancel_requested)()

    def halt(self, reason: str) -> bool:
        """Stop the chat after this tool round, before its next model call (``chat.halt``)."""
        halt = getattr(self.chat, "halt", None)
        if halt is None:
            raise RuntimeError("This tool runs outside a chat: there is nothing to halt.")
        return bool(halt(reason))

    def hand_off(self, agent: Any, **inputs: Any) -> None:
        """Hand the chat over to ``agent`` (an ``agentloop.Agent`` class) when this call's
        result is saved: from the next model call on the chat is the agent's (instructions,
        model, tools), in this run and in any later one. ``inputs`` fill the agent's
        instructions, on top of the chat's stored inputs the agent declares."""
        if not callable(getattr(agent, "take_over", None)):
            raise ConfigurationError(f"{agent!r} is not an agent: pass an Agent subclass.")
        self.handoff = Handoff(agent, dict(inputs))


#: the context of the tool running in this thread or task (``current_tool_context``).
_current_context: ContextVar[ToolContext | None] = ContextVar("agentloop_tool", default=None)


def current_tool_context() -> ToolContext | None:
    """The context of the tool running here (this thread, or this task of an async verb);
    None outside a tool."""
    return _current_context.get()


@contextmanager
def running(context: ToolContext) -> Iterator[None]:
    """While a tool's ``execute`` runs: ``current_tool_context()`` is ``context``."""
    token = _current_context.set(context)
    try:
        yield
    finally:
        _current_context.reset(token)

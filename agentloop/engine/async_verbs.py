"""The async twins of the verbs (a part of ``Conversation``).

Each drives the same effects as its sync verb (:mod:`.effects`) with the async driver: the
decisions and database phases are the sync verb's own, run with ``ChatStore.run_phase``;
the model request, backoffs and ``async def`` tools are awaited on the event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, Generic, Self

from .drivers import drive_async
from .effects import Effects
from .results import MessageT, StepResult
from .store import ChatStore
from .streaming import StreamCallback

__all__ = ["AsyncVerbs"]


class AsyncVerbs(Generic[MessageT]):
    """``agenerate``, ``arun_tools``, ``astep``, ``acomplete``, ``aask``, ``aask_later``,
    ``acancel`` and the async reads: what a Conversation offers to async code."""

    store: ChatStore
    _generating: Callable[[StreamCallback | None], Effects[Any]]
    _running_tools: Callable[[], Effects[list[Any]]]
    _advancing: Callable[[StreamCallback | None], Effects[StepResult]]
    _completing: Callable[..., Effects[Any]]
    ask_later: Callable[..., Any]
    cancel: Callable[[], bool]
    is_complete: Callable[[], bool]
    is_waiting: Callable[[], bool]

    async def agenerate(self, stream: StreamCallback | None = None) -> MessageT:
        """``generate()`` for async code; ``stream`` may be sync or ``async def``."""
        return await drive_async(self._generating(stream), self.store)

    async def arun_tools(self) -> list[MessageT]:
        """``run_tools()`` for async code: ``async def`` tools are awaited on this loop,
        sync tools run on a thread."""
        return await drive_async(self._running_tools(), self.store)

    async def astep(self, stream: StreamCallback | None = None) -> MessageT | None:
        """``step()`` for async code."""
        return (await self.aadvance(stream)).message

    async def aadvance(self, stream: StreamCallback | None = None) -> StepResult:
        """``advance()`` for async code."""
        return await drive_async(self._advancing(stream), self.store)

    async def acomplete(self, stream: StreamCallback | None = None) -> MessageT:
        """``complete()`` for async code."""
        return await drive_async(self._completing(stream), self.store)

    async def aask(
        self, content: str, stream: StreamCallback | None = None, *, attachments: Any = None
    ) -> MessageT:
        """``ask()`` for async code; returns the answer."""
        return await drive_async(self._completing(stream, (content, attachments)), self.store)

    async def aask_later(
        self, content: str, attachments: Any = None, *, if_busy: str | None = None
    ) -> Self:
        """``ask_later()`` for async code (one write, run as a database phase)."""
        await self.store.run_phase(partial(self.ask_later, content, attachments, if_busy=if_busy))
        return self

    async def acancel(self) -> bool:
        """``cancel()`` for async code: True when a run was in progress, queued or waiting."""
        return await self.store.run_phase(self.cancel)

    async def ais_complete(self) -> bool:
        """``is_complete()`` for async code."""
        return await self.store.run_phase(self.is_complete)

    async def ais_waiting(self) -> bool:
        """``is_waiting()`` for async code."""
        return await self.store.run_phase(self.is_waiting)

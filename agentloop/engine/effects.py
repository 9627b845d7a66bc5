"""The I/O a verb asks its driver for: the verbs' decisions and database phases are written
once, as generators that yield these effects; a sync driver and an async driver perform them
(:mod:`.drivers`).

A verb's generator runs its database phases itself (between two yields) and hands out only
the waiting: a model request, a backoff sleep, a tool run. What an effect returns is sent back
into the generator; what it raises is thrown into it, at the ``yield``, so the verb's own
``try``/``except`` handle it exactly as if the call had been made in place.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from ..messages import ModelRequest, ToolCall
from ..providers.base import Provider

if TYPE_CHECKING:  # the stream state imports the store; only its type is named here
    from .checkpoints import Checkpoints
    from .guarding import Panel
    from .judging import Judging
    from .streaming import StreamState

__all__ = [
    "AwaitJudging",
    "Effects",
    "Judge",
    "Launch",
    "RunTool",
    "Send",
    "Sleep",
    "StartJudging",
    "WaitAny",
]

T = TypeVar("T")

#: a verb (or a part of one) written as a generator of effects, returning ``T``.
Effects = Generator[Any, Any, T]


@dataclass
class Send:
    """One provider request; with ``state`` it streams into it. Returns the ModelResponse.

    The driver bounds it (:mod:`.sending`): a slot of the provider's concurrency limit, a
    total deadline, and ``checkpoints`` to stop it at a cancel."""

    provider: Provider
    request: ModelRequest
    state: StreamState | None
    checkpoints: Checkpoints | None = None
    #: the name the provider is registered under (limits and timeouts are set by it).
    provider_name: str = ""
    #: input guardrails judging meanwhile: the call is abandoned when their verdict won't
    #: let it stand (``CallAbandoned``), and its stream is held until they pass.
    judging: Judging | None = None


@dataclass
class Sleep:
    """A backoff between two attempts."""

    seconds: float


@dataclass
class RunTool:
    """Run one tool call (validated, errors turned into outcomes). Returns a ToolOutcome."""

    tool_class: Any
    call: ToolCall
    chat: Any
    background: bool
    cancel_check: Callable[[], bool]
    #: wraps work run on a thread of its own (the Django store closes its connections).
    wrap: Callable[[Callable[[], Any]], Callable[[], Any]]


@dataclass
class Launch:
    """Start ``tool`` alongside others (at most ``size`` at once). Returns a handle."""

    tool: RunTool
    size: int


@dataclass
class WaitAny:
    """Wait until one of the launched ``handles`` finishes. Returns ``[(handle, outcome)]``."""

    handles: list[Any]


@dataclass
class Judge:
    """Run guardrails on ``panels`` (:mod:`.guarding`), in order, each within its time
    limit. Returns their verdicts; a cancel seen meanwhile (``checkpoints``) raises."""

    panels: list[Panel]
    #: wraps a sync check run on a thread of its own (the Django store closes connections).
    wrap: Callable[[Callable[[], Any]], Callable[[], Any]]
    #: the run's checkpoints, looked at while a check decides (None: no cancel is watched).
    checkpoints: Checkpoints | None = None


@dataclass
class StartJudging:
    """Start ``judge`` while the verb goes on (the model call). Returns ``judging``."""

    judge: Judge
    judging: Judging


@dataclass
class AwaitJudging:
    """Wait for ``judging``'s verdicts; when they pass, a stream ``state`` held meanwhile
    gets its chunks. Returns the verdicts; a cancel seen meanwhile (``checkpoints``)
    raises."""

    judging: Judging
    state: StreamState | None = None
    checkpoints: Checkpoints | None = None

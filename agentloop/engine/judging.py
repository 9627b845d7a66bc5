"""Running guardrail checks (:mod:`.guarding`'s panels), each bounded, for the drivers.

``judge`` (sync verbs) and ``ajudge`` (async verbs) judge panels in order. Each check is
bounded: a sync one decides on a thread of its own (an ``async def`` one, under a sync verb,
on that thread's event loop; under an async verb, as a task), while the verb waits in short
slices, looking at the run's cancel and at the check's time limit
(:meth:`~agentloop.guardrails.Guardrail.time_limit`) in between. A cancel stops the judging
at once (``CancelledError``); a check past its limit fails closed, as one that raised. A
check left behind is abandoned: a task is cancelled, a thread runs on until it returns
(Python can't stop one) and its decision is ignored.

:class:`Judging` is input guardrails judging while the model call is in flight
(``StartJudging``, ``AwaitJudging``): it tells the call to stop as soon as its verdict will
not let the call stand. ``unkept_usage`` is the usage row of a call whose answer the
guardrails did not let be kept.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import threading
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from asgiref.sync import async_to_sync

from ..exceptions import GuardrailError
from ..guardrails import Guardrail, GuardrailContext
from ..messages import ModelResponse, TokenUsage
from ..providers.base import Provider
from .guarding import Panel, Verdict
from .store import UsageRecord

__all__ = [
    "ABANDONED",
    "SLICE",
    "UNJUDGED",
    "AsyncWatch",
    "Judged",
    "Judging",
    "Watch",
    "ajudge",
    "judge",
    "unkept_usage",
]

#: why the usage row of a call the input guardrails did not let stand keeps no answer.
ABANDONED = "abandoned: the input guardrails did not pass the message"
#: ... and of a call whose answer a cancel stopped while guardrails judged it.
UNJUDGED = "cancelled while guardrails judged the answer"
#: longest wait for a check's decision between two looks at the cancel and its time limit.
SLICE = 0.05

#: the run's cancel checkpoint while a check decides: raises ``CancelledError`` at a cancel.
Watch = Callable[[], None]
#: ... from a coroutine (the flag is read as a database phase).
AsyncWatch = Callable[[], Awaitable[None]]
#: wraps work run on a thread of its own (the Django store closes its connections).
Wrap = Callable[[Callable[[], Any]], Callable[[], Any]]


async def _awaited(value: Any) -> Any:
    return await value


def _same(function: Callable[[], Any]) -> Callable[[], Any]:
    return function


def _decide(guardrail: Guardrail, context: GuardrailContext) -> Any:
    """The check's decision, here (an ``async def`` check on an event loop of its own)."""
    decision = guardrail.check(context)
    if inspect.isawaitable(decision):
        decision = async_to_sync(_awaited)(decision)
    return decision


def _on_a_thread(
    guardrail: Guardrail,
    context: GuardrailContext,
    wrap: Wrap,
    deliver: Callable[[Any, BaseException | None], None],
) -> None:
    """Decide on a daemon thread of its own (in a copy of this context), then ``deliver``
    the decision or the error; a thread nobody waits for any more runs on harmlessly."""

    def run() -> None:
        try:
            decision = _decide(guardrail, context)
        except BaseException as exc:  # delivered: the verb fails closed on it
            deliver(None, exc)
        else:
            deliver(decision, None)

    work = partial(contextvars.copy_context().run, wrap(run))
    threading.Thread(target=work, name="agentloop-guardrail", daemon=True).start()


def _timed_out(guardrail: Guardrail, limit: float) -> GuardrailError:
    source = "its timeout=" if guardrail.timeout is not None else "GUARDRAIL_TIMEOUT"
    return GuardrailError(
        f"guardrail {guardrail.name!r} ({guardrail.stage}) did not decide within its "
        f"{limit:g} s time limit ({source})"
    )


def _left(deadline: float | None) -> float:
    if deadline is None:
        return SLICE
    return max(0.0, min(SLICE, deadline - time.monotonic()))


class _Decision:
    """What a check on a thread delivered, once ``done`` is set."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None

    def deliver(self, value: Any, error: BaseException | None) -> None:
        self.value, self.error = value, error
        self.done.set()

    def came(self, started: float, limit: float | None, watch: Watch | None) -> bool:
        """Wait for it: True once it came, False past ``limit``; ``watch`` looks at the
        run's cancel in between (and raises at one)."""
        deadline = None if limit is None else started + limit
        while not self.done.wait(_left(deadline)):
            if watch is not None:
                watch()
            if deadline is not None and time.monotonic() >= deadline:
                return False
        return True


def judge(panels: list[Panel], wrap: Wrap = _same, watch: Watch | None = None) -> list[Verdict]:
    """Judge each panel's case in order, until one does not pass. Each check decides on a
    thread of its own (``wrap`` wraps its work) within its time limit; ``watch`` (the run's
    cancel checkpoint) is looked at while it does."""
    verdicts = []
    for panel in panels:
        for guardrail in panel.guardrails:
            started = time.monotonic()
            limit = guardrail.time_limit()
            decision = _Decision()
            _on_a_thread(guardrail, panel.context(guardrail), wrap, decision.deliver)
            if not decision.came(started, limit, watch):
                assert limit is not None  # noqa: S101 - only a limit ends the wait early
                panel.fail(guardrail, _timed_out(guardrail, limit), started)
                break
            if decision.error is not None:
                panel.fail(guardrail, decision.error, started)
                break
            if not panel.take(guardrail, decision.value, started):
                break
        verdicts.append(panel.verdict)
        if not panel.verdict.passed:
            break
    return verdicts


async def _acheck(guardrail: Guardrail, context: GuardrailContext) -> Any:
    decision = guardrail.check(context)
    if inspect.isawaitable(decision):
        decision = await decision
    return decision


def _deliver_to(
    loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], value: Any, error: Any
) -> None:
    """Hand a thread's decision to a coroutine waiting on ``loop``."""

    def settle() -> None:
        if future.done():  # abandoned meanwhile (cancelled)
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    try:
        loop.call_soon_threadsafe(settle)
    except RuntimeError:  # its loop is closed: nobody waits for it
        pass


def _forget(future: asyncio.Future[Any]) -> None:
    """A decision nobody waits for any more: its error, if any, is read (so that asyncio
    doesn't report it as never retrieved)."""
    if not future.cancelled():
        future.exception()


async def _acame(
    pending: asyncio.Future[Any], started: float, limit: float | None, watch: AsyncWatch | None
) -> bool:
    deadline = None if limit is None else started + limit
    while True:
        done, _ = await asyncio.wait([pending], timeout=_left(deadline))
        if done:
            return True
        if watch is not None:
            await watch()
        if deadline is not None and time.monotonic() >= deadline:
            return False


async def ajudge(
    panels: list[Panel], wrap: Wrap = _same, watch: AsyncWatch | None = None
) -> list[Verdict]:
    """``judge`` from a coroutine: ``async def`` checks as tasks of this loop, sync ones on
    a thread of their own (``wrap`` wraps its work); each within its time limit, ``watch``
    looking at the run's cancel meanwhile."""
    loop = asyncio.get_running_loop()
    verdicts = []
    for panel in panels:
        for guardrail in panel.guardrails:
            started = time.monotonic()
            limit = guardrail.time_limit()
            context = panel.context(guardrail)
            pending: asyncio.Future[Any]
            if guardrail.is_async():
                pending = asyncio.ensure_future(_acheck(guardrail, context))
            else:
                pending = loop.create_future()
                _on_a_thread(guardrail, context, wrap, partial(_deliver_to, loop, pending))
            try:
                came = await _acame(pending, started, limit, watch)
            finally:
                if not pending.done():  # a cancel, or past its limit: abandoned
                    pending.add_done_callback(_forget)
                    pending.cancel()
            if not came:
                assert limit is not None  # noqa: S101 - only a limit ends the wait early
                panel.fail(guardrail, _timed_out(guardrail, limit), started)
                break
            try:
                decision = pending.result()
            except Exception as exc:
                panel.fail(guardrail, exc, started)
                break
            if not panel.take(guardrail, decision, started):
                break
        verdicts.append(panel.verdict)
        if not panel.verdict.passed:
            break
    return verdicts


class Judging:
    """Input guardrails judging while the model call is in flight (``run_in_parallel``)."""

    def __init__(self, panels: list[Panel]) -> None:
        self.panels = panels
        #: set once the verdict will not let the call stand (a block, a replacement, an
        #: error): the call in flight is abandoned (see agentloop.engine.sending).
        self.stopped = threading.Event()
        #: set once the verdicts are in (``settle``): a waiter may wait on it, bounded.
        self.verdicts_in = threading.Event()
        self.verdicts: list[Verdict] = []
        #: the task judging (the async driver's), cancelled when the verb ends first.
        self.task: Any = None
        #: the verb has applied the verdicts (``Guards.settle_input``).
        self.applied = False

    def settle(self, verdicts: list[Verdict]) -> None:
        self.verdicts = verdicts
        if not all(verdict.clean for verdict in verdicts):
            self.stopped.set()
        self.verdicts_in.set()

    def settle_failed(self, error: BaseException) -> None:
        """The judging itself broke (not a guardrail's own failure): fail closed."""
        panel = self.panels[0]
        if panel.verdict.error is None:
            panel.fail(panel.guardrails[0], error, time.monotonic())
        self.settle([panel.verdict])

    @property
    def settled(self) -> bool:
        return self.verdicts_in.is_set()

    @property
    def passed(self) -> bool:
        """Settled, and every case passed as it was."""
        return self.verdicts_in.is_set() and not self.stopped.is_set()

    def wait(self) -> list[Verdict]:
        self.verdicts_in.wait()
        return self.verdicts


class Judged(Exception):  # noqa: N818 - an outcome, never seen outside the verb
    """The input guardrails judging during the model call did not let it stand."""

    def __init__(self, verdicts: list[Verdict]) -> None:
        super().__init__("the input guardrails did not pass the message")
        self.verdicts = verdicts


def unkept_usage(
    provider: Provider,
    provider_name: str,
    model_id: str,
    started: float,
    response: ModelResponse | None,
    *,
    why: str,
    reservation: Any = None,
) -> UsageRecord:
    """The usage row of a model call whose answer is not kept for ``why`` (the input
    guardrails did not let the call stand; a cancel came while its answer was judged): what
    the provider reported, when it answered. It settles the call's budget ``reservation``."""
    usage = response.usage if response is not None else None
    return UsageRecord(
        provider=provider_name,
        model=model_id,
        status="cancelled",
        usage=usage or TokenUsage(),
        cost=provider.cost(model_id, usage) if usage is not None else None,
        error=why,
        duration_ms=int((time.monotonic() - started) * 1000),
        reservation=reservation,
    )

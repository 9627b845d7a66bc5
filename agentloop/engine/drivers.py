"""The two drivers of a verb's effects (:mod:`.effects`): one for sync verbs, one for async.

A verb is a generator: its decisions and its database phases run between two ``yield``s;
the driver performs what it yields (a model request, a backoff, a tool run) and sends the
result back, or throws the error in. The sync driver does the I/O in place. The async
driver awaits it on the event loop (``Provider.arequest``, ``asyncio.sleep``, an
``async def`` tool) and runs each database phase with ``ChatStore.run_phase``: on the
thread Django's async ORM uses for the Django store, in place for the memory store.

Before each wait (a model request, a backoff, a tool run, waiting for launched tools) both
call ``ChatStore.before_wait``, still in the database phase's thread: the Django store gives
its connection back there, so a step holds none while it waits (docs/background.md).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from functools import partial
from typing import Any, TypeVar

from asgiref.sync import sync_to_async

from . import tracing
from .checkpoints import Checkpoints
from .effects import (
    AwaitJudging,
    Effects,
    Judge,
    Launch,
    RunTool,
    Send,
    Sleep,
    StartJudging,
    WaitAny,
)
from .judging import SLICE, AsyncWatch, Judging, Watch, ajudge, judge
from .sending import asend, send
from .store import ChatStore
from .tool_execution import aexecute_tool, execute_tool

__all__ = ["drive", "drive_async"]

T = TypeVar("T")


def _resume(effects: Effects[T], value: Any, error: BaseException | None) -> tuple[bool, Any]:
    """Run the verb to its next effect: (False, effect), or (True, its result) when it ended.
    (A StopIteration can't cross a thread's future: the end is returned as a flag.)"""
    try:
        effect = effects.throw(error) if error is not None else effects.send(value)
    except StopIteration as stop:
        return True, stop.value
    return False, effect


def _advance(
    effects: Effects[T],
    value: Any,
    error: BaseException | None,
    tools_here: bool,
    before_wait: Callable[[], None],
) -> tuple[bool, Any]:
    """``_resume``, then ``before_wait`` ahead of an effect that waits; with ``tools_here`` (the
    phase runs on the database's thread, where a sync tool runs anyway) a sync tool's run is
    done in place, saving two thread hops."""
    while True:
        ended, effect = _resume(effects, value, error)
        if ended:
            return ended, effect
        if not isinstance(effect, Launch | StartJudging):  # starting waits for nothing
            before_wait()
        if not (tools_here and isinstance(effect, RunTool)) or effect.tool_class.is_async():
            return ended, effect
        value, error = None, None
        try:
            value = _sync_call(effect)()
        except BaseException as exc:
            error = exc


def _no_wait() -> None:
    """``before_wait`` of a verb driven without a store."""


def _sync_call(tool: RunTool) -> Callable[[], Any]:
    return partial(
        execute_tool, tool.tool_class, tool.call, tool.chat, tool.background, tool.cancel_check
    )


def drive(effects: Effects[T], store: ChatStore | None = None) -> T:
    """Run a verb's effects in this thread: the I/O in place, concurrent tools on a pool;
    ``store.before_wait()`` ahead of each wait."""
    before_wait = store.before_wait if store is not None else _no_wait
    pool: ThreadPoolExecutor | None = None
    pool_size = 0
    value: Any = None
    error: BaseException | None = None
    try:
        while True:
            ended, effect = _resume(effects, value, error)
            if ended:
                result: T = effect
                return result
            value, error = None, None
            try:
                if not isinstance(effect, Launch | StartJudging):  # starting waits for nothing
                    before_wait()
                if isinstance(effect, Send):
                    value = send(effect)  # bounded: a slot, a deadline, a cancel watchdog
                elif isinstance(effect, Sleep):
                    time.sleep(effect.seconds)
                elif isinstance(effect, RunTool):
                    value = _sync_call(effect)()
                elif isinstance(effect, Launch):
                    if pool is None or pool_size != effect.size:
                        # A round's tools all finished before the next round launches any.
                        if pool is not None:
                            pool.shutdown()
                        pool = ThreadPoolExecutor(effect.size, thread_name_prefix="agentloop-tool")
                        pool_size = effect.size
                    # carry: the tool thread's spans join this verb's trace.
                    value = pool.submit(tracing.carry(effect.tool.wrap(_sync_call(effect.tool))))
                elif isinstance(effect, WaitAny):
                    done, _ = wait(effect.handles, return_when=FIRST_COMPLETED)
                    value = [(future, future.result()) for future in done]
                elif isinstance(effect, Judge):
                    value = judge(effect.panels, effect.wrap, _watch(effect.checkpoints))
                elif isinstance(effect, StartJudging):
                    value = _start_judging(effect)
                elif isinstance(effect, AwaitJudging):
                    value = _await_judging(effect)
                else:  # pragma: no cover - an effect this driver doesn't know is a bug
                    raise TypeError(f"unknown effect {effect!r}")
            except BaseException as exc:
                error = exc
    finally:
        effects.close()
        if pool is not None:
            pool.shutdown()


def _watch(checkpoints: Checkpoints | None) -> Watch | None:
    """The cancel checkpoint looked at while guardrails decide (throttled: the notice at
    once, the flag as often as a stream would read it)."""
    return None if checkpoints is None else partial(checkpoints.check, force=False)


def _await_judging(effect: AwaitJudging) -> list[Any]:
    """Wait for the verdicts of guardrails judging meanwhile, looking at the cancel."""
    judging = effect.judging
    while not judging.verdicts_in.wait(SLICE):
        if effect.checkpoints is not None:
            effect.checkpoints.check(force=False)
    if effect.state is not None and judging.passed:
        effect.state.release()
    return judging.verdicts


def _start_judging(effect: StartJudging) -> Judging:
    """Judge on a thread of its own while the verb goes on (the model call); the verb
    looks at the cancel (the call's watch, then ``AwaitJudging``), not this thread."""
    judging = effect.judging

    def run() -> None:
        try:
            judging.settle(judge(effect.judge.panels, effect.judge.wrap))
        except BaseException as exc:  # never left unsettled: the verb waits for it
            judging.settle_failed(exc)

    work = tracing.carry(effect.judge.wrap(run))
    threading.Thread(target=work, name="agentloop-guardrails", daemon=True).start()
    return judging


async def drive_async(effects: Effects[T], store: ChatStore) -> T:
    """Run a verb's effects from a coroutine: its database phases with ``store.run_phase``,
    its I/O awaited; sync tools on a thread, ``async def`` tools on this loop."""
    phase = store.run_phase
    tools_here = store.phases_on_a_thread
    before_wait = store.before_wait
    value: Any = None
    error: BaseException | None = None
    tasks: set[asyncio.Future[Any]] = set()
    try:
        while True:
            ended, effect = await phase(_advance, effects, value, error, tools_here, before_wait)
            if ended:
                result: T = effect
                return result
            value, error = None, None
            try:
                value = await _perform(effect, phase, tasks)
            except BaseException as exc:
                error = exc
    finally:
        for task in tasks:
            task.cancel()
        if inspect.getgeneratorstate(effects) == inspect.GEN_SUSPENDED:
            # Left mid-verb (the task was cancelled during a phase): the verb's cleanup (its
            # release) is a database phase too.
            await phase(effects.close)


async def _perform(effect: Any, phase: Any, tasks: set[asyncio.Future[Any]]) -> Any:
    if isinstance(effect, Send):
        return await asend(effect, phase)  # bounded: a slot, a deadline, a cancel watchdog
    if isinstance(effect, Sleep):
        await asyncio.sleep(effect.seconds)
        return None
    if isinstance(effect, RunTool):
        # One at a time: a sync tool runs where the verb's database phases run (it may use
        # the ORM, as in a sync verb), never on the loop.
        return await _run_tool(effect, thread_sensitive=True)
    if isinstance(effect, Launch):
        task = asyncio.ensure_future(_run_tool(effect.tool, thread_sensitive=False))
        tasks.add(task)
        return task
    if isinstance(effect, WaitAny):
        done, _ = await asyncio.wait(effect.handles, return_when=asyncio.FIRST_COMPLETED)
        tasks.difference_update(done)
        return [(task, task.result()) for task in done]
    if isinstance(effect, Judge):
        return await ajudge(effect.panels, effect.wrap, _awatch(effect.checkpoints, phase))
    if isinstance(effect, StartJudging):
        return _astart_judging(effect, tasks)
    if isinstance(effect, AwaitJudging):
        judging = effect.judging
        watch = _awatch(effect.checkpoints, phase)
        if judging.task is not None and not judging.settled:
            while not (await asyncio.wait([judging.task], timeout=SLICE))[0]:
                if watch is not None:
                    await watch()
            tasks.discard(judging.task)
        verdicts = judging.wait()  # settled by now: no wait
        if effect.state is not None and judging.passed:
            await effect.state.arelease()
        return verdicts
    raise TypeError(f"unknown effect {effect!r}")  # pragma: no cover - a bug


def _astart_judging(effect: StartJudging, tasks: set[asyncio.Future[Any]]) -> Judging:
    """Judge in a task of this loop while the verb goes on (sync checks on threads)."""
    judging = effect.judging

    async def run() -> None:
        try:
            judging.settle(await ajudge(effect.judge.panels, effect.judge.wrap))
        except asyncio.CancelledError as exc:  # the verb ended first: settled, and cancelled
            judging.settle_failed(exc)
            raise
        except Exception as exc:  # never left unsettled: the verb waits for it
            judging.settle_failed(exc)

    judging.task = asyncio.ensure_future(run())
    tasks.add(judging.task)
    return judging


def _awatch(checkpoints: Checkpoints | None, phase: Any) -> AsyncWatch | None:
    """``_watch`` from a coroutine: the flag, when due, is read as a database phase."""
    if checkpoints is None:
        return None

    async def watch() -> None:
        if checkpoints.due():
            await phase(partial(checkpoints.check, force=False))

    return watch


async def _run_tool(tool: RunTool, *, thread_sensitive: bool) -> Any:
    if tool.tool_class.is_async():
        return await aexecute_tool(tool)
    work = _sync_call(tool) if thread_sensitive else tool.wrap(_sync_call(tool))
    return await sync_to_async(work, thread_sensitive=thread_sensitive)()

"""Performing a verb's effects (:mod:`._effects`): the two drivers (one for sync verbs, one
for async), a model request sent, and one tool call run.

A verb is a generator: its decisions and its database phases run between two ``yield``s;
the driver performs what it yields (a model request, a backoff, a tool run) and sends the
result back, or throws the error in. The sync driver does the I/O in place. The async
driver awaits it on the event loop (``Provider.arequest``, ``asyncio.sleep``, an
``async def`` tool) and runs each database phase with ``ChatStore.run_phase``: on the
thread Django's async ORM uses for the Django store, in place for the memory store.

Before each wait (a model request, a backoff, a tool run, waiting for launched tools) both
call ``ChatStore.before_wait``, still in the database phase's thread: the Django store gives
its connection back there, so a step holds none while it waits (docs/background.md).

Sending a :class:`~._effects.Send`: a call first takes a slot of each limit it falls under
(:mod:`agentloop.providers.call_slots`), waiting in short slices: each slice looks at the
run's cancel (the notice at once, the flag as often as a stream would) and at the deadline,
which counts from the call's start. Then the provider is asked under a
:class:`~agentloop.providers.watchdog.CallWatch`: past the deadline, or at a cancel notice,
the process's watchdog aborts the call (its response's socket is shut, an awaited call is
cancelled), and the abort comes out as :class:`~agentloop.exceptions.ProviderTimeout` (a
transient error: the step's retries apply) or as the run's
:class:`~agentloop.exceptions.CancelledError`. A call made while input guardrails judge
(``Send.judging``) is abandoned the same way once their verdict won't let it stand: it ends
in :class:`CallAbandoned`, before it is sent if the verdict came first.

Running one tool call: its arguments validated, the tool run (sync, or an ``async def``
awaited), and whatever it returned, raised or asked for (a handoff too) turned into a
``ToolOutcome``.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Generator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from queue import SimpleQueue
from typing import Any, NoReturn, TypeVar

from asgiref.sync import async_to_sync, sync_to_async
from pydantic import ValidationError

from ..conf import agentloop_settings
from ..exceptions import (
    CancelledError,
    ConfigurationError,
    ProviderError,
    ProviderTimeout,
    StreamInterruptedError,
    ToolError,
    ToolWaiting,
)
from ..messages import Chunk, ModelResponse, ToolCall
from ..providers.call_slots import Slots, Ticket, slots_for
from ..providers.watchdog import CallWatch, watching
from ..streaming import EventTap
from ..tools import (
    Tool,
    ToolContext,
    ToolOutcome,
    arguments_problem,
    describe_validation_error,
    format_result,
    running,
)
from . import tracing
from ._effects import (
    AwaitJudging,
    Effects,
    Judge,
    Launch,
    Pause,
    RunTool,
    Send,
    Sleep,
    StartJudging,
    WaitAny,
)
from ._judging import SLICE, AsyncWatch, Judging, Watch, ajudge, judge
from ._runs import Checkpoints
from .store import ChatStore

__all__ = [
    "CallAbandoned",
    "aexecute_tool",
    "asend",
    "call_timeout",
    "drive",
    "drive_async",
    "drive_pulled",
    "execute_tool",
    "send",
    "unaskable",
]


#: longest wait for a slot between two looks at the cancel and the deadline (seconds).
SLOT_SLICE = 0.1


Phase = Callable[..., Awaitable[Any]]


Held = list[tuple[Slots, Ticket]]


class CallAbandoned(Exception):  # noqa: N818 - an outcome, never seen outside the verb
    """The model call was stopped (or never sent): the input guardrails judging meanwhile
    did not pass the message, so its answer would not be used."""


def call_timeout(provider_name: str) -> float | None:
    """The deadline of one call to ``provider_name`` in seconds: its ``call_timeout`` in
    ``AGENTLOOP["PROVIDERS"]``, else ``MODEL_CALL_TIMEOUT`` (None: no deadline)."""
    configured = agentloop_settings.PROVIDERS.get(provider_name) or {}
    if "call_timeout" not in configured:
        timeout = agentloop_settings.MODEL_CALL_TIMEOUT
        return None if timeout is None else float(timeout)
    value = configured["call_timeout"]
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigurationError(
            f"AGENTLOOP['PROVIDERS'][{provider_name!r}]['call_timeout'] must be a positive "
            f"number of seconds or None, not {value!r}"
        )
    return float(value)


class _Call:
    """One Send's bounds: its limits, its deadline, its watch."""

    def __init__(self, effect: Send) -> None:
        self.effect = effect
        self.name = effect.provider_name or effect.provider.name
        self.timeout = call_timeout(self.name)
        self.deadline = None if self.timeout is None else time.monotonic() + self.timeout
        checkpoints = effect.checkpoints
        notice = checkpoints.store.cancel_notice if checkpoints is not None else None
        self.abandon = effect.judging.stopped if effect.judging is not None else None
        self.watch = CallWatch(self.deadline, notice, self.abandon)
        self.slots = slots_for(self.name, effect.request.model)

    def slice(self) -> float:
        if self.deadline is None:
            return SLOT_SLICE
        return max(0.0, min(SLOT_SLICE, self.deadline - time.monotonic()))

    def expired(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def check_abandoned(self) -> None:
        if self.abandon is not None and self.abandon.is_set():
            raise CallAbandoned("input guardrails did not pass the message")

    def too_late(self) -> bool:
        """A slot came free less than a slice before the deadline: the call would be cut
        before it could answer, so it isn't sent (another caller may use the slot)."""
        return self.deadline is not None and self.deadline - time.monotonic() < SLOT_SLICE

    def timed_out(self, waiting: bool = False) -> ProviderTimeout:
        if waiting:
            return ProviderTimeout(
                f"{self.name}: no model-call slot came free (MODEL_CONCURRENCY) within the "
                f"call's {self.timeout:g} s deadline (MODEL_CALL_TIMEOUT)"
            )
        return ProviderTimeout(
            f"{self.name}: the model call took longer than its {self.timeout:g} s deadline "
            "(MODEL_CALL_TIMEOUT) and was stopped"
        )

    def on_chunk(self) -> Callable[[Chunk], None] | None:
        """The stream's chunk callback, which also ends a call past its deadline (for
        providers whose responses the watchdog can't shut)."""
        state = self.effect.state
        if state is None:
            return None

        def each(chunk: Chunk) -> None:
            if self.expired():
                raise self.timed_out()
            self.check_abandoned()  # a provider whose response the watchdog can't shut
            state.on_chunk(chunk)

        return each

    def error_for(self, error: BaseException) -> BaseException:
        """What a failed call raises: the deadline's ProviderTimeout when it was that, else
        ``error`` (a cancel's abort is read from the flag by the caller first)."""
        if self.watch.reason == "deadline" or (
            # Past the deadline, whatever the transport said (a connect cut at the deadline
            # fails as a connect error, not as a timeout).
            isinstance(error, ProviderError) and self.expired()
        ):
            replaced: BaseException = self.timed_out()
        elif isinstance(error, asyncio.CancelledError):  # a cancel notice, with no cancel
            replaced = StreamInterruptedError(f"{self.name}: the call was stopped")
        else:
            return error
        replaced.__cause__ = error
        return replaced

    def failed(self, error: Exception) -> NoReturn:
        """Raise what a sync call that raised ``error`` raises: the run's CancelledError
        after a cancel's abort, ``CallAbandoned`` after a guardrail's, else ``error_for``."""
        checkpoints = self.effect.checkpoints
        if self.watch.reason == "cancel" and checkpoints is not None:
            checkpoints.check()  # raises the run's CancelledError
        if self.watch.reason == "guardrail":
            raise CallAbandoned("input guardrails did not pass the message") from error
        raise self.error_for(error)

    def take_slots(self, held: Held) -> None:
        """Wait in this thread for a slot of each limit the call falls under (``held``
        gets each ticket), looking at the run's cancel and the deadline meanwhile."""
        checkpoints = self.effect.checkpoints
        for slots in self.slots:
            woken = threading.Event()
            held.append((slots, ticket := slots.request(woken.set)))
            while not ticket.granted:
                if checkpoints is not None:
                    checkpoints.check(force=False)
                if self.expired():
                    raise self.timed_out(waiting=True)
                woken.wait(self.slice())
                if ticket.granted and self.too_late():
                    raise self.timed_out(waiting=True)

    def give_back(self, held: Held) -> None:
        for slots, ticket in reversed(held):
            slots.give_back(ticket)


def send(effect: Send) -> ModelResponse:
    """Make the call in this thread (or greenlet), within its bounds."""
    call = _Call(effect)
    held: Held = []
    try:
        call.take_slots(held)
        call.check_abandoned()
        with watching(call.watch):
            try:
                response = effect.provider.request(effect.request, on_chunk=call.on_chunk())
                if effect.state is not None:
                    effect.state.finish()  # a structured answer's last partial
                return response
            except CallAbandoned:
                raise
            except Exception as exc:
                call.failed(exc)
    finally:
        call.give_back(held)


async def asend(effect: Send, phase: Phase) -> ModelResponse:
    """Make the call from a coroutine, within its bounds; the cancel's flag is read as a
    database phase (``phase``)."""
    call = _Call(effect)
    checkpoints = effect.checkpoints
    loop = asyncio.get_running_loop()
    held: Held = []
    try:
        for slots in call.slots:
            woken: asyncio.Future[None] = loop.create_future()
            held.append((slots, ticket := slots.request(partial(_wake, loop, woken))))
            while not ticket.granted:
                if checkpoints is not None and checkpoints.due():
                    await phase(partial(checkpoints.check, force=False))
                if call.expired():
                    raise call.timed_out(waiting=True)
                await asyncio.wait([woken], timeout=call.slice())
                if ticket.granted and call.too_late():
                    raise call.timed_out(waiting=True)
        call.check_abandoned()
        return await _arequest(call, phase)
    finally:
        call.give_back(held)


async def _arequest(call: _Call, phase: Phase) -> ModelResponse:
    task = asyncio.current_task()
    assert task is not None  # noqa: S101 - asend runs in a task
    loop = asyncio.get_running_loop()
    active = True
    aborted = False

    def cancel_here() -> None:
        nonlocal aborted
        if active:
            aborted = True
            task.cancel()

    call.watch.on_abort(partial(loop.call_soon_threadsafe, cancel_here))
    effect, state = call.effect, call.effect.state

    async def on_chunk(chunk: Chunk) -> None:
        if call.expired():
            raise call.timed_out()
        call.check_abandoned()
        assert state is not None  # noqa: S101 - only streams have chunks
        await state.aon_chunk(chunk, phase)

    error: BaseException
    try:
        with watching(call.watch):
            try:
                if state is None:
                    return await effect.provider.arequest(effect.request)
                response = await effect.provider.arequest(effect.request, on_chunk=on_chunk)
                await state.afinish()  # a structured answer's last partial
                return response
            except asyncio.CancelledError as exc:
                if not aborted or task.uncancel() > 0:
                    raise  # cancelled from outside too: not ours to turn into an error
                error = exc
            except CallAbandoned:
                raise
            except Exception as exc:
                error = exc
    finally:
        active = False
    if call.watch.reason == "cancel" and effect.checkpoints is not None:
        await phase(effect.checkpoints.check)  # raises the run's CancelledError
    if call.watch.reason == "guardrail":
        raise CallAbandoned("input guardrails did not pass the message") from error
    raise call.error_for(error)


def _wake(loop: asyncio.AbstractEventLoop, woken: asyncio.Future[None]) -> None:
    """Hand a slot to a coroutine waiting on another thread's loop."""
    try:
        loop.call_soon_threadsafe(_resolve, woken)
    except RuntimeError:  # its loop is closed: the waiter is gone (its ticket goes back)
        pass


def _resolve(woken: asyncio.Future[None]) -> None:
    if not woken.done():
        woken.set_result(None)


def _instance(
    tool_class: type[Tool],
    call: ToolCall,
    chat: Any,
    background: bool,
    cancel_check: Callable[[], bool] | None,
) -> tuple[Tool, dict[str, Any]] | ToolOutcome:
    """The tool ready to run with its validated arguments, or the outcome of bad ones."""
    try:
        arguments = tool_class.parse_arguments(call.arguments)
    except ValidationError as exc:
        message = describe_validation_error(call.name, exc)
        return ToolOutcome(message, is_error=True, error=message)
    instance = tool_class()
    instance.context = ToolContext(call, chat, background=background, cancel_check=cancel_check)
    return instance, arguments


async def _awaited(value: Any) -> Any:
    return await value


def _value_of(value: Any) -> Any:
    """A sync verb runs an ``async def`` tool to completion (on an event loop of its own)."""
    return async_to_sync(_awaited)(value) if inspect.isawaitable(value) else value


def execute_tool(
    tool_class: type[Tool],
    call: ToolCall,
    chat: Any = None,
    background: bool = False,
    cancel_check: Callable[[], bool] | None = None,
    savepoint: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> ToolOutcome:
    """Validate the arguments and run the tool; every failure becomes an error outcome.
    ``savepoint`` wraps the run (a transactional tool's: a failed run's writes roll back)."""
    ready = _instance(tool_class, call, chat, background, cancel_check)
    if isinstance(ready, ToolOutcome):
        return ready
    instance, arguments = ready

    def run() -> str:
        with savepoint(), tracing.tool_call(call, tool_class) as span, running(instance.context):
            return span.result(format_result(_value_of(instance.execute(**arguments))))

    return _with_handoff(_outcome(call, run), instance)


async def aexecute_tool(tool: RunTool) -> ToolOutcome:
    """``execute_tool`` for an ``async def`` tool, awaited on the running event loop."""
    tool_class, call = tool.tool_class, tool.call
    ready = _instance(tool_class, call, tool.chat, tool.background, tool.cancel_check)
    if isinstance(ready, ToolOutcome):
        return ready
    instance, arguments = ready
    try:
        with tracing.tool_call(call, tool_class) as span, running(instance.context):
            content = span.result(format_result(await instance.execute(**arguments)))
    except Exception as exc:
        failure = exc

        def reraise() -> Any:
            raise failure

        return _with_handoff(_outcome(call, reraise), instance)
    return _with_handoff(_outcome(call, lambda: content), instance)


def _with_handoff(outcome: ToolOutcome, instance: Tool) -> ToolOutcome:
    """The outcome, carrying the handoff the tool asked for when it gave a result (a call
    that failed or now waits hands nothing off)."""
    handoff = instance.context.handoff
    if handoff is not None and not outcome.is_error and outcome.wait_reason is None:
        outcome.handoff = handoff
    return outcome


def _outcome(call: ToolCall, run: Callable[[], str]) -> ToolOutcome:
    """What the tool's run gave (``run()``'s result text or what it raised), as an outcome."""
    try:
        return ToolOutcome(run())
    except ToolWaiting as exc:
        return ToolOutcome(wait_reason=exc.reason, question=exc.question, after_wait=exc.then)
    except ToolError as exc:
        return ToolOutcome(str(exc) or type(exc).__name__, is_error=True, error=repr(exc))
    except Exception as exc:
        # A bug in a tool must not crash the loop: the model hears about it,
        # and the traceback is kept on the tool call for whoever debugs it.
        return ToolOutcome(
            f"Tool {call.name!r} failed: {type(exc).__name__}: {exc}",
            is_error=True,
            error=traceback.format_exc(),
        )


def unaskable(tool_class: type[Tool], call: ToolCall) -> ToolOutcome | None:
    """A call about to wait for a person (or a system) must be one that could run as it is:
    arguments its tool refuses, or keys it takes no parameter for, are an error result for
    the model now (one line), never a question. None when the call may wait."""
    problem = arguments_problem(tool_class, call.arguments)
    return None if problem is None else ToolOutcome(problem, is_error=True, error=problem)


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
        if isinstance(effect, Pause):  # only an iterated sync run stops there
            value, error = None, None
            continue
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


#: effects that wait for nothing (a start, a pause): no connection is given back before them.
_WAITS_FOR_NOTHING = (Launch, StartJudging, Pause)


class _Performer:
    """What the sync drivers do with an effect: the I/O in place, concurrent tools on a pool."""

    def __init__(self) -> None:
        self.pool: ThreadPoolExecutor | None = None
        self.pool_size = 0

    def perform(self, effect: Any) -> Any:
        if isinstance(effect, Pause):
            return None
        if isinstance(effect, Send):
            return send(effect)  # bounded: a slot, a deadline, a cancel watchdog
        if isinstance(effect, Sleep):
            time.sleep(effect.seconds)
            return None
        if isinstance(effect, RunTool):
            return _sync_call(effect)()
        if isinstance(effect, Launch):
            if self.pool is None or self.pool_size != effect.size:
                # A round's tools all finished before the next round launches any.
                self.close()
                self.pool = ThreadPoolExecutor(effect.size, thread_name_prefix="agentloop-tool")
                self.pool_size = effect.size
            # carry: the tool thread's spans join this verb's trace.
            return self.pool.submit(tracing.carry(effect.tool.wrap(_sync_call(effect.tool))))
        if isinstance(effect, WaitAny):
            done, _ = wait(effect.handles, return_when=FIRST_COMPLETED)
            return [(future, future.result()) for future in done]
        if isinstance(effect, Judge):
            return judge(effect.panels, effect.wrap, _watch(effect.checkpoints))
        if isinstance(effect, StartJudging):
            return _start_judging(effect)
        if isinstance(effect, AwaitJudging):
            return _await_judging(effect)
        raise TypeError(f"unknown effect {effect!r}")  # pragma: no cover - a bug

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None


def drive(effects: Effects[T], store: ChatStore | None = None) -> T:
    """Run a verb's effects in this thread: the I/O in place, concurrent tools on a pool;
    ``store.before_wait()`` ahead of each wait."""
    before_wait = store.before_wait if store is not None else _no_wait
    performer = _Performer()
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
                if not isinstance(effect, _WAITS_FOR_NOTHING):
                    before_wait()
                value = performer.perform(effect)
            except BaseException as exc:
                error = exc
    finally:
        effects.close()
        performer.close()


#: what a streamed call's helper thread hands over once the provider's request returned.
_END = object()


class _PulledCall:
    """A streamed :class:`Send` whose chunks the driver pulls one at a time
    (:func:`drive_pulled`). Only the provider's request runs on a helper thread, which hands
    each chunk over and waits for the go-ahead (a queue of one: it never reads ahead); the
    chunk is handled in the driver's thread (the deadline, the cancel checkpoint, the partial
    save: the verb's database work stays on the verb's thread). What handling a chunk raises
    is raised inside the provider at that chunk, which closes its stream, as in ``send``."""

    def __init__(self, effect: Send) -> None:
        self.effect = effect
        self.call = _Call(effect)
        self.held: Held = []
        try:
            self.call.take_slots(self.held)
            self.call.check_abandoned()
        except BaseException:
            self.call.give_back(self.held)
            raise
        self.each = self.call.on_chunk()
        self.handed: SimpleQueue[Any] = SimpleQueue()
        self.replies: SimpleQueue[BaseException | None] = SimpleQueue()
        #: the helper waits for the go-ahead on the chunk handled last.
        self.owed = False
        self.response: ModelResponse | None = None
        self.failure: BaseException | None = None
        # The copied context: the call's watch and the verb's trace hold on the helper too.
        context = contextvars.copy_context()
        self.thread = threading.Thread(
            target=context.run, args=(self._request,), name="agentloop-stream", daemon=True
        )
        self.thread.start()

    def _request(self) -> None:
        try:
            with watching(self.call.watch):
                self.response = self.effect.provider.request(
                    self.effect.request, on_chunk=self._hand_over
                )
        except BaseException as exc:
            self.failure = exc
        finally:
            self.handed.put(_END)

    def _hand_over(self, chunk: Chunk) -> None:
        self.handed.put(chunk)
        reply = self.replies.get()
        if reply is not None:
            raise reply

    def advance(self) -> bool:
        """Handle the next chunk (its events go to the run's tap); True once the call ended."""
        if self.owed:
            self.owed = False
            self.replies.put(None)
        item = self.handed.get()
        if item is _END:
            self.thread.join()
            return True
        assert self.each is not None  # noqa: S101 - only streams are pulled
        try:
            self.each(item)
        except BaseException as exc:
            self.replies.put(exc)
        else:
            self.owed = True
        return False

    def outcome(self) -> tuple[ModelResponse | None, BaseException | None]:
        """The call's answer, or what it raises (as ``send`` would raise it)."""
        try:
            if self.failure is None:
                return self.response, None
            if isinstance(self.failure, CallAbandoned) or not isinstance(self.failure, Exception):
                return None, self.failure
            try:
                self.call.failed(self.failure)
            except BaseException as exc:
                return None, exc
        finally:
            self.call.give_back(self.held)

    def abandon(self) -> None:
        """The driver left mid-call: the provider is stopped at its next chunk (not waited
        for: it may be reading the network); the slots go back."""
        if self.thread.is_alive():
            self.replies.put(CancelledError("The stream was left mid-call."))
            self.call.give_back(self.held)
            self.held = []


def drive_pulled(
    effects: Effects[T], store: ChatStore, tap: EventTap
) -> Generator[Any, None, T | None]:
    """``drive()`` as a generator of the run's events (``chat.stream()``), in this thread:
    between two of them the run waits for whoever iterates.

    The events are what ``tap`` collected (streamed chunks, callbacks); they go out after
    each move of the verb (so a call the model asked for is seen before it runs) and after
    each streamed chunk. An error of the verb is raised after the events before it. Closed
    before the verb ended (``GeneratorExit`` at a ``yield``), the run is cancelled as
    ``cancel()`` would cancel it, driven on (nothing handed out) until a checkpoint stops
    it, and the generator ends quietly; an error other than that cancel is raised."""
    performer = _Performer()
    pulled: _PulledCall | None = None
    value: Any = None
    error: BaseException | None = None
    try:
        while True:
            ended, failure, call_ended = False, None, False
            if pulled is None:
                try:
                    ended, effect = _resume(effects, value, error)
                except BaseException as exc:
                    failure = exc
            else:
                call_ended = pulled.advance()
            if not tap.closed:
                try:
                    # A list's iterator has no close(): a close() of this generator raises
                    # GeneratorExit right here.
                    yield from tap.take()
                except GeneratorExit:
                    tap.close()
                    if not ended and failure is None:
                        store.stopping.request_cancel()  # the checkpoints stop the run
            if failure is not None:
                if tap.closed and isinstance(failure, CancelledError):
                    return None  # the stream was closed: no result
                raise failure
            if ended:
                result: T = effect
                return result
            if pulled is not None:
                if call_ended:
                    value, error = pulled.outcome()
                    pulled = None
                continue
            value, error = None, None
            try:
                checkpoints = getattr(effect, "checkpoints", None)
                if tap.closed and isinstance(effect, Pause | Send) and checkpoints is not None:
                    # Left before the round's calls start or the model is asked: the cancel
                    # stops the run here (as the checkpoint after would), nothing started.
                    checkpoints.check()
                if not isinstance(effect, _WAITS_FOR_NOTHING):
                    store.before_wait()
                if isinstance(effect, Send) and effect.state is not None:
                    pulled = _PulledCall(effect)
                elif tap.closed and isinstance(effect, Sleep):
                    pass  # no backoff before a retry the cancel stops anyway
                else:
                    value = performer.perform(effect)
            except BaseException as exc:
                error = exc
    finally:
        if pulled is not None:
            pulled.abandon()
        effects.close()
        performer.close()


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
    if isinstance(effect, Pause):
        return None
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

"""Performing a :class:`~.effects.Send`: a slot of its provider's limit, a total deadline, and
a cancel that stops it whether it waits for a slot or for the provider.

Both drivers (:mod:`.drivers`) send through here. A call first takes a slot of each limit it
falls under (:mod:`agentloop.providers.call_slots`), waiting in short slices: each slice looks at
the run's cancel (the notice at once, the flag as often as a stream would) and at the
deadline, which counts from the call's start. Then the provider is asked under a
:class:`~agentloop.providers.watchdog.CallWatch`: past the deadline, or at a cancel notice,
the process's watchdog aborts the call (its response's socket is shut, an awaited call is
cancelled), and the abort comes out as :class:`~agentloop.exceptions.ProviderTimeout` (a
transient error: the step's retries apply) or as the run's
:class:`~agentloop.exceptions.CancelledError`. A call made while input guardrails judge
(``Send.judging``) is abandoned the same way once their verdict won't let it stand: it ends
in :class:`CallAbandoned`, before it is sent if the verdict came first.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from ..conf import agentloop_settings
from ..exceptions import (
    ConfigurationError,
    ProviderError,
    ProviderTimeout,
    StreamInterruptedError,
)
from ..messages import Chunk, ModelResponse
from ..providers.call_slots import Slots, Ticket, slots_for
from ..providers.watchdog import CallWatch, watching
from .effects import Send

__all__ = ["CallAbandoned", "asend", "call_timeout", "send"]

#: longest wait for a slot between two looks at the cancel and the deadline (seconds).
SLICE = 0.1

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
            return SLICE
        return max(0.0, min(SLICE, self.deadline - time.monotonic()))

    def expired(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def check_abandoned(self) -> None:
        if self.abandon is not None and self.abandon.is_set():
            raise CallAbandoned("input guardrails did not pass the message")

    def too_late(self) -> bool:
        """A slot came free less than a slice before the deadline: the call would be cut
        before it could answer, so it isn't sent (another caller may use the slot)."""
        return self.deadline is not None and self.deadline - time.monotonic() < SLICE

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

    def give_back(self, held: Held) -> None:
        for slots, ticket in reversed(held):
            slots.give_back(ticket)


def send(effect: Send) -> ModelResponse:
    """Make the call in this thread (or greenlet), within its bounds."""
    call = _Call(effect)
    held: Held = []
    try:
        for slots in call.slots:
            woken = threading.Event()
            held.append((slots, ticket := slots.request(woken.set)))
            while not ticket.granted:
                if effect.checkpoints is not None:
                    effect.checkpoints.check(force=False)
                if call.expired():
                    raise call.timed_out(waiting=True)
                woken.wait(call.slice())
                if ticket.granted and call.too_late():
                    raise call.timed_out(waiting=True)
        call.check_abandoned()
        with watching(call.watch):
            try:
                return effect.provider.request(effect.request, on_chunk=call.on_chunk())
            except CallAbandoned:
                raise
            except Exception as exc:
                if call.watch.reason == "cancel" and effect.checkpoints is not None:
                    effect.checkpoints.check()  # raises the run's CancelledError
                if call.watch.reason == "guardrail":
                    raise CallAbandoned("input guardrails did not pass the message") from exc
                raise call.error_for(exc)  # noqa: B904 - error_for keeps the cause
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
                return await effect.provider.arequest(effect.request, on_chunk=on_chunk)
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

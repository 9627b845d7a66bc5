"""One model call: admitted, the request built, the provider asked (with retries), and the
answer saved with its usage. ``Conversation.generate()`` and batches use it.

Admission, before each attempt (none when no rate limit and no budget counts the chat): the
call is estimated (:mod:`.rate_limiting`), then takes from the rate-limit buckets of its
provider and model, waiting in place in short slices, each looking at the run's cancel; a
background step that would wait longer than ``RATE_LIMIT_WAIT`` ends instead
(``RateLimitWaiting``: its job is sent again when the limit has room). Last, the store reserves
the estimate against the budgets of the chat's subjects (``store.budgets.reserve``); a budget
with no room stops the turn (``BudgetExceededError``, the chat ``stopped`` with the reason),
except a background step's chat finding every place of a chats-in-flight quota taken: it waits
in line (``PlaceWaiting``: the chat stays queued, and its job is sent when a place frees). The
usage row of the attempt settles the reservation to the exact cost.

The compaction call: deciding that a request is too big for the context window, asking a
model for the summary (:mod:`.compaction` says what it covers), and saving it with its usage
row.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from .. import providers
from ..conf import agentloop_settings
from ..exceptions import (
    BudgetExceededError,
    CancelledError,
    ContextLengthError,
    LimitReachedError,
    PlaceWaiting,
    ProviderError,
    ProviderTimeout,
    RateLimitWaiting,
)
from ..import_paths import load_by_path
from ..messages import (
    Message,
    MessageStatus,
    ModelRequest,
    ModelResponse,
    ToolCallState,
)
from ..providers.base import Provider
from ..providers.catalog import lookup
from . import compaction, tracing
from ._chat_config import ChatConfig
from ._drivers import CallAbandoned, call_timeout, drive, send
from ._effects import (
    AwaitJudging,
    Effects,
    Judge,
    OutputParser,
    Send,
    Sleep,
    StartJudging,
    StreamCallback,
    StreamState,
    retry_delay,
)
from ._judging import ABANDONED, UNJUDGED, Guards, Judged, Judging, Verdict, unkept_usage
from ._runs import Callbacks, Checkpoints
from ._transcript_reading import counted_tool_results, next_move, turn_start
from .compaction import window
from .rate_limiting import CallEstimate, RateLimiter, buckets_for, estimate_call
from .store import ChatStore, Recalled, UsageRecord

if TYPE_CHECKING:
    from ._runs import Run

__all__ = ["Admission", "ModelCalls", "PreparedCall", "Summaries", "failed_usage"]


#: longest sleep between two looks at the cancel while waiting for a rate limit (seconds).
SLICE = 0.25


#: a wait at least this long is written on the chat (``waiting_for``) while it lasts.
SHOWN_AFTER = 1.0


class Admission:
    """Lets one chat's model calls go: paced by the rate limits, within the budgets."""

    def __init__(self, store: ChatStore, emit: Callable[..., None]) -> None:
        self.store = store
        self._emit = emit

    def admit(
        self,
        provider: Provider,
        provider_name: str,
        request: ModelRequest,
        checkpoints: Checkpoints | None,
    ) -> Effects[Any]:
        """Wait for the rate limits, then reserve the budget; the reservation (for the
        attempt's usage row), or None when no budget counts the chat."""
        budgets = self.store.budgets
        limiter = self.store.rate_limiter()
        if budgets is None and limiter is None:
            return None  # nothing counts the call: no estimate to make (it reads the request)
        estimate = estimate_call(provider, provider_name, request)
        yield from self._pace(limiter, estimate, checkpoints)
        try:
            # A background step's chat queues for a chats-in-flight place; a verb in-process
            # can't wait in line (its caller waits for it): it stops.
            return budgets.reserve(estimate, wait=self.store.runs.background) if budgets else None
        except BudgetExceededError as exc:
            if exc.limit == "chats_in_flight" and self.store.runs.background:
                raise PlaceWaiting(exc.reason) from exc  # not a stop: it queued for a place
            self.store.stopping.record_stop(exc.reason)
            self._emit("budget_exceeded", exc)
            self._emit("stopped", exc.reason)
            raise

    def _pace(
        self, limiter: RateLimiter | None, estimate: CallEstimate, checkpoints: Checkpoints | None
    ) -> Effects[None]:
        buckets = buckets_for(estimate.provider, estimate.model, estimate.tokens)
        if limiter is None or not buckets:
            return
        timeout = call_timeout(estimate.provider)
        started = time.monotonic()
        shown = False
        while (short := limiter.take(buckets)) is not None:
            reason = f"rate limit: {short.bucket.label}"
            waited = time.monotonic() - started
            in_place = agentloop_settings.RATE_LIMIT_WAIT
            if self.store.runs.background and waited + short.seconds > in_place:
                # Not in a worker's slot: the job comes back when the bucket has room (a
                # little later for some, so the chats that waited don't all come at once).
                spread = random.uniform(0, min(1.0, short.seconds / 10))  # noqa: S311
                raise RateLimitWaiting(short.seconds + spread, reason)
            if timeout is not None and waited + short.seconds > timeout:
                raise ProviderTimeout(
                    f"{estimate.provider}: waited for the {reason} longer than the call's "
                    f"{timeout:g} s deadline (MODEL_CALL_TIMEOUT)"
                )
            if not shown and short.seconds >= SHOWN_AFTER:
                self.store.runs.note_waiting(reason)
                shown = True
            until = time.monotonic() + short.seconds
            while (left := until - time.monotonic()) > 0:
                yield Sleep(min(left, SLICE))
                if checkpoints is not None:
                    checkpoints.check(force=False)  # a cancel stops a waiting call
        if shown:
            self.store.runs.note_waiting("")  # a failure's release clears it too


def failed_usage(
    provider_name: str, model_id: str, error: BaseException, started: float
) -> UsageRecord:
    """The usage row of an attempt that failed with ``error`` (``started``: its monotonic start)."""
    return UsageRecord(
        provider=provider_name,
        model=model_id,
        status="failed",
        error=f"{type(error).__name__}: {error}",
        duration_ms=int((time.monotonic() - started) * 1000),
    )


class Summaries:
    """Compaction before a model call, and after a provider's context-length error."""

    def __init__(
        self, store: ChatStore, emit: Callable[..., None], admission: Admission | None = None
    ) -> None:
        self.store = store
        self._emit = emit
        #: paces the summary calls and holds them to the chat's budgets, as the others.
        self.admission = admission or Admission(store, emit)

    def _context_window(self, config: ChatConfig, model_id: str) -> int | None:
        if config.context_window is not None:
            return config.context_window
        info = lookup(model_id)
        return info.context_window if info is not None else None

    def compaction_due(self, transcript: list[Message], config: ChatConfig, model_id: str) -> bool:
        """The request's estimated input passes ``at`` x the context window."""
        if config.compaction is None:
            return False
        size = self._context_window(config, model_id)
        if size is None:
            return False
        messages = compaction.window(transcript)
        reported = self.store.transcript.last_input_tokens()
        if reported is not None and not compaction.reported_since_summary(transcript, reported[0]):
            reported = None  # that request still held the rows a later summary replaced
        estimate = compaction.estimate_tokens(messages, reported)
        return estimate > config.compaction.at * size

    def compact(self, transcript: list[Message], config: ChatConfig) -> Message | None:
        """Summarise what the next request would send but the recent rows: the summary row and
        its usage row are saved and added to ``transcript``. None when there is nothing to
        summarise (or compaction is off)."""
        if config.compaction is None:
            return None
        todo = compaction.plan(transcript, config.compaction.keep_recent)
        if todo is None:
            return None
        model = config.compaction.model or config.model or agentloop_settings.DEFAULT_MODEL
        provider_hint = None if config.compaction.model else config.provider
        provider, model_id = providers.resolve(model, provider_hint)
        provider_name = providers.split_model(model, provider_hint)[0]
        request = ModelRequest(
            model=model_id,
            messages=[
                Message(role="system", content=compaction.SUMMARY_INSTRUCTIONS),
                Message(role="user", content=compaction.render(todo)),
            ],
            headers=config.headers,
        )
        started = time.monotonic()
        response, reservation = self._summary_response(provider, provider_name, request)
        summary = Message(
            role="summary",
            content=response.content,
            model=response.model or model_id,
            provider_data={compaction.THROUGH: todo.through},
        )
        usage = UsageRecord(
            provider=provider_name,
            model=model_id,
            status="succeeded",
            usage=response.usage,
            cost=provider.cost(model_id, response.usage),
            duration_ms=int((time.monotonic() - started) * 1000),
            reservation=reservation,
        )
        record = self.store.transcript.save_answer(summary, usage)
        transcript.append(summary)
        self._emit("after_message", record)
        return summary

    def _summary_response(
        self, provider: Provider, provider_name: str, request: ModelRequest
    ) -> tuple[ModelResponse, Any]:
        """The summary call, retried like any model call, each attempt admitted first; a
        usage row for each failure. The response and its budget reservation."""
        retries = int(agentloop_settings.MODEL_RETRIES)
        for attempt in range(retries + 1):
            reservation = drive(self.admission.admit(provider, provider_name, request, None))
            started = time.monotonic()
            try:
                # Bounded like the chat's own calls: a slot, the deadline.
                sent = send(Send(provider, request, None, provider_name=provider_name))
                return sent, reservation
            except Exception as exc:
                failed = failed_usage(provider_name, request.model, exc, started)
                failed.reservation = reservation
                self.store.transcript.record_usage(failed)
                delay = retry_delay(attempt, exc) if attempt < retries else None
                if delay is None:
                    raise
                time.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover


def _now() -> datetime:
    return datetime.now(UTC)


def _with_instructions(messages: list[Message], text: str) -> list[Message]:
    """``messages`` with ``text`` after the instructions (the first system message), or as
    the instructions when there are none: every provider sends it as its system prompt."""
    if messages and messages[0].role == "system":
        first = messages[0]
        joined = f"{first.content}\n\n{text}" if first.content else text
        return [first.model_copy(update={"content": joined}), *messages[1:]]
    return [Message(role="system", content=text), *messages]


@dataclass
class PreparedCall:
    """A model call ready to send: ``generate()`` sends it at once, a batch later."""

    provider: Provider
    provider_name: str
    model_id: str
    request: ModelRequest
    transcript: list[Message]
    #: the memories the request was given (``with_memory``): kept on the answer.
    recalled: Recalled | None = None


def falls_back(error: BaseException) -> bool:
    """A failure the next model may not have: transient errors left after the step's retries,
    and context length; auth and bad requests would fail the same way on any model."""
    return isinstance(error, ProviderError) and (
        error.retryable or isinstance(error, ContextLengthError)
    )


class ModelCalls:
    """Preparing, sending and accepting one chat's model calls.

    ``record_cancel`` records a cancel seen mid-call (the run's); ``schema_model`` gives the
    pydantic model of a ``with_schema`` chat in this process, if any; ``owner`` is what
    guardrails see as ``context.chat``."""

    def __init__(
        self,
        store: ChatStore,
        callbacks: Callbacks,
        *,
        record_cancel: Callable[..., None],
        schema_model: Callable[[], type[BaseModel] | None],
        owner: Any = None,
    ) -> None:
        self.store = store
        self.owner = owner
        self._emit = callbacks.emit
        self._record_cancel = record_cancel
        self._schema_model = schema_model
        self.admission = Admission(store, callbacks.emit)
        self.summaries = Summaries(store, callbacks.emit, self.admission)

    def _check_limits(self, transcript: list[Message], config: ChatConfig) -> None:
        limits = config.limits
        if not limits.is_set():
            return
        start = turn_start(transcript)
        turn = [m for m in transcript[start:] if m.is_finished]
        reason = None
        model_calls = sum(1 for m in turn if m.role == "assistant")
        tool_calls = counted_tool_results(transcript)
        if limits.max_model_calls is not None and model_calls >= limits.max_model_calls:
            reason = f"max_model_calls reached ({model_calls} of {limits.max_model_calls})"
        elif limits.max_tool_calls is not None and tool_calls >= limits.max_tool_calls:
            reason = f"max_tool_calls reached ({tool_calls} of {limits.max_tool_calls})"
        elif limits.max_seconds is not None or limits.max_cost is not None:
            began = self.store.transcript.turn_started_at(transcript[start]) if transcript else None
            if began is not None and limits.max_seconds is not None:
                elapsed = (_now() - began).total_seconds()
                if elapsed >= limits.max_seconds:
                    reason = f"max_seconds reached ({elapsed:.1f}s of {limits.max_seconds}s)"
            costs = self.store.costs  # a max_cost limit is refused where it is None
            if reason is None and began is not None and limits.max_cost is not None and costs:
                cost = costs.turn_cost(began)
                if cost >= limits.max_cost:
                    reason = f"max_cost reached ({cost} of {limits.max_cost})"
        if reason is not None:
            self.store.stopping.record_stop(reason)
            self._emit("stopped", reason)
            raise LimitReachedError(reason)

    def _recall(self, transcript: list[Message], config: ChatConfig) -> Recalled | None:
        """The memories a call of a ``with_memory`` chat is given (None: memory is off)."""
        if config.memory is None or self.store.memory is None:
            return None
        return self.store.memory.recall(transcript, config.memory)

    def _request(
        self,
        transcript: list[Message],
        config: ChatConfig,
        model_id: str,
        stream: bool,
        recalled: Recalled | None = None,
    ) -> ModelRequest:
        options = config.tool_options
        tools = [tool.definition() for tool in self.store.config.get_tools()]
        messages = window(transcript)  # after a compaction: instructions, summary, recent rows
        if recalled is not None and recalled.text:
            messages = _with_instructions(messages, recalled.text)
        choice = options.choice
        if choice not in (None, "auto", "none") and messages and messages[-1].role == "tool":
            # A forced choice ("required", a tool name) applies to the turn's first call;
            # kept after the results, the model could never answer in words.
            choice = "auto"
        return ModelRequest(
            model=model_id,
            messages=messages,
            tools=tools,
            tool_choice=choice if tools else None,
            parallel_tool_calls=(False if options.calls == "one" else None) if tools else None,
            temperature=config.temperature,
            max_output_tokens=config.max_output_tokens,
            output_schema=config.output_schema,
            provider_options=config.provider_options,
            headers=config.headers,
            stream=stream,
            caching=config.caching,
            thinking=config.thinking,
        )

    def prepare_model_call(
        self,
        transcript: list[Message] | None = None,
        *,
        stream: bool = False,
        check_limits: bool = True,
    ) -> PreparedCall:
        """What ``generate()`` would send, without sending it (batches use this).

        Checks the limits first (``LimitReachedError``; ``check_limits=False`` skips them,
        for a call whose limits were checked when it was sent), then resolves the provider,
        compacts the chat when its request outgrows the context window (not with
        ``check_limits=False``: that call was compacted when it was sent) and builds the
        request with the same mapping as every model call.
        """
        if transcript is None:
            transcript = self.store.transcript.load_transcript()
        config = self.store.config.get_config()
        if check_limits:
            self._check_limits(transcript, config)
        prepared = self._prepare_for(transcript, config, None, stream)
        if check_limits and self.summaries.compaction_due(transcript, config, prepared.model_id):
            self.summaries.compact(transcript, config)
            prepared.request = self._request(
                transcript, config, prepared.model_id, stream, prepared.recalled
            )
        return prepared

    def _prepare_for(
        self, transcript: list[Message], config: ChatConfig, model: str | None, stream: bool
    ) -> PreparedCall:
        """The call to ``model`` (a fallback), or to the chat's model when None."""
        hint = None if model else config.provider
        model = model or config.model or agentloop_settings.DEFAULT_MODEL
        provider, model_id = providers.resolve(model, hint)
        # Each call of a turn (a fallback's, a retry's after compaction) is given the same
        # memories: the store recalls once per user message.
        recalled = self._recall(transcript, config)
        return PreparedCall(
            provider=provider,
            provider_name=providers.split_model(model, hint)[0],
            model_id=model_id,
            request=self._request(transcript, config, model_id, stream, recalled),
            transcript=transcript,
            recalled=recalled,
        )

    def accept_response(
        self,
        prepared: PreparedCall,
        response: ModelResponse,
        *,
        cost: Decimal | None = None,
        duration_ms: int | None = None,
        partial_key: Any = None,
        release_after: tuple[str, ...] = (),
        verdict: Verdict | None = None,
        reservation: Any = None,
    ) -> Any:
        """Append the answer to a prepared call, with its usage row, as ``generate()`` does;
        the answer (with its keys) is added to ``prepared.transcript``.

        ``cost`` overrides the provider's price (e.g. a batch discount). When the answer
        leads to one of the moves in ``release_after``, the same transaction releases the
        claim (the verb ends with this write). ``verdict``: what the output guardrails
        decided (kept on the answer; one that did not pass marks it blocked).
        ``reservation``: the call's budget reservation, settled by the same write.
        """
        message = self._answer(response, prepared.transcript, prepared.model_id)
        if prepared.recalled is not None:
            message.recall = prepared.recalled.memories  # written with the answer: no statement
        if verdict is not None:
            message.guardrails = list(verdict.outcomes)
            if not verdict.passed:
                message.status = MessageStatus.BLOCKED  # kept for the record, never sent
                for call in message.tool_calls:
                    # Asked for by a blocked answer: never run, never held for a person.
                    call.state = ToolCallState.CANCELLED
        if cost is None:
            cost = prepared.provider.cost(prepared.model_id, response.usage)
        usage = UsageRecord(
            provider=prepared.provider_name,
            model=prepared.model_id,
            status="succeeded",
            usage=response.usage,
            cost=cost,
            duration_ms=duration_ms,
            reservation=reservation,
        )
        then = "tools" if message.tool_calls else "done"
        release = then if then in release_after else None
        record = self.store.transcript.save_answer(
            message, usage, partial_key=partial_key, release=release
        )
        prepared.transcript.append(message)
        self._emit("after_message", record)
        # Not a callback (no ``on()`` takes it): an iterated run's tool calls, as asked.
        self._emit("answer_saved", message)
        return record

    def generate(
        self, transcript: list[Message], stream: StreamCallback | None, run: Run
    ) -> Effects[Any]:
        """One model call of ``run`` (fallbacks, one compaction on a context-length error);
        the answer is saved and added to ``transcript``. The chat's input guardrails judge
        the user's message first (or meanwhile), its output guardrails the answer's text."""
        guards = Guards(self.store, self._emit, self.owner)
        checkpoints = run.checkpoints
        panels = guards.input_panels(transcript, guards.input)
        if panels:  # the user's message is judged before anything is sent
            judge = Judge(panels, self.store.wrap_thread, checkpoints)
            guards.settle_input(panels, (yield judge))
        prepared = self.prepare_model_call(transcript, stream=stream is not None)
        panels = guards.input_panels(transcript, guards.parallel, parallel=True)
        judging = Judging(panels) if panels else None
        if judging is not None:  # ... or while the model call is in flight
            yield StartJudging(Judge(panels, self.store.wrap_thread), judging)
        try:
            return (yield from self._generate(prepared, transcript, stream, run, guards, judging))
        except ProviderError:
            if judging is not None and not judging.applied:
                # The call failed for good while they judged: a block still stops the chat.
                verdicts = yield AwaitJudging(judging, checkpoints=checkpoints)
                guards.settle_input(judging.panels, verdicts)
            raise

    def _generate(
        self,
        prepared: PreparedCall,
        transcript: list[Message],
        stream: StreamCallback | None,
        run: Run,
        guards: Guards,
        judging: Judging | None,
    ) -> Effects[Any]:
        config = self.store.config.get_config()
        streams = stream is not None
        self._emit("before_message")
        chain: list[str | None] = [None, *config.fallbacks]  # None: the chat's own model
        compacted = False
        index = 0
        while True:
            try:
                response, partial_key, started, reservation = yield from self._send(
                    prepared, stream, run, judging
                )
                break
            except Judged as judged:  # the parallel guardrails did not pass the call
                assert judging is not None  # noqa: S101 - only a judged call raises it
                judging.applied = True
                guards.settle_input(judging.panels, judged.verdicts)  # raises, unless replaced
                judging = None
                # Replaced: the same model again, asked with the new text.
                prepared = self._prepare_for(transcript, config, chain[index], streams)
                continue
            except ContextLengthError as exc:
                if not compacted and self.summaries.compact(transcript, config) is not None:
                    # One compaction and one retry of the same model.
                    compacted = True
                    prepared = self._prepare_for(transcript, config, chain[index], streams)
                    continue
                error: ProviderError = exc
                if compacted:
                    error = ContextLengthError(
                        f"The conversation is still too long for {prepared.model_id} after "
                        f"compaction: {exc}",
                        status=exc.status,
                        body=exc.body,
                    )
                    error.__cause__ = exc
            except ProviderError as exc:
                if not falls_back(exc):
                    raise
                error = exc
            if index + 1 >= len(chain):
                raise error
            index += 1
            failed = prepared
            prepared = self._prepare_for(transcript, config, chain[index], streams)
            self._emit("model_fallback", failed.provider_name + ":" + failed.model_id,
                       prepared.provider_name + ":" + prepared.model_id, error)  # fmt: skip
        if judging is not None:  # they passed it while the call was in flight
            judging.applied = True
            guards.settle_input(judging.panels, judging.verdicts)
        duration_ms = int((time.monotonic() - started) * 1000)
        verdict = None
        panels = guards.answer_panels(response, prepared.model_id, transcript)
        if panels:  # the answer's text is judged before it is kept
            try:
                (verdict,) = yield Judge(panels, self.store.wrap_thread, run.checkpoints)
            except CancelledError as exc:
                self._record_cancel_unjudged(exc, prepared, response, started,
                                             partial_key, reservation)  # fmt: skip
                raise
            if verdict.passed and verdict.text is not None:
                response = response.model_copy(update={"content": verdict.text, "parsed": None})
        stands = verdict is None or verdict.passed
        # The step's last write releases the claim when the verb ends with it: a single
        # step always, a loop when the answer settles the turn.
        record = self.accept_response(
            prepared,
            response,
            duration_ms=duration_ms,
            partial_key=partial_key,
            release_after=(("tools", "done") if run.single else ("done",)) if stands else (),
            verdict=verdict,
            reservation=reservation,
        )
        run.next_move = next_move(transcript)
        if verdict is not None and not stands:
            guards.fail_or_stop(verdict)  # kept, marked blocked; the chat stops (or fails)
        return record

    def _send(
        self,
        prepared: PreparedCall,
        stream: StreamCallback | None,
        run: Run,
        judging: Judging | None = None,
    ) -> Effects[tuple[ModelResponse, Any, float, Any]]:
        """One model's answer, with the step's retries: the response, the key of its streamed
        partial row, when the answering attempt started, and its budget reservation. Each
        attempt is admitted first (rate limits, budgets: admission, above); a usage row per
        failure. The request and the backoff are effects (:mod:`._effects`): the driver does
        the I/O.
        With ``judging`` (input guardrails judging meanwhile) the call is abandoned when
        they don't pass it, and ``Judged`` raised with their verdicts."""
        checkpoints: Checkpoints = run.checkpoints
        provider, model_id, request = prepared.provider, prepared.model_id, prepared.request
        provider_name = prepared.provider_name
        retries = agentloop_settings.MODEL_RETRIES
        partial_key = None  # a failed attempt's streamed partial: the retry takes its place
        for attempt in range(retries + 1):
            checkpoints.check(force=False)  # just before the request
            try:
                reservation = yield from self.admission.admit(
                    provider, provider_name, request, checkpoints
                )
            except BaseException:
                if partial_key is not None:  # a failed attempt's partial that nothing finishes
                    self.store.transcript.fail_partial(partial_key)
                raise
            output = self._output_parser() if stream is not None else None
            state = StreamState(self.store, checkpoints, stream, model_id, judging, output)
            state.partial_key = partial_key
            started = time.monotonic()
            try:
                with tracing.model_call(
                    provider_name, model_id, request
                ) as span:  # one span per attempt
                    stream_state = state if request.stream else None
                    response = yield Send(
                        provider, request, stream_state, checkpoints, provider_name, judging
                    )
                    span.response(response)
            except CancelledError as exc:
                partial = None
                if state.text:
                    partial = Message(role="assistant", content=state.text, model=model_id)
                usage = UsageRecord(
                    provider=provider_name,
                    model=model_id,
                    status="cancelled",
                    duration_ms=int((time.monotonic() - started) * 1000),
                    reservation=reservation,
                )
                self._record_cancel(
                    exc, partial=partial, partial_key=state.partial_key, usage=usage
                )
                raise
            except CallAbandoned:
                assert judging is not None  # noqa: S101 - only a judged call is abandoned
                unkept = unkept_usage(provider, provider_name, model_id, started, None,
                                      why=ABANDONED, reservation=reservation)  # fmt: skip
                self.store.transcript.record_usage(unkept)
                raise Judged((yield AwaitJudging(judging, checkpoints=checkpoints))) from None
            except Exception as exc:
                failed = failed_usage(provider_name, model_id, exc, started)
                failed.reservation = reservation
                self.store.transcript.record_usage(failed)
                delay = retry_delay(attempt, exc) if attempt < retries else None
                if delay is not None:
                    partial_key = state.partial_key
                    yield Sleep(delay)
                    checkpoints.check()
                    continue
                if state.partial_key is not None:
                    # Nothing will finish this answer: it must not look like it still streams.
                    self.store.transcript.fail_partial(state.partial_key)
                raise
            if judging is not None:
                try:  # passed: the held chunks go out
                    verdicts = yield AwaitJudging(judging, state, checkpoints)
                except CancelledError as exc:
                    self._record_cancel_unjudged(exc, prepared, response, started,
                                                 state.partial_key, reservation)  # fmt: skip
                    raise
                if not judging.passed:
                    # The answer came first; the verdict drops it (its usage is kept).
                    self.store.transcript.record_usage(
                        unkept_usage(provider, provider_name, model_id, started, response,
                                     why=ABANDONED, reservation=reservation)
                    )  # fmt: skip
                    raise Judged(verdicts)
            return response, state.partial_key, started, reservation
        raise AssertionError("unreachable")  # pragma: no cover

    def _record_cancel_unjudged(self, exc: CancelledError, prepared: PreparedCall,
                                response: ModelResponse, started: float, partial_key: Any,
                                reservation: Any) -> None:  # fmt: skip
        """A cancel came while guardrails judged an answer: the call's usage is kept, its
        unjudged text is not (a streamed partial row ends cancelled, with no text)."""
        usage = unkept_usage(prepared.provider, prepared.provider_name, prepared.model_id,
                             started, response, why=UNJUDGED, reservation=reservation)  # fmt: skip
        blank = Message(role="assistant", content="", model=prepared.model_id)
        partial = None if partial_key is None else blank
        self._record_cancel(exc, partial=partial, partial_key=partial_key, usage=usage)

    def _answer(self, response: ModelResponse, transcript: list[Message], model_id: str) -> Message:
        """The assistant message for a response: unique call ids, parsed structured output."""
        seen = {call.id for message in transcript for call in message.tool_calls}
        if response.tool_calls and self.store.edits is not None:
            # Ids of superseded calls are taken too: a tool's idempotency key never repeats.
            seen.update(call.id for call in self.store.edits.superseded_calls())
        calls = []
        for call in response.tool_calls:
            call_id = call.id or f"call_{uuid.uuid4().hex[:12]}"
            if call_id in seen:  # some servers reuse ids across answers
                call_id = f"{call_id}_{uuid.uuid4().hex[:8]}"
            seen.add(call_id)
            calls.append(call.model_copy(update={"id": call_id, "state": ToolCallState.PENDING}))
        parsed = response.parsed
        if self.store.config.get_config().output_schema and response.content:
            # Our own parse validates against the pydantic model when there is one.
            parsed = self._parse(response.content)
        return Message(
            role="assistant",
            content=response.content,
            tool_calls=calls,
            parsed=parsed,
            model=response.model or model_id,
            finish_reason=response.finish_reason,
            thinking=response.thinking,
            provider_data=response.provider_data,
            status=MessageStatus.COMPLETE,
        )

    def _output_model(self) -> type[BaseModel] | None:
        """The pydantic model answers are validated against: the one given in this process,
        else the one the chat keeps the import path of; None for a JSON schema."""
        model = self._schema_model()
        path = self.store.config.get_config().schema_path
        if model is None and path:
            loaded = load_by_path(path)
            model = loaded if isinstance(loaded, type) and issubclass(loaded, BaseModel) else None
        return model

    def _output_parser(self) -> OutputParser | None:
        """What parses a streamed answer's structured output as it grows (no schema: None)."""
        if not self.store.config.get_config().output_schema:
            return None
        return OutputParser(self._output_model())

    def _parse(self, content: str) -> Any:
        model = self._output_model()
        try:
            if model is not None:
                return model.model_validate_json(content).model_dump(mode="json")
            return json.loads(content)
        except (ValidationError, ValueError):
            return None  # kept as text; parsed stays None so callers can tell

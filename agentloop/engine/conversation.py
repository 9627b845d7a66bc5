"""The loop's verbs, written once over a :class:`~.store.ChatStore`.

Every verb reads the transcript and decides from it alone, so a chat can be
driven from any process: ``step()`` here, ``step()`` in a Celery worker later.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from pydantic import BaseModel, ValidationError

from .. import providers
from ..conf import agentloop_settings
from ..exceptions import (
    CancelledError,
    ChatBusyError,
    ConfigurationError,
    LimitReachedError,
    PendingToolCallsError,
    ProviderError,
)
from ..messages import (
    Message,
    MessageStatus,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolCallState,
    attachments_from,
)
from ..providers.base import Provider
from ..tools import Tool, load_by_path
from .checkpoints import Checkpoints
from .config import ChatConfig
from .configuration import Configuration
from .people import PeopleInTheLoop
from .store import ChatStore, UsageRecord
from .streaming import StreamCallback, StreamState, backoff
from .tool_runner import ToolRunner
from .transcript import (
    finished,
    is_complete,
    is_waiting,
    next_move,
    pending_round,
    turn_start,
)

__all__ = ["CANCELLED_TOOL_RESULT", "Conversation", "PreparedCall", "StreamCallback"]

#: the result given to calls left unanswered by a cancel when the user moves on.
CANCELLED_TOOL_RESULT = "Cancelled by the user before this tool ran."

_EVENTS = (
    "before_message",
    "after_message",
    "before_tool_call",
    "after_tool_result",
    "cancelled",
    "stopped",
)


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass
class PreparedCall:
    """A model call ready to send: ``generate()`` sends it at once, a batch later."""

    provider: Provider
    provider_name: str
    model_id: str
    request: ModelRequest
    transcript: list[Message]


class Conversation(Configuration, PeopleInTheLoop):
    """A chat's verbs and configuration over a store.

    ``agentloop.chat()`` returns one over a :class:`~.memory.MemoryStore`; the
    persisted ``Chat`` model drives one over the Django store.
    """

    def __init__(self, store: ChatStore, *, owner: Any = None) -> None:
        self.store = store
        #: what tools see as ``self.context.chat``: the persisted chat, or this object.
        self.owner = owner if owner is not None else self
        self._callbacks: dict[str, list[Callable[..., Any]]] = defaultdict(list)
        self._schema_model: type[BaseModel] | None = None

    def __repr__(self) -> str:
        return f"<Conversation model={self.store.get_config().model!r}>"

    # -- callbacks ----------------------------------------------------------------------
    def on(self, event: str, callback: Callable[..., Any]) -> Conversation:
        """Call ``callback`` on ``event`` (one of the callback names, "cancelled", "stopped")."""
        if event not in _EVENTS:
            raise ConfigurationError(f"Unknown event {event!r}; choose from {', '.join(_EVENTS)}")
        self._callbacks[event].append(callback)
        return self

    def before_message(self, callback: Callable[[], Any]) -> Conversation:
        """Call ``callback()`` before each model call."""
        return self.on("before_message", callback)

    def after_message(self, callback: Callable[[Any], Any]) -> Conversation:
        """Call ``callback(message)`` after each message is added (user, assistant, tool)."""
        return self.on("after_message", callback)

    def before_tool_call(self, callback: Callable[[Any], Any]) -> Conversation:
        """Call ``callback(tool_call)`` before each tool runs."""
        return self.on("before_tool_call", callback)

    def after_tool_result(self, callback: Callable[[Any], Any]) -> Conversation:
        """Call ``callback(result_message)`` after each tool result is saved."""
        return self.on("after_tool_result", callback)

    def _emit(self, event: str, *args: Any) -> None:
        for callback in self._callbacks.get(event, ()):
            callback(*args)

    # -- reading --------------------------------------------------------------------------
    @property
    def messages(self) -> list[Message]:
        """The transcript (engine messages, read fresh)."""
        return self.store.load_transcript()

    def is_complete(self) -> bool:
        """Settled: the latest answer asked for no tools (or there is nothing yet)."""
        return is_complete(self.store.load_transcript())

    def is_waiting(self) -> bool:
        """A pending tool call is held by an approval, a question or a subagent."""
        return is_waiting(self.store.load_transcript())

    def tools(self) -> dict[str, type[Tool]]:
        """The chat's tools by name."""
        return {tool.name: tool for tool in self.store.get_tools()}

    # -- verbs ------------------------------------------------------------------------------
    def cancel(self) -> None:
        """Ask the run to stop at its next checkpoint; works from any thread or process."""
        self.store.request_cancel()

    def ask_later(self, content: str, attachments: Any = None) -> Conversation:
        """Add a user message; no model call. Refuses while tool calls wait for results,
        except calls left by a cancel, which are answered as cancelled first.

        ``attachments``: an :class:`~agentloop.messages.Attachment`, an http(s) or ``data:``
        URL, a ``pathlib.Path``, or a list of them (``AttachmentError`` when one can't be
        sent; checked before anything is written)."""
        limit = agentloop_settings.MAX_ATTACHMENT_BYTES
        files = attachments_from(attachments, max_bytes=None if limit is None else int(limit))
        round_ = pending_round(self.store.load_transcript())
        if self.store.running_elsewhere():
            raise ChatBusyError(
                "A background worker is running this chat; add the message when it is done "
                "(or cancel() the run first)."
            )
        if round_.unanswered:
            if not all(call.state == ToolCallState.CANCELLED for call in round_.unanswered):
                names = ", ".join(f"{call.name} ({call.id})" for call in round_.unanswered)
                raise PendingToolCallsError(
                    f"{len(round_.unanswered)} tool call(s) still wait for results: {names}. "
                    "Run them with run_tools() or complete() before adding a user message."
                )
            for call in round_.unanswered:
                result = Message(
                    role="tool",
                    content=CANCELLED_TOOL_RESULT,
                    tool_call_id=call.id,
                    tool_name=call.name,
                    is_error=True,
                )
                record = self.store.save_tool_result(call, result, ToolCallState.CANCELLED, None)
                self._emit("after_message", record)
        record = self.store.append_message(Message(role="user", content=content, attachments=files))
        self._emit("after_message", record)
        return self

    def generate(self, stream: StreamCallback | None = None) -> Any:
        """Exactly one model call (with retries of that call); appends and returns the answer."""
        with self._run() as checkpoints:
            return self._generate(self._read(checkpoints), stream, checkpoints)

    def run_tools(self) -> list[Any]:
        """Run the pending tool calls and append a result for each; skips answered ones."""
        with self._run() as checkpoints:
            return self._run_tools(self._read(checkpoints), checkpoints)

    def step(self, stream: StreamCallback | None = None) -> Any:
        """Do the next move: run pending tools, else call the model. None when settled or
        waiting. Returns the last message added."""
        with self._run() as checkpoints:
            return self._step(stream, checkpoints)

    def complete(self, stream: StreamCallback | None = None) -> Any:
        """Step until settled or waiting; returns the last message."""
        last: Any = None
        with self._run() as checkpoints:
            while True:
                added = self._step(stream, checkpoints)
                if added is None:
                    break
                last = added
        if last is None:
            transcript = finished(self.store.load_transcript())
            return self.store.native_message(transcript[-1]) if transcript else None
        return last

    def ask(
        self, content: str, stream: StreamCallback | None = None, *, attachments: Any = None
    ) -> Any:
        """``ask_later(content, attachments)`` then ``complete()``; returns the answer."""
        self.ask_later(content, attachments)
        return self.complete(stream)

    # -- internals ---------------------------------------------------------------------------
    @contextmanager
    def _run(self) -> Iterator[Checkpoints]:
        """A run; turns any CancelledError into a recorded one. Its first read (``_read``)
        is the verb's start checkpoint."""
        checkpoints = Checkpoints(self.store, float(agentloop_settings.CANCEL_POLL_INTERVAL))
        try:
            yield checkpoints
        except CancelledError as exc:
            if not exc.recorded:
                self._record_cancel(exc)
            raise

    def _record_cancel(
        self,
        exc: CancelledError,
        *,
        partial: Message | None = None,
        partial_key: Any = None,
        usage: UsageRecord | None = None,
        unanswered: list[ToolCall] | None = None,
    ) -> None:
        requested_at = exc.requested_at if isinstance(exc.requested_at, datetime) else None
        self.store.record_cancellation(
            requested_at,
            partial=partial,
            partial_key=partial_key,
            usage=usage,
            unanswered=unanswered or [],
        )
        exc.recorded = True
        self._emit("cancelled")

    def drop_cancel_request(self, requested_at: datetime | None) -> None:
        """Forget a cancel that came as the turn finished: nothing is left to stop, and left
        set it would stop the next question at once (a newer request is kept)."""
        if requested_at is not None:
            self.store.record_cancellation(
                requested_at, partial=None, partial_key=None, usage=None, unanswered=[]
            )

    def _read(self, checkpoints: Checkpoints) -> list[Message]:
        """The transcript, read together with the cancel flag: the start-of-verb checkpoint."""
        transcript, requested_at = self.store.read_for_step()
        self._observe(checkpoints, requested_at, transcript)
        return transcript

    def _observe(
        self, checkpoints: Checkpoints, requested_at: Any, transcript: list[Message]
    ) -> None:
        """Stop here if cancelled; a round not yet run is marked cancelled, so the next
        ``ask_later`` answers its calls instead of refusing."""
        try:
            checkpoints.observe(requested_at)
        except CancelledError as exc:
            unanswered = [
                call
                for call in pending_round(transcript).unanswered
                if call.state != ToolCallState.WAITING
            ]
            self._record_cancel(exc, unanswered=unanswered)
            raise

    def _step(self, stream: StreamCallback | None, checkpoints: Checkpoints) -> Any:
        transcript, requested_at = self.store.read_for_step()
        move = next_move(transcript)
        if requested_at is not None and move == "done":
            self.drop_cancel_request(requested_at)
            return None
        # Waiting with a cancel requested: the cancel applies to the held round (its calls
        # are marked cancelled), as it would when the chat is resumed later.
        self._observe(checkpoints, requested_at, transcript)
        if move == "tools":
            results = self._run_tools(transcript, checkpoints)
            return results[-1] if results else None
        if move == "generate":
            return self._generate(transcript, stream, checkpoints)
        return None  # done, or waiting for a person or a subagent

    def _tool_map(self) -> dict[str, type[Tool]]:
        return {tool.name: tool for tool in self.store.get_tools()}

    def _run_tools(self, transcript: list[Message], checkpoints: Checkpoints) -> list[Any]:
        round_ = pending_round(transcript)
        if round_.message is None or not round_.unanswered:
            return []
        options = self.store.get_config().tool_options
        if options.concurrency is None and agentloop_settings.TOOL_CONCURRENCY is not None:
            # The chat didn't choose: the project-wide default applies.
            options = options.model_copy(
                update={"concurrency": agentloop_settings.TOOL_CONCURRENCY}
            )
        runner = ToolRunner(
            self.store,
            self._tool_map(),
            options,
            checkpoints,
            self._emit,
            chat=self.owner,
        )
        try:
            return runner.run(round_.message.tool_calls, round_.unanswered)
        except CancelledError as exc:
            left = [call for call in round_.unanswered if call.id not in runner.answered]
            self._record_cancel(exc, unanswered=left)
            raise

    # generate -------------------------------------------------------------------------------
    def _check_limits(self, transcript: list[Message], config: ChatConfig) -> None:
        limits = config.limits
        if not limits.is_set():
            return
        start = turn_start(transcript)
        turn = [m for m in transcript[start:] if m.is_finished]
        reason = None
        model_calls = sum(1 for m in turn if m.role == "assistant")
        tool_calls = sum(1 for m in turn if m.role == "tool")
        if limits.max_model_calls is not None and model_calls >= limits.max_model_calls:
            reason = f"max_model_calls reached ({model_calls} of {limits.max_model_calls})"
        elif limits.max_tool_calls is not None and tool_calls >= limits.max_tool_calls:
            reason = f"max_tool_calls reached ({tool_calls} of {limits.max_tool_calls})"
        elif limits.max_seconds is not None or limits.max_cost is not None:
            began = self.store.turn_started_at(transcript[start]) if transcript else None
            if began is not None and limits.max_seconds is not None:
                elapsed = (_now() - began).total_seconds()
                if elapsed >= limits.max_seconds:
                    reason = f"max_seconds reached ({elapsed:.1f}s of {limits.max_seconds}s)"
            if reason is None and began is not None and limits.max_cost is not None:
                cost = self.store.turn_cost(began)
                if cost >= limits.max_cost:
                    reason = f"max_cost reached ({cost} of {limits.max_cost})"
        if reason is not None:
            self.store.record_stop(reason)
            self._emit("stopped", reason)
            raise LimitReachedError(reason)

    def _request(
        self, transcript: list[Message], config: ChatConfig, model_id: str, stream: bool
    ) -> ModelRequest:
        options = config.tool_options
        tools = [tool.definition() for tool in self.store.get_tools()]
        messages = [m for m in transcript if m.is_finished]
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
        for a call whose limits were checked when it was sent), then resolves the provider
        and builds the request with the same mapping as every model call.
        """
        if transcript is None:
            transcript = self.store.load_transcript()
        config = self.store.get_config()
        if check_limits:
            self._check_limits(transcript, config)
        model = config.model or agentloop_settings.DEFAULT_MODEL
        provider, model_id = providers.resolve(model, config.provider)
        return PreparedCall(
            provider=provider,
            provider_name=providers.split_model(model, config.provider)[0],
            model_id=model_id,
            request=self._request(transcript, config, model_id, stream),
            transcript=transcript,
        )

    def accept_response(
        self,
        prepared: PreparedCall,
        response: ModelResponse,
        *,
        cost: Decimal | None = None,
        duration_ms: int | None = None,
        partial_key: Any = None,
    ) -> Any:
        """Append the answer to a prepared call, with its usage row, as ``generate()`` does.

        ``cost`` overrides the provider's price (e.g. a batch discount).
        """
        message = self._answer(response, prepared.transcript, prepared.model_id)
        if cost is None:
            cost = prepared.provider.cost(prepared.model_id, response.usage)
        usage = UsageRecord(
            provider=prepared.provider_name,
            model=prepared.model_id,
            status="succeeded",
            usage=response.usage,
            cost=cost,
            duration_ms=duration_ms,
        )
        record = self.store.save_answer(message, usage, partial_key=partial_key)
        self._emit("after_message", record)
        return record

    def _generate(
        self,
        transcript: list[Message],
        stream: StreamCallback | None,
        checkpoints: Checkpoints,
    ) -> Any:
        prepared = self.prepare_model_call(transcript, stream=stream is not None)
        provider, model_id, request = prepared.provider, prepared.model_id, prepared.request
        provider_name = prepared.provider_name
        retries = int(agentloop_settings.MODEL_RETRIES)
        self._emit("before_message")
        partial_key = None  # a failed attempt's streamed partial: the retry takes its place
        for attempt in range(retries + 1):
            checkpoints.check(force=False)  # just before the request
            state = StreamState(self.store, checkpoints, stream, model_id)
            state.partial_key = partial_key
            started = time.monotonic()
            try:
                response = provider.request(
                    request, on_chunk=state.on_chunk if request.stream else None
                )
            except CancelledError as exc:
                partial = None
                if state.text:
                    partial = Message(role="assistant", content=state.text, model=model_id)
                usage = UsageRecord(
                    provider=provider_name,
                    model=model_id,
                    status="cancelled",
                    duration_ms=int((time.monotonic() - started) * 1000),
                )
                self._record_cancel(
                    exc, partial=partial, partial_key=state.partial_key, usage=usage
                )
                raise
            except Exception as exc:
                self.store.record_usage(
                    UsageRecord(
                        provider=provider_name,
                        model=model_id,
                        status="failed",
                        error=f"{type(exc).__name__}: {exc}",
                        duration_ms=int((time.monotonic() - started) * 1000),
                    )
                )
                if isinstance(exc, ProviderError) and exc.retryable and attempt < retries:
                    partial_key = state.partial_key
                    time.sleep(backoff(attempt, exc.retry_after))
                    checkpoints.check()
                    continue
                raise
            return self.accept_response(
                prepared,
                response,
                duration_ms=int((time.monotonic() - started) * 1000),
                partial_key=state.partial_key,
            )
        raise AssertionError("unreachable")  # pragma: no cover

    def _answer(self, response: ModelResponse, transcript: list[Message], model_id: str) -> Message:
        """The assistant message for a response: unique call ids, parsed structured output."""
        seen = {call.id for message in transcript for call in message.tool_calls}
        calls = []
        for call in response.tool_calls:
            call_id = call.id or f"call_{uuid.uuid4().hex[:12]}"
            if call_id in seen:  # some servers reuse ids across answers
                call_id = f"{call_id}_{uuid.uuid4().hex[:8]}"
            seen.add(call_id)
            calls.append(call.model_copy(update={"id": call_id, "state": ToolCallState.PENDING}))
        parsed = response.parsed
        if self.store.get_config().output_schema and response.content:
            # Our own parse validates against the pydantic model when there is one.
            parsed = self._parse(response.content)
        return Message(
            role="assistant",
            content=response.content,
            tool_calls=calls,
            parsed=parsed,
            model=response.model or model_id,
            finish_reason=response.finish_reason,
            provider_data=response.provider_data,
            status=MessageStatus.COMPLETE,
        )

    def _parse(self, content: str) -> Any:
        model = self._schema_model
        path = self.store.get_config().schema_path
        if model is None and path:
            loaded = load_by_path(path)
            model = loaded if isinstance(loaded, type) and issubclass(loaded, BaseModel) else None
        try:
            if model is not None:
                return model.model_validate_json(content).model_dump(mode="json")
            return json.loads(content)
        except (ValidationError, ValueError):
            return None  # kept as text; parsed stays None so callers can tell

"""The loop's verbs, written once over a :class:`~.store.ChatStore`.

Every verb reads the transcript and decides from it alone, so a chat can be
driven from any process: ``step()`` here, ``step()`` in a Celery worker later.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ValidationError

from .. import providers
from ..conf import agentloop_settings
from ..exceptions import (
    CancelledError,
    ConfigurationError,
    LimitReachedError,
    PendingToolCallsError,
    ProviderError,
    ToolCallNotWaitingError,
)
from ..messages import (
    Chunk,
    Message,
    MessageStatus,
    ModelRequest,
    ModelResponse,
    TextDelta,
    ToolCall,
    ToolCallState,
)
from ..tools import Tool, import_path_of, load_by_path
from .checkpoints import Checkpoints
from .config import ChatConfig, Limits, ToolOptions
from .store import ChatStore, UsageRecord
from .tool_runner import DENIED_RESULT, ToolRunner
from .transcript import (
    finished,
    is_complete,
    is_waiting,
    next_move,
    pending_round,
    turn_start,
)

__all__ = ["CANCELLED_TOOL_RESULT", "Conversation", "StreamCallback"]

StreamCallback = Callable[[Chunk], None]

#: the result given to calls left unanswered by a cancel when the user moves on.
CANCELLED_TOOL_RESULT = "Cancelled by the user before this tool ran."

_UNSET: Any = object()
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


def _as_tool_class(obj: Any) -> type[Tool]:
    """A Tool class from what users pass to ``with_tools``."""
    if isinstance(obj, type) and issubclass(obj, Tool):
        return obj
    as_tool = getattr(obj, "as_tool", None)
    if callable(as_tool):  # agents, and anything else that can become a tool
        converted = as_tool()
        if isinstance(converted, type) and issubclass(converted, Tool):
            return converted
    raise ConfigurationError(
        f"{obj!r} is not a tool: pass a Tool subclass or a function decorated with @tool."
    )


def _package_name(obj: Any) -> str:
    """``billing`` for a class in ``billing.agents`` or ``billing``."""
    parts = [part for part in obj.__module__.split(".") if part not in {"agents", "tools"}]
    return parts[-1] if parts else obj.__module__.split(".")[-1]


class _StreamState:
    """Collects a streamed answer: forwards chunks, checks cancellation, saves partials."""

    def __init__(
        self,
        store: ChatStore,
        checkpoints: Checkpoints,
        stream: StreamCallback | None,
        model: str,
    ) -> None:
        self.store = store
        self.checkpoints = checkpoints
        self.stream = stream
        self.model = model
        self.parts: list[str] = []
        self.partial_key: Any = None
        self.interval = float(agentloop_settings.PARTIAL_SAVE_INTERVAL)
        self._last_save = time.monotonic()

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def on_chunk(self, chunk: Chunk) -> None:
        if self.stream is not None:
            self.stream(chunk)
        if isinstance(chunk, TextDelta) and chunk.text:
            self.parts.append(chunk.text)
            now = time.monotonic()
            if now - self._last_save >= self.interval:
                # Long answers become visible (and survive a crash) as a marked partial.
                self.partial_key = self.store.save_partial(self.text, self.partial_key, self.model)
                self._last_save = now
        self.checkpoints.check(force=False)


class Conversation:
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

    # -- configuration ----------------------------------------------------------------
    def with_model(self, model: str, provider: str | None = None) -> Conversation:
        """Use ``model`` (``"provider:model"`` or a known model id) from now on."""
        providers.split_model(model, provider)  # fail now on a model nobody can serve
        self.store.update_config(model=model, provider=provider)
        return self

    def with_instructions(self, text: str, append: bool = False) -> Conversation:
        """Set the system message (replacing earlier ones unless ``append``)."""
        if not append:
            self.store.remove_system_messages()
        self.store.append_message(Message(role="system", content=text))
        return self

    def with_tools(self, *tools: Any, replace: bool = False) -> Conversation:
        """Offer these tools (Tool classes, @tool functions, agents) to the model."""
        current = [] if replace else list(self.store.get_tools())
        by_name = {tool.name: tool for tool in current}
        for tool in tools:
            tool_class = _as_tool_class(tool)
            existing = by_name.get(tool_class.name)
            agent = getattr(tool_class, "agent_class", None)
            clash = existing is not None and existing.__module__ != tool_class.__module__
            if clash and agent is not None:
                # Two agents named alike (billing.Research, legal.Research): the newcomer's
                # name takes its package's name, as in "billing_research".
                tool_class = agent.as_tool(
                    name=f"{_package_name(agent)}_{tool_class.name}",
                    **getattr(tool_class, "bound_inputs", {}),
                )
            by_name[tool_class.name] = tool_class
        self.store.set_tools(list(by_name.values()))
        return self

    def with_tool_options(
        self,
        *,
        choice: str | None = _UNSET,
        calls: str = _UNSET,
        concurrency: str | int | None = _UNSET,
    ) -> Conversation:
        """``choice`` ("auto", "none", "required" or a tool name), ``calls`` ("many" or
        "one"), ``concurrency`` (None, "threads" or a pool size)."""
        changes = {
            key: value
            for key, value in {"choice": choice, "calls": calls, "concurrency": concurrency}.items()
            if value is not _UNSET
        }
        current = self.store.get_config().tool_options.model_dump()
        try:
            options = ToolOptions.model_validate({**current, **changes})
        except ValidationError as exc:
            raise ConfigurationError(f"Invalid tool options: {exc}") from exc
        self.store.update_config(tool_options=options)
        return self

    def with_temperature(self, temperature: float | None) -> Conversation:
        """Sampling temperature (None: the provider's default)."""
        self.store.update_config(temperature=temperature)
        return self

    def with_max_output_tokens(self, tokens: int | None) -> Conversation:
        """Cap the length of each answer."""
        self.store.update_config(max_output_tokens=tokens)
        return self

    def with_provider_options(self, **options: Any) -> Conversation:
        """Raw request fields merged into what the provider is sent."""
        merged = {**self.store.get_config().provider_options, **options}
        self.store.update_config(provider_options=merged)
        return self

    def with_headers(self, **headers: str) -> Conversation:
        """Extra HTTP headers for the provider (stored with the chat: no secrets)."""
        merged = {**self.store.get_config().headers, **headers}
        self.store.update_config(headers=merged)
        return self

    def with_schema(self, schema: type[BaseModel] | dict[str, Any] | None) -> Conversation:
        """Ask for structured output; answers are parsed into ``message.parsed``."""
        if schema is None:
            self._schema_model = None
            self.store.update_config(output_schema=None, schema_path=None)
        elif isinstance(schema, dict):
            self._schema_model = None
            self.store.update_config(output_schema=schema, schema_path=None)
        elif isinstance(schema, type) and issubclass(schema, BaseModel):
            self._schema_model = schema
            try:
                path: str | None = import_path_of(schema)
            except ConfigurationError:
                path = None  # parsed in this process only; elsewhere as plain JSON
            self.store.update_config(output_schema=schema.model_json_schema(), schema_path=path)
        else:
            raise ConfigurationError("with_schema() takes a pydantic model class or a JSON schema")
        return self

    def with_limits(self, **limits: Any) -> Conversation:
        """Per-turn budgets: ``max_model_calls``, ``max_tool_calls``, ``max_seconds``,
        ``max_cost``. Given keys replace earlier values; pass None to remove one."""
        current = self.store.get_config().limits.model_dump()
        try:
            merged = Limits.model_validate({**current, **limits})
        except ValidationError as exc:
            raise ConfigurationError(f"Invalid limits: {exc}") from exc
        self.store.update_config(limits=merged)
        return self

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

    def pending_approvals(self) -> list[Any]:
        """Tool calls waiting for a person to approve or deny them."""
        return self._waiting_calls("approval")

    def pending_questions(self) -> list[Any]:
        """Tool calls waiting for a person's answer (``call.question`` asks it)."""
        return self._waiting_calls("question")

    def _waiting_calls(self, reason: str) -> list[Any]:
        round_ = pending_round(self.store.load_transcript())
        return [
            self.store.native_tool_call(call)
            for call in round_.unanswered
            if call.state == ToolCallState.WAITING and call.wait_reason == reason
        ]

    def _find_waiting(self, tool_call_id: Any, reason: str) -> ToolCall:
        """The waiting call named by its provider id, its store key, or a store record."""
        key = getattr(tool_call_id, "pk", tool_call_id)
        for call in pending_round(self.store.load_transcript()).unanswered:
            if call.id == key or call.key == key or str(call.key) == str(key):
                if call.state != ToolCallState.WAITING or call.wait_reason != reason:
                    raise ToolCallNotWaitingError(
                        f"Tool call {call.id!r} ({call.name}) is not waiting for "
                        f"{'an answer' if reason == 'question' else 'approval'}."
                    )
                return call
        raise ToolCallNotWaitingError(f"No pending tool call {tool_call_id!r} in this chat.")

    def approve(self, tool_call_id: Any, by: Any = None) -> None:
        """Let a call that needs approval run (at the next step), for exactly its arguments."""
        call = self._find_waiting(tool_call_id, "approval")
        self.store.record_decision(call, "approved", by=by, reason="", result=None)

    def deny(self, tool_call_id: Any, reason: str = "", by: Any = None) -> Any:
        """Refuse a call: the model gets an error result saying the user denied it."""
        call = self._find_waiting(tool_call_id, "approval")
        text = DENIED_RESULT + (f" Reason: {reason}" if reason else "")
        result = Message(
            role="tool", content=text, tool_call_id=call.id, tool_name=call.name, is_error=True
        )
        record = self.store.record_decision(call, "denied", by=by, reason=reason, result=result)
        self._emit("after_tool_result", record)
        self._emit("after_message", record)
        return record

    def answer(self, tool_call_id: Any, text: str, by: Any = None) -> Any:
        """Answer a call's question: the answer becomes the call's result."""
        call = self._find_waiting(tool_call_id, "question")
        result = Message(role="tool", content=text, tool_call_id=call.id, tool_name=call.name)
        record = self.store.record_decision(call, "answered", by=by, reason="", result=result)
        self._emit("after_tool_result", record)
        self._emit("after_message", record)
        return record

    def settle_subagent(self, tool_call_id: Any, text: str) -> bool:
        """Give a call waiting on a subagent its result; False if it wasn't waiting."""
        try:
            call = self._find_waiting(tool_call_id, "subagent")
        except ToolCallNotWaitingError:
            return False
        result = Message(role="tool", content=text, tool_call_id=call.id, tool_name=call.name)
        record = self.store.record_decision(call, "answered", by=None, reason="", result=result)
        self._emit("after_tool_result", record)
        self._emit("after_message", record)
        return True

    def tools(self) -> dict[str, type[Tool]]:
        """The chat's tools by name."""
        return {tool.name: tool for tool in self.store.get_tools()}

    # -- verbs ------------------------------------------------------------------------------
    def cancel(self) -> None:
        """Ask the run to stop at its next checkpoint; works from any thread or process."""
        self.store.request_cancel()

    def ask_later(self, content: str, attachments: Any = None) -> Conversation:
        """Add a user message; no model call. Refuses while tool calls wait for results,
        except calls left by a cancel, which are answered as cancelled first."""
        if attachments:
            raise ConfigurationError("Attachments are not supported yet.")
        round_ = pending_round(self.store.load_transcript())
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
        record = self.store.append_message(Message(role="user", content=content))
        self._emit("after_message", record)
        return self

    def generate(self, stream: StreamCallback | None = None) -> Any:
        """Exactly one model call (with retries of that call); appends and returns the answer."""
        with self._run() as checkpoints:
            return self._generate(self.store.load_transcript(), stream, checkpoints)

    def run_tools(self) -> list[Any]:
        """Run the pending tool calls and append a result for each; skips answered ones."""
        with self._run() as checkpoints:
            return self._run_tools(self.store.load_transcript(), checkpoints)

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

    def ask(self, content: str, stream: StreamCallback | None = None) -> Any:
        """``ask_later(content)`` then ``complete()``; returns the answer."""
        self.ask_later(content)
        return self.complete(stream)

    # -- internals ---------------------------------------------------------------------------
    @contextmanager
    def _run(self) -> Iterator[Checkpoints]:
        """A run: checks cancellation first; turns any CancelledError into a recorded one."""
        checkpoints = Checkpoints(self.store, float(agentloop_settings.CANCEL_POLL_INTERVAL))
        try:
            checkpoints.check()
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

    def _step(self, stream: StreamCallback | None, checkpoints: Checkpoints) -> Any:
        transcript = self.store.load_transcript()
        move = next_move(transcript)
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
            began = transcript[start].created_at if transcript else None
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

    def _generate(
        self,
        transcript: list[Message],
        stream: StreamCallback | None,
        checkpoints: Checkpoints,
    ) -> Any:
        config = self.store.get_config()
        self._check_limits(transcript, config)
        provider, model_id = providers.resolve(
            config.model or agentloop_settings.DEFAULT_MODEL, config.provider
        )
        provider_name = config.provider or providers.split_model(config.model or "", None)[0]
        request = self._request(transcript, config, model_id, stream is not None)
        retries = int(agentloop_settings.MODEL_RETRIES)
        self._emit("before_message")
        for attempt in range(retries + 1):
            checkpoints.check(force=False)  # just before the request
            state = _StreamState(self.store, checkpoints, stream, model_id)
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
                    time.sleep(_backoff(attempt, exc.retry_after))
                    checkpoints.check()
                    continue
                raise
            message = self._answer(response, transcript, model_id)
            usage = UsageRecord(
                provider=provider_name,
                model=model_id,
                status="succeeded",
                usage=response.usage,
                cost=provider.cost(model_id, response.usage),
                duration_ms=int((time.monotonic() - started) * 1000),
            )
            record = self.store.save_answer(message, usage, partial_key=state.partial_key)
            self._emit("after_message", record)
            return record
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
        if parsed is None and self.store.get_config().output_schema and response.content:
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


def _backoff(attempt: int, retry_after: float | None) -> float:
    if retry_after is not None:
        return max(0.0, min(float(retry_after), float(agentloop_settings.RETRY_BACKOFF_MAX)))
    base = float(agentloop_settings.RETRY_BACKOFF) * (2**attempt)
    # "Full jitter": spreads retries of many workers hitting the same limit.
    return min(random.uniform(0, base), float(agentloop_settings.RETRY_BACKOFF_MAX))  # noqa: S311

"""OpenTelemetry spans after the GenAI semantic conventions (``AGENTLOOP["TRACING"]``).

The engine calls this module at four points: around a verb (:func:`verb`), where a turn
starts (:func:`turn_started`), around one provider attempt (:func:`model_call`) and around
one tool execution (:func:`tool_call`). With TRACING off, or without ``opentelemetry-api``,
each of them is one cached check that returns a shared do-nothing object: no span is built.

How the spans of a turn make one trace, across processes (docs/tracing.md):

* the verb that starts a turn (``ask_later``, ``ask``, or a queued message taken by a run)
  opens the turn span ``invoke_agent {agent}``, a child of the caller's current span when
  there is one, and stores its W3C trace context on the chat (the store's
  ``set_trace_context``);
* a later verb of the same turn (``complete()``, each background job's step) opens
  ``agentloop.step`` or ``agentloop.complete`` as a child of that stored context (a span
  ends in the process that opened it, so every job has a span of its own);
* ``chat {model}`` (one per provider attempt) and ``execute_tool {name}`` are children of
  the verb's span.

Spans open lazily: a verb that does nothing (a step of a settled chat) leaves no span.
"""

from __future__ import annotations

import contextvars
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from ..conf import agentloop_settings
from ..exceptions import ToolWaiting
from ..messages import Message, ModelRequest, ModelResponse, ToolCall

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer

    from .store import ChatStore

__all__ = ["available", "carry", "model_call", "tool_call", "turn_started", "verb"]

#: the instrumentation scope's name (``otel.scope.name`` in a backend).
SCOPE = "agentloop"

#: provider names as the conventions spell them (gen_ai.provider.name); others as they are.
_PROVIDER_NAMES = {"openai-responses": "openai", "gemini": "gcp.gemini"}


class _Off:
    """What every entry point returns while tracing is off: a context and a span that do
    nothing (one shared instance, so the off path builds no object)."""

    def __enter__(self) -> _Off:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def response(self, response: ModelResponse) -> None:
        """Record a model's answer (nothing while off)."""

    def result(self, content: str) -> str:
        """Record a tool's result and return it (only returned while off)."""
        return content


_OFF = _Off()

#: (the settings object the flag was worked out for, the tracer or None when off).
_state: tuple[object, Tracer | None] = (None, None)
#: the verb running in this context (a thread, or a tool thread given it by :func:`carry`).
_VERB: contextvars.ContextVar[_Verb | None] = contextvars.ContextVar("agentloop_verb", default=None)


def available() -> bool:
    """``opentelemetry-api`` can be imported (the system check warns when it can't)."""
    try:
        # Function-local: the package is optional (the otel extra).
        import opentelemetry.trace  # noqa: F401
    except ImportError:
        return False
    return True


def _tracer() -> Tracer | None:
    """The tracer while TRACING is on (and the package is there), else None; worked out
    once per settings object (a settings change makes a new one)."""
    global _state
    values = agentloop_settings.values
    if _state[0] is not values:
        tracer = None
        if values.TRACING and available():
            # Function-local: imported only once tracing is on (the package is optional).
            from opentelemetry import trace

            tracer = trace.get_tracer(SCOPE)
        _state = (values, tracer)
    return _state[1]


# -- entry points the engine calls ------------------------------------------------------------
def verb(store: ChatStore, single: bool) -> Any:
    """A context around one verb of the chat in ``store`` (``single``: one move, else a
    ``complete``); its span opens at the verb's first traced event."""
    tracer = _tracer()
    if tracer is None:
        return _OFF
    running = _VERB.get()
    if running is not None and running.store is store:
        return _OFF  # a verb inside a verb of the same chat: the outer one traces
    return _Verb(tracer, store, single)


def turn_started(store: ChatStore, message: Message) -> None:
    """A user message started a turn of this chat: its ``invoke_agent`` span opens."""
    running = _VERB.get()
    if running is not None and running.store is store:
        running.start_turn(message)


def model_call(provider_name: str, model_id: str, request: ModelRequest) -> Any:
    """A context around one provider attempt: a ``chat {model}`` span (CLIENT)."""
    running = _VERB.get()
    if running is None:
        return _OFF
    return _ModelCall(running, provider_name, model_id, request)


def tool_call(call: ToolCall, tool_class: Any) -> Any:
    """A context around one tool execution: an ``execute_tool {name}`` span."""
    running = _VERB.get()
    if running is None:
        return _OFF
    return _ToolCall(running, call, tool_class)


def carry(function: Callable[[], Any]) -> Callable[[], Any]:
    """``function`` run in a copy of this context, for a tool thread (its span then joins
    the verb's); ``function`` itself while nothing is traced."""
    if _VERB.get() is None:
        return function
    return partial(contextvars.copy_context().run, function)


# -- spans --------------------------------------------------------------------------------------
def _otel() -> Any:
    # Function-local: reached only with tracing on, so the optional package is there.
    from opentelemetry import trace

    return trace


def _failed(span: Span, exc: BaseException) -> None:
    """Error status and ``error.type``; the message only with TRACE_CONTENT (it may quote
    what the user or the model wrote)."""
    trace = _otel()
    kind = type(exc).__qualname__
    span.set_attribute("error.type", kind)
    content = agentloop_settings.TRACE_CONTENT
    span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc) if content else kind))
    if content:
        span.record_exception(exc)


class _Verb:
    """One verb's span (opened lazily) and the labels every span of the verb carries."""

    def __init__(self, tracer: Tracer, store: ChatStore, single: bool) -> None:
        self.tracer = tracer
        self.store = store
        self.single = single
        self.span: Span | None = None
        self._outer: _Verb | None = None
        self._lock = threading.Lock()  # tools on threads may open the span together
        self.agent = ""
        #: what every span of the verb carries (worked out when its first span opens: a
        #: new persisted chat has its key only once its first message is saved).
        self.labels: dict[str, str] = {}

    def _label(self) -> None:
        if self.labels:
            return
        tracing = self.store.tracing
        chat_id, self.agent = tracing.trace_names() if tracing is not None else ("", "")
        self.labels = {"agentloop.chat.id": chat_id, "gen_ai.conversation.id": chat_id}
        if self.agent:
            self.labels["gen_ai.agent.name"] = self.agent

    def __enter__(self) -> _Verb:
        # Set and restored by value, not with a token: an async verb enters in one database
        # phase and exits in another, each run in a copy of the caller's context.
        self._outer = _VERB.get()
        _VERB.set(self)
        return self

    def __exit__(self, kind: Any, exc: BaseException | None, traceback: Any) -> None:
        _VERB.set(self._outer)
        if self.span is not None:
            if exc is not None:
                _failed(self.span, exc)
            self.span.end()

    def parent(self) -> Context:
        """The context child spans go under (the verb's span, opened now if need be)."""
        with self._lock:
            if self.span is None:
                self._open_continuation()
            assert self.span is not None
            return _otel().set_span_in_context(self.span)

    def start_turn(self, message: Message | None = None) -> None:
        """Open the turn span under the caller's current span and store its context."""
        with self._lock:
            self._open_turn(message)

    def _open_turn(self, message: Message | None) -> None:
        # Function-local: reached only with tracing on, so the optional package is there.
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        trace = _otel()
        self._label()
        if self.span is not None:
            self.span.end()  # a queued message starts the next turn within this verb
        name = f"invoke_agent {self.agent}" if self.agent else "invoke_agent"
        attributes = {"gen_ai.operation.name": "invoke_agent", **self.labels}
        if message is not None and agentloop_settings.TRACE_CONTENT:
            attributes["gen_ai.input.messages"] = _dumps(_messages([message]))
        self.span = self.tracer.start_span(
            name, kind=trace.SpanKind.INTERNAL, attributes=attributes
        )
        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(
            carrier, context=trace.set_span_in_context(self.span)
        )
        tracing = self.store.tracing
        if tracing is not None and (carrier or tracing.trace_context()):
            # (No SDK installed: no context to keep, and none to clear: no write.)
            tracing.set_trace_context(carrier)

    def _open_continuation(self) -> None:
        """A later verb of the turn: a child of the stored turn context (linked to the
        caller's current span, e.g. a Celery task span). No stored context (a chat from
        before TRACING was on): this verb's span becomes the turn's."""
        # Function-local: reached only with tracing on, so the optional package is there.
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        carrier = self.store.tracing.trace_context() if self.store.tracing is not None else {}
        if not carrier:
            self._open_turn(None)
            return
        trace = _otel()
        self._label()
        current = trace.get_current_span().get_span_context()
        links = [trace.Link(current)] if current.is_valid else None
        self.span = self.tracer.start_span(
            "agentloop.step" if self.single else "agentloop.complete",
            context=TraceContextTextMapPropagator().extract(carrier),
            kind=trace.SpanKind.INTERNAL,
            attributes=dict(self.labels),
            links=links,
        )


@dataclass(eq=False)
class _Operation:
    """The span of one operation of a verb (a provider attempt, a tool run): opened under
    the verb's span with the verb's labels, current while the operation runs."""

    running: _Verb
    span: Span | None = field(default=None, init=False)
    _outer: Any = field(default=None, init=False)

    def _open(self, operation: str, target: str, kind: Any, attributes: dict[str, Any]) -> None:
        """Open the span ``{operation} {target}`` (the conventions' name: the operation,
        then the model or the tool), ``attributes`` with the operation and the labels."""
        # Function-local: reached only with tracing on, so the optional package is there.
        from opentelemetry import context

        parent = self.running.parent()  # opens the verb's span (and its labels) if need be
        self.span = self.running.tracer.start_span(
            f"{operation} {target}",
            context=parent,
            kind=kind,
            attributes={"gen_ai.operation.name": operation, **attributes, **self.running.labels},
        )
        # Current while the operation runs, restored by value on exit (not detached with a
        # token): an async verb's driver sends the request between two database phases,
        # each run in a copy of its context.
        self._outer = context.get_current()
        context.attach(_otel().set_span_in_context(self.span))

    def _close(self, exc: BaseException | None) -> None:
        # Function-local: reached only with tracing on, so the optional package is there.
        from opentelemetry import context

        assert self.span is not None
        context.attach(self._outer)
        if exc is not None:
            _failed(self.span, exc)
        self.span.end()


@dataclass(eq=False)
class _ModelCall(_Operation):
    """``chat {model}``: one provider attempt, current while the request runs (so an HTTP
    client's own instrumentation nests under it)."""

    provider_name: str
    model_id: str
    request: ModelRequest

    def __enter__(self) -> _ModelCall:
        request = self.request
        attributes: dict[str, Any] = {
            "gen_ai.provider.name": _PROVIDER_NAMES.get(self.provider_name, self.provider_name),
            "gen_ai.request.model": self.model_id,
        }
        if request.temperature is not None:
            attributes["gen_ai.request.temperature"] = request.temperature
        if request.max_output_tokens is not None:
            attributes["gen_ai.request.max_tokens"] = request.max_output_tokens
        if agentloop_settings.TRACE_CONTENT:
            system = [m for m in request.messages if m.role == "system"]
            if system:
                attributes["gen_ai.system_instructions"] = _dumps(
                    [{"type": "text", "content": m.content} for m in system]
                )
            others = [m for m in request.messages if m.role != "system"]
            attributes["gen_ai.input.messages"] = _dumps(_messages(others))
        self._open("chat", self.model_id, _otel().SpanKind.CLIENT, attributes)
        return self

    def response(self, response: ModelResponse) -> None:
        """Record the answer: model, id, tokens, finish reason (and content when on)."""
        span = self.span
        assert span is not None
        span.set_attribute("gen_ai.response.model", response.model or self.model_id)
        response_id = response.provider_data.get("id")
        if isinstance(response_id, str) and response_id:
            span.set_attribute("gen_ai.response.id", response_id)
        usage = response.usage
        span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)
        if usage.cache_read_tokens:
            span.set_attribute("gen_ai.usage.cache_read.input_tokens", usage.cache_read_tokens)
        if usage.cache_write_tokens:
            span.set_attribute("gen_ai.usage.cache_creation.input_tokens", usage.cache_write_tokens)
        reason = response.finish_reason or ("tool_calls" if response.tool_calls else "stop")
        span.set_attribute("gen_ai.response.finish_reasons", [reason])
        if agentloop_settings.TRACE_CONTENT:
            answer = Message(
                role="assistant",
                content=response.content,
                tool_calls=response.tool_calls,
                thinking=response.thinking,
            )
            output = {**_messages([answer])[0], "finish_reason": reason}
            span.set_attribute("gen_ai.output.messages", _dumps([output]))

    def __exit__(self, kind: Any, exc: BaseException | None, traceback: Any) -> None:
        self._close(exc)


@dataclass(eq=False)
class _ToolCall(_Operation):
    """``execute_tool {name}``: one tool run, current while it runs (a subagent it starts,
    or the tool's own spans, nest under it)."""

    call: ToolCall
    tool_class: Any

    def __enter__(self) -> _ToolCall:
        call = self.call
        attributes: dict[str, Any] = {
            "gen_ai.tool.name": call.name,
            "gen_ai.tool.call.id": call.id,
            "gen_ai.tool.type": "function",
        }
        description = getattr(self.tool_class, "description", "")
        if isinstance(description, str) and description:
            attributes["gen_ai.tool.description"] = description
        if agentloop_settings.TRACE_CONTENT:
            attributes["gen_ai.tool.call.arguments"] = _dumps(call.arguments)
        self._open("execute_tool", call.name, _otel().SpanKind.INTERNAL, attributes)
        return self

    def result(self, content: str) -> str:
        """Record the tool's result (with TRACE_CONTENT) and return it."""
        if agentloop_settings.TRACE_CONTENT and self.span is not None:
            self.span.set_attribute("gen_ai.tool.call.result", content)
        return content

    def __exit__(self, kind: Any, exc: BaseException | None, traceback: Any) -> None:
        if isinstance(exc, ToolWaiting):
            # Not a failure: the call waits for a person or a subagent.
            assert self.span is not None
            self.span.set_attribute("agentloop.tool.waiting", exc.reason)
            exc = None
        self._close(exc)


# -- content (TRACE_CONTENT) --------------------------------------------------------------------
def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _messages(messages: list[Message]) -> list[dict[str, Any]]:
    """Messages in the conventions' shape: ``{"role", "parts": [...]}``, parts typed
    ``text``, ``reasoning``, ``uri``, ``tool_call`` and ``tool_call_response``. Attachments
    sent as bytes are left out (only their links are kept)."""
    shaped = []
    for message in messages:
        parts: list[dict[str, Any]] = []
        if message.role == "tool":
            parts.append(
                {"type": "tool_call_response", "id": message.tool_call_id,
                 "response": message.content}
            )  # fmt: skip
        else:
            if message.thinking:
                parts.append({"type": "reasoning", "content": message.thinking})
            if message.content:
                parts.append({"type": "text", "content": message.content})
            for call in message.tool_calls:
                parts.append(
                    {"type": "tool_call", "id": call.id, "name": call.name,
                     "arguments": call.arguments}
                )  # fmt: skip
        for attachment in message.attachments:
            if attachment.url:
                parts.append(
                    {"type": "uri", "uri": attachment.url, "mime_type": attachment.media_type,
                     "modality": "image" if attachment.kind == "image" else "document"}
                )  # fmt: skip
        shaped.append({"role": message.role, "parts": parts})
    return shaped

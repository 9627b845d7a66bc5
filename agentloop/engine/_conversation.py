"""The loop's verbs, written once over a :class:`~.store.ChatStore`, and the ``with_*``
methods that change a chat's config (:mod:`._chat_config`) through the store and return the
chat, so calls chain.

Every verb reads the transcript and decides from it alone, so a chat can be driven from any
process: ``step()`` here, ``step()`` in a Celery worker later.

A ``Conversation`` holds collaborating parts, each over the same store:
:class:`~._runs.Runs` (claims, reads, cancels), :class:`~._model_calls.ModelCalls`,
:class:`~._loop.Control` (halts, subagents), :class:`~._loop.Loop` (the verbs' bodies) and
:class:`~._loop.Editing` (edits, forks). It is its own :class:`Configuration` and
:class:`~._tool_rounds.PeopleInTheLoop` (by inheritance: their public methods are its verbs);
the engine's own entry points of its parts (``emit``, ``prepare_model_call``,
``accept_response``, ``record_cancel``) are those parts' methods, bound at construction.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Callable, Generator, Iterable
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, Self

from pydantic import BaseModel, ValidationError

from .. import providers
from ..conf import agentloop_settings
from ..exceptions import ChatBusyError, ConfigurationError, PendingToolCallsError
from ..guardrails import Guardrail, as_guardrail
from ..import_paths import import_path_of, load_by_path
from ..messages import Caching, Message, Thinking
from ..streaming import AsyncEventStream, EventStream, EventTap, FinalMessageEvent
from ..tools import Tool
from ..tools._references import made_tool
from ..tools.mcp import mcp_tools
from ._chat_config import Compaction, Limits, MemoryOptions, ToolOptions
from ._drivers import drive, drive_async, drive_pulled
from ._effects import StreamCallback
from ._loop import (
    CANCELLED_TOOL_RESULT,
    HALTED_PREFIX,
    KEEP,
    Control,
    Editing,
    Loop,
    checked_attachments,
    halt_text,
)
from ._model_calls import ModelCalls, PreparedCall
from ._runs import Callbacks, Runs
from ._tool_rounds import PeopleInTheLoop
from ._transcript_reading import MessageT, StepResult, is_complete, is_waiting
from .store import ChatStore, missing_part

if TYPE_CHECKING:
    from .store import ChatStore

__all__ = [
    "CANCELLED_TOOL_RESULT",
    "Configuration",
    "Conversation",
    "HALTED_PREFIX",
    "PreparedCall",
    "StepResult",
    "StreamCallback",
    "UNSET",
]


#: an argument not given (None is a value some arguments take); the chat model passes it on.
UNSET: Any = object()


def _as_tool_class(obj: Any) -> type[Tool]:
    """A Tool class from what users pass to ``with_tools``."""
    if isinstance(obj, type) and issubclass(obj, Tool):
        return obj
    converted = made_tool(obj, "as_tool")  # agents, and anything else that can become a tool
    if converted is not None:
        return converted
    raise ConfigurationError(
        f"{obj!r} is not a tool: pass a Tool subclass or a function decorated with @tool."
    )


def _package_name(obj: Any) -> str:
    """``billing`` for a class in ``billing.agents`` or ``billing``."""
    parts = [part for part in obj.__module__.split(".") if part not in {"agents", "tools"}]
    return parts[-1] if parts else obj.__module__.split(".")[-1]


def _agent_of(tool_class: Any) -> Any:
    """The agent behind an agent tool or a handoff tool; None for any other tool."""
    return getattr(tool_class, "agent_class", None) or getattr(tool_class, "handoff_agent", None)


def _base_name(tool_class: Any, agent: Any) -> str:
    """An agent's tool's name before any package prefix a clash gave it."""
    prefixed = tool_class.default_name(_package_name(agent))
    return str(tool_class.default_name() if tool_class.name == prefixed else tool_class.name)


def _agent_names(tool_classes: list[Any]) -> list[Any]:
    """Agent tools (and handoffs) named alike by agents of different modules
    (billing.Research, legal.Research) all take their package's name as a prefix
    ("billing_research", "legal_research"; "transfer_to_billing_research"), whatever the
    order they came in; a lone one keeps its own name."""
    agents_by_name: dict[str, set[Any]] = defaultdict(set)
    for tool_class in tool_classes:
        agent = _agent_of(tool_class)
        if agent is not None:
            agents_by_name[_base_name(tool_class, agent)].add(agent)
    named = []
    for tool_class in tool_classes:
        agent = _agent_of(tool_class)
        if agent is not None:
            base, package = _base_name(tool_class, agent), _package_name(agent)
            name = base
            if len(agents_by_name[base]) > 1:
                # The default name takes the prefix where it belongs; a given one in front.
                given = base != tool_class.default_name()
                name = f"{package}_{base}" if given else tool_class.default_name(package)
            if name != tool_class.name:
                tool_class = tool_class.renamed(name)
        named.append(tool_class)
    return named


def _as_handoff_tool(obj: Any) -> type[Tool]:
    """A handoff tool from what users pass to ``with_handoffs``: an agent (or its import
    path), or the tool ``Agent.as_handoff(...)`` made."""
    if isinstance(obj, str):
        obj = load_by_path(obj)
    if isinstance(obj, type) and issubclass(obj, Tool) and hasattr(obj, "handoff_agent"):
        return obj
    converted = made_tool(obj, "as_handoff")
    if converted is not None:
        return converted
    raise ConfigurationError(
        f"{obj!r} is not an agent: with_handoffs() takes Agent subclasses, their import "
        "paths, or the tools Agent.as_handoff() makes."
    )


class Configuration:
    """Chainable configuration; each method persists through the store and returns the chat.

    The base of ``Conversation``: it owns the chat's store and the pydantic model of a
    ``with_schema`` chat in this process."""

    def __init__(self, store: ChatStore) -> None:
        self.store = store
        self._schema_model: type[BaseModel] | None = None

    def _given_schema_model(self) -> type[BaseModel] | None:
        """The pydantic model given to ``with_schema`` in this process, if any."""
        return self._schema_model

    def with_model(self, model: str, provider: str | None = None) -> Self:
        """Use ``model`` (``"provider:model"`` or a known model id) from now on."""
        providers.split_model(model, provider)  # fail now on a model nobody can serve
        self.store.config.update_config(model=model, provider=provider)
        return self

    def with_instructions(self, text: str, append: bool = False) -> Self:
        """Set the system message (replacing earlier ones unless ``append``)."""
        if append:
            self.store.transcript.append_message(Message(role="system", content=text))
        else:
            self.store.transcript.replace_instructions(text)
        return self

    def with_tools(self, *tools: Any, replace: bool = False) -> Self:
        """Offer these tools (Tool classes, @tool functions, agents) to the model."""
        current = [] if replace else list(self.store.config.get_tools())
        by_name: dict[str, type[Tool]] = {}
        # A later tool of the same name replaces an earlier one.
        for tool_class in _agent_names([*current, *(_as_tool_class(tool) for tool in tools)]):
            by_name[tool_class.name] = tool_class
        self.store.config.set_tools(list(by_name.values()))
        return self

    def with_handoffs(self, *agents: Any) -> Self:
        """Let the model hand the conversation over to these agents: each is offered as a
        tool (``transfer_to_billing`` for ``Billing``; ``Billing.as_handoff(name=...)``
        names it yourself) whose call switches the chat to that agent from its next model
        call on (docs/handoffs.md)."""
        return self.with_tools(*(_as_handoff_tool(agent) for agent in agents))

    def with_guardrails(self, *guardrails: Any, replace: bool = False) -> Self:
        """Run these guardrails (``agentloop.guardrails``: functions decorated with
        ``@input_guardrail``, ``@output_guardrail`` or ``@tool_guardrail``, or Guardrail
        subclasses) on the chat's user messages, answers and tool calls, each stage's in the
        order given. One named like an earlier one takes its place; ``replace=True`` drops the
        earlier ones (``with_guardrails(replace=True)``: none). A persisted chat keeps their
        import paths."""
        current = [] if replace else list(self.store.config.get_guardrails())
        by_name: dict[str, Guardrail] = {}
        for guardrail in [*current, *(as_guardrail(item) for item in guardrails)]:
            by_name[guardrail.name] = guardrail
        self.store.config.set_guardrails(list(by_name.values()))
        return self

    def with_mcp(
        self,
        server: str,
        only: Iterable[str] | None = None,
        requires_approval: Iterable[str] | bool = (),
    ) -> Self:
        """Offer the tools of MCP server ``server`` (``AGENTLOOP["MCP_SERVERS"]``): all, or
        those named in ``only``; those in ``requires_approval`` wait for ``approve()``."""
        return self.with_tools(*mcp_tools(server, only=only, requires_approval=requires_approval))

    def with_tool_options(
        self,
        *,
        choice: str | None = UNSET,
        calls: str = UNSET,
        concurrency: str | int | None = UNSET,
    ) -> Self:
        """``choice`` ("auto", "none", "required" or a tool name), ``calls`` ("many" or
        "one"), ``concurrency`` (None, "threads" or a pool size)."""
        changes = {
            key: value
            for key, value in {"choice": choice, "calls": calls, "concurrency": concurrency}.items()
            if value is not UNSET
        }
        current = self.store.config.get_config().tool_options.model_dump()
        try:
            options = ToolOptions.model_validate({**current, **changes})
        except ValidationError as exc:
            raise ConfigurationError(f"Invalid tool options: {exc}") from exc
        self.store.config.update_config(tool_options=options)
        return self

    def with_temperature(self, temperature: float | None) -> Self:
        """Sampling temperature (None: the provider's default)."""
        self.store.config.update_config(temperature=temperature)
        return self

    def with_max_output_tokens(self, tokens: int | None) -> Self:
        """Cap the length of each answer."""
        self.store.config.update_config(max_output_tokens=tokens)
        return self

    def with_provider_options(self, **options: Any) -> Self:
        """Raw request fields merged into what the provider is sent."""
        merged = {**self.store.config.get_config().provider_options, **options}
        self.store.config.update_config(provider_options=merged)
        return self

    def with_headers(self, **headers: str) -> Self:
        """Extra HTTP headers for the provider (stored with the chat: no secrets)."""
        merged = {**self.store.config.get_config().headers, **headers}
        self.store.config.update_config(headers=merged)
        return self

    def with_schema(self, schema: type[BaseModel] | dict[str, Any] | None) -> Self:
        """Ask for structured output; answers are parsed into ``message.parsed``."""
        if schema is None:
            self._schema_model = None
            self.store.config.update_config(output_schema=None, schema_path=None)
        elif isinstance(schema, dict):
            self._schema_model = None
            self.store.config.update_config(output_schema=schema, schema_path=None)
        elif isinstance(schema, type) and issubclass(schema, BaseModel):
            self._schema_model = schema
            try:
                path: str | None = import_path_of(schema)
            except ConfigurationError:
                path = None  # parsed in this process only; elsewhere as plain JSON
            self.store.config.update_config(
                output_schema=schema.model_json_schema(), schema_path=path
            )
        else:
            raise ConfigurationError("with_schema() takes a pydantic model class or a JSON schema")
        return self

    def with_caching(self, ttl: str | None = "5m", key: str | None = None) -> Self:
        """Prompt caching: Anthropic breakpoints kept ``ttl`` ("5m" or "1h"), OpenAI's
        ``prompt_cache_key`` (``key``, else one made for this chat and kept); None: off."""
        if ttl is None:
            self.store.config.update_config(caching=None)
            return self
        current = self.store.config.get_config().caching
        key = key or (current.key if current else None) or f"agentloop-{uuid.uuid4().hex}"
        try:
            caching = Caching(ttl=ttl, key=key)
        except ValidationError:
            raise ConfigurationError(
                f"with_caching() takes ttl='5m' or ttl='1h' (or None), not {ttl!r}"
            ) from None
        self.store.config.update_config(caching=caching)
        return self

    def with_thinking(
        self, effort: str | None = "medium", budget_tokens: int | None = None
    ) -> Self:
        """Let the model think: ``effort`` "low", "medium" or "high" (None: off), or a
        ``budget_tokens`` budget where the provider takes one."""
        try:
            thinking = Thinking(effort=effort, budget_tokens=budget_tokens)
        except ValidationError:
            raise ConfigurationError(
                "with_thinking() takes effort 'low', 'medium', 'high' or None and a positive "
                f"budget_tokens, not effort={effort!r}, budget_tokens={budget_tokens!r}"
            ) from None
        self.store.config.update_config(thinking=thinking)
        return self

    def with_context_window(self, tokens: int | None) -> Self:
        """The model's context window in tokens, overriding the catalog's (None: the catalog's)."""
        if tokens is not None and (
            isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1
        ):
            raise ConfigurationError(
                f"with_context_window() takes a positive number of tokens, not {tokens!r}"
            )
        self.store.config.update_config(context_window=tokens)
        return self

    def with_compaction(
        self, at: float | None = 0.8, keep_recent: int = 8, model: str | None = None
    ) -> Self:
        """Summarise the older messages before a model call once the estimated input passes
        ``at`` x the context window, keeping the last ``keep_recent``; ``at=None``: off."""
        if at is None:
            self.store.config.update_config(compaction=None)
            return self
        if model is not None:
            providers.split_model(model)  # fail now on a model nobody can serve
        try:
            compaction = Compaction(at=at, keep_recent=keep_recent, model=model)
        except ValidationError:
            raise ConfigurationError(
                "with_compaction() takes 0 < at <= 1 and keep_recent >= 1, not "
                f"at={at!r}, keep_recent={keep_recent!r}"
            ) from None
        self.store.config.update_config(compaction=compaction)
        return self

    def with_memory(
        self,
        k: int | None = 5,
        *,
        min_similarity: float = 0.0,
        max_tokens: int = 500,
        per_agent: bool = False,
        working: bool = False,
        model: str | None = None,
    ) -> Self:
        """Before each model call, give the model the ``k`` memories (``agentloop.memory``)
        of the chat's subject nearest its latest user message, none less similar than
        ``min_similarity`` (cosine, -1 to 1), their text within about ``max_tokens``;
        ``per_agent``: only those of the chat's agent; ``working``: the subject's working
        memory too; ``model``: the embedding model (the memories' own). ``k=None``: off.
        The memories go with the instructions, marked as data (docs/memory.md)."""
        if k is None:
            self.store.config.update_config(memory=None)
            return self
        if self.store.memory is None:
            raise ConfigurationError(missing_part(self.store, "memory", "no memories across chats"))
        try:
            options = MemoryOptions(
                k=k,
                min_similarity=min_similarity,
                max_tokens=max_tokens,
                per_agent=per_agent,
                working=working,
                model=model,
            )
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, error['loc']))}: {error['msg']}" for error in exc.errors()
            )
            raise ConfigurationError(f"with_memory(): {problems}") from None
        if model is not None:
            providers.split_model(model)  # fail now on a model nobody can serve
        self.store.config.update_config(memory=options)
        return self

    def with_fallbacks(self, *models: str) -> Self:
        """Models to try, in order, when a call fails in a way retrying can't fix in the step
        (server errors, overload, rate limits, context length); none: no fallbacks."""
        for model in models:
            providers.split_model(model)  # fail now on a model nobody can serve
        self.store.config.update_config(fallbacks=list(models))
        return self

    def with_limits(self, **limits: Any) -> Self:
        """Per-turn budgets: ``max_model_calls``, ``max_tool_calls``, ``max_seconds``,
        ``max_cost``. Given keys replace earlier values; pass None to remove one."""
        current = self.store.config.get_config().limits.model_dump()
        try:
            merged = Limits.model_validate({**current, **limits})
        except ValidationError as exc:
            raise ConfigurationError(f"Invalid limits: {exc}") from exc
        if merged.max_cost is not None and self.store.costs is None:
            raise ConfigurationError(
                f"max_cost needs a store that sums a turn's costs; {type(self.store).__name__} "
                "doesn't (store.costs is None)."
            )
        self.store.config.update_config(limits=merged)
        return self


class Conversation(Configuration, PeopleInTheLoop, Generic[MessageT]):
    """A chat's verbs and configuration over a store.

    ``agentloop.chat()`` returns one over a :class:`~.in_memory_store.MemoryStore`; the
    persisted ``Chat`` model drives one over the Django store.
    """

    #: Send a conversation event to its callbacks (for workers acting for the chat):
    #: ``emit(event, *args)``, the callbacks' own.
    emit: Callable[..., None]
    #: What ``generate()`` would send, without sending it (batches use this):
    #: ``prepare_model_call(transcript=None, *, stream=False, check_limits=True)``, see
    #: :meth:`._model_calls.ModelCalls.prepare_model_call`.
    prepare_model_call: Callable[..., PreparedCall]
    #: Append the answer to a prepared call, with its usage row, as ``generate()`` does:
    #: ``accept_response(prepared, response, *, cost=None, duration_ms=None,
    #: partial_key=None, release_after=())``, see :meth:`._model_calls.ModelCalls.accept_response`.
    accept_response: Callable[..., Any]
    #: Record a cancel observed outside a verb (a batch poller): ``record_cancel(exc, *,
    #: usage=None, unanswered=None)``, see :meth:`._runs.Runs.record_cancel`.
    record_cancel: Callable[..., None]

    def __init__(self, store: ChatStore, *, owner: Any = None, listener: object = None) -> None:
        super().__init__(store)
        #: what tools see as ``self.context.chat``: the persisted chat, or this object.
        self.owner = owner if owner is not None else self
        # One object hearing every event it has a method for (a persisted chat's signals and
        # hooks), before the callbacks given to ``on()``.
        self._callbacks = Callbacks(listener)
        self._runs = Runs(store, self._callbacks)
        self._calls = ModelCalls(
            store,
            self._callbacks,
            record_cancel=self._runs.record_cancel,
            schema_model=self._given_schema_model,
            owner=self.owner,
        )
        self._control = Control(store, self._callbacks)
        self._emit = self.emit = self._callbacks.emit
        self.prepare_model_call = self._calls.prepare_model_call
        self.accept_response = self._calls.accept_response
        self.record_cancel = self._runs.record_cancel
        self._loop = Loop(
            store, self._callbacks, self._runs, self._calls, self._control, owner=self.owner
        )
        self._editing = Editing(store, self._callbacks, self._runs, self._loop)

    def __repr__(self) -> str:
        return f"<Conversation model={self.store.config.get_config().model!r}>"

    # -- callbacks ----------------------------------------------------------------------
    def on(self, event: str, callback: Callable[..., Any]) -> Self:
        """Call ``callback`` on ``event`` (a callback name, "cancelled", "stopped", "halted",
        "guardrail_blocked")."""
        self._callbacks.add(event, callback)
        return self

    def before_message(self, callback: Callable[[], Any]) -> Self:
        """Call ``callback()`` before each model call."""
        return self.on("before_message", callback)

    def after_message(self, callback: Callable[[Any], Any]) -> Self:
        """Call ``callback(message)`` after each message is added (user, assistant, tool)."""
        return self.on("after_message", callback)

    def before_tool_call(self, callback: Callable[[Any], Any]) -> Self:
        """Call ``callback(tool_call)`` before each tool runs."""
        return self.on("before_tool_call", callback)

    def after_tool_result(self, callback: Callable[[Any], Any]) -> Self:
        """Call ``callback(result_message)`` after each tool result is saved."""
        return self.on("after_tool_result", callback)

    # -- reading --------------------------------------------------------------------------
    @property
    def messages(self) -> list[Message]:
        """The transcript (engine messages, read fresh)."""
        return self.store.transcript.load_transcript()

    def is_complete(self) -> bool:
        """Settled: the latest answer asked for no tools (or there is nothing yet)."""
        return is_complete(self.store.transcript.load_transcript())

    def is_waiting(self) -> bool:
        """A pending tool call is held by an approval, a question or a subagent."""
        return is_waiting(self.store.transcript.load_transcript())

    def tools(self) -> dict[str, type[Tool]]:
        """The chat's tools by name."""
        return {tool.name: tool for tool in self.store.config.get_tools()}

    # -- verbs ------------------------------------------------------------------------------
    def cancel(self) -> bool:
        """Ask the run to stop at its next checkpoint; works from any thread or process.

        True when a run was in progress, queued or waiting for a person; False (and nothing
        is set) when there was none, so a later message never inherits the cancel. A chat
        that waits for a person, which no run holds, has no run to see the flag: its held
        calls are cancelled at once (``cancel_waiting``)."""
        if not self.store.stopping.request_cancel():
            return False
        self.cancel_waiting()
        return True

    def ask_later(
        self, content: str, attachments: Any = None, *, if_busy: str | None = None
    ) -> Self:
        """Add a user message; no model call. Refuses while tool calls wait for results,
        except calls left by a cancel, which are answered as cancelled first.

        ``attachments``: an :class:`~agentloop.attachments.Attachment`, an http(s) or
        ``data:`` URL, a ``pathlib.Path``, or a list of them (``AttachmentError`` when one
        can't be sent; checked before anything is written).

        ``if_busy`` (default ``AGENTLOOP["IF_BUSY"]``), for a chat another run holds:
        "reject" raises ``ChatBusyError``; "queue" keeps the message and it is added and
        answered, in order, after the current run; "interrupt" cancels the current run at its
        next checkpoint, then answers the message. Over a store that keeps no queue
        (``store.inbox`` None) only "reject" applies."""
        mode = if_busy or agentloop_settings.IF_BUSY
        if mode not in ("reject", "queue", "interrupt"):
            raise ConfigurationError(
                f"if_busy must be 'reject', 'queue' or 'interrupt', not {mode!r}."
            )
        inbox = self.store.inbox
        if inbox is None:
            if if_busy not in (None, "reject"):
                raise ConfigurationError(
                    f"if_busy={if_busy!r} needs a store that queues messages; "
                    f"{type(self.store).__name__} doesn't (store.inbox is None)."
                )
            mode = "reject"  # the project's default can't apply to this store
        files = checked_attachments(attachments)
        try:
            with self._runs.scope(single=True) as run:
                self._loop.ask_later(run, content, files)
        except (ChatBusyError, PendingToolCallsError) as exc:
            # Between two jobs of a background run no one holds the chat, but the run is on:
            # its pending calls are not a reason to refuse a message that can wait its turn.
            if mode == "reject" or inbox is None:
                raise
            between_jobs = isinstance(exc, PendingToolCallsError) and inbox.run_in_progress()
            if not (isinstance(exc, ChatBusyError) or between_jobs):
                raise
            if mode == "interrupt":
                self.cancel()
            inbox.queue_message(Message(role="user", content=content, attachments=files))
        return self

    def generate(self, stream: StreamCallback | None = None) -> MessageT:
        """Exactly one model call (with retries of that call); appends and returns the answer."""
        return drive(self._loop.generating(stream), self.store)

    def run_tools(self) -> list[MessageT]:
        """Run the pending tool calls and append a result for each; skips answered ones."""
        return drive(self._loop.running_tools(), self.store)

    def step(self, stream: StreamCallback | None = None) -> MessageT | None:
        """Do the next move: run pending tools, else call the model. None when settled or
        waiting. Returns the last message added."""
        return self.advance(stream).message

    def advance(self, stream: StreamCallback | None = None) -> StepResult:
        """``step()``, returning what happened and what comes next (``StepResult``): what a
        background worker runs, one per job, without reading the transcript again."""
        return drive(self._loop.advancing(stream), self.store)

    def complete(self, stream: StreamCallback | None = None) -> MessageT:
        """Step until settled or waiting; returns the last message."""
        return drive(self._loop.completing(stream), self.store)

    def ask(
        self, content: str, stream: StreamCallback | None = None, *, attachments: Any = None
    ) -> MessageT:
        """``ask_later(content, attachments)`` then ``complete()``; returns the answer."""
        return drive(self._loop.completing(stream, (content, attachments)), self.store)

    # -- iterated runs: ask() and complete() as their events (docs/streaming.md) ------------
    def stream(
        self, content: str | None = None, *, attachments: Any = None
    ) -> EventStream[MessageT]:
        """``ask(content)`` as an iterator of its events (with no ``content``: ``complete()``,
        the run picking up where the chat is): text and thinking pieces as they stream, each
        tool call the model asked for, each tool result, then the last message
        (``agentloop.streaming``). The run starts at the first ``next()`` and goes on in
        this thread between events. Closing the stream early (a ``break``, ``close()``, the
        end of a ``with`` block) cancels the run as ``cancel()`` would."""
        tap = EventTap()
        return EventStream(self._streamed(tap, self._asked(content, attachments)))

    def astream(
        self, content: str | None = None, *, attachments: Any = None
    ) -> AsyncEventStream[MessageT]:
        """``stream()`` for async code: ``async for event in chat.astream(...)``; the run
        goes on as a task of this event loop, at most a chunk ahead of you."""
        asked = self._asked(content, attachments)

        async def start(tap: EventTap, on_chunk: StreamCallback) -> MessageT:
            with self._callbacks.listening(tap.listen):
                return await drive_async(self._loop.completing(on_chunk, asked), self.store)

        # Closed before the run ended: the run stops at its next checkpoint, as at a cancel().
        stop = partial(self.store.run_phase, self.store.stopping.request_cancel)
        return AsyncEventStream(start, stop)

    def _asked(self, content: str | None, attachments: Any) -> tuple[str, Any] | None:
        """What a stream asks (None: it completes), its attachments checked now."""
        if content is None:
            if attachments is not None:
                raise ConfigurationError("stream() takes attachments with a message only.")
            return None
        return content, checked_attachments(attachments)

    def _streamed(self, tap: EventTap, asked: tuple[str, Any] | None) -> Generator[Any, None, None]:
        with self._callbacks.listening(tap.listen):
            effects = self._loop.completing(tap.on_chunk, asked)
            message = yield from drive_pulled(effects, self.store, tap)
        if not tap.closed:
            yield FinalMessageEvent(message)

    # -- the async twins: the same effects, driven by ``drive_async`` -----------------------
    # The decisions and database phases are the sync verb's own, run with
    # ``ChatStore.run_phase``; the model request, backoffs and ``async def`` tools are awaited.
    async def agenerate(self, stream: StreamCallback | None = None) -> MessageT:
        """``generate()`` for async code; ``stream`` may be sync or ``async def``."""
        return await drive_async(self._loop.generating(stream), self.store)

    async def arun_tools(self) -> list[MessageT]:
        """``run_tools()`` for async code: ``async def`` tools are awaited on this loop,
        sync tools run on a thread."""
        return await drive_async(self._loop.running_tools(), self.store)

    async def astep(self, stream: StreamCallback | None = None) -> MessageT | None:
        """``step()`` for async code."""
        return (await self.aadvance(stream)).message

    async def aadvance(self, stream: StreamCallback | None = None) -> StepResult:
        """``advance()`` for async code."""
        return await drive_async(self._loop.advancing(stream), self.store)

    async def acomplete(self, stream: StreamCallback | None = None) -> MessageT:
        """``complete()`` for async code."""
        return await drive_async(self._loop.completing(stream), self.store)

    async def aask(
        self, content: str, stream: StreamCallback | None = None, *, attachments: Any = None
    ) -> MessageT:
        """``ask()`` for async code; returns the answer."""
        return await drive_async(self._loop.completing(stream, (content, attachments)), self.store)

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

    # -- editing (``Editing`` in :mod:`._loop`; docs/editing.md) -----------------------------------
    def regenerate(self, stream: StreamCallback | None = None) -> MessageT:
        """A new answer to the last user message, run here: that message is asked again (a
        copy of it starts a new turn, with fresh limits) and it and every row after it are
        marked superseded: kept, with their usage rows, never sent again. Calls among them
        that had no result are cancelled and never run (a subagent they wait for is
        stopped). Returns the new answer. ``ChatBusyError`` while a run holds the chat or is
        queued for it (cancel it first); ``EditError`` when there is no user message."""
        return drive(self._editing.replacing(None, None, None, stream), self.store)

    def regenerate_later(self) -> Self:
        """``regenerate()`` without the model call: the last user message is asked again
        and the replaced rows superseded; ``complete_later()`` (or ``complete()``) answers it."""
        self._editing.replace_later(None, None, None)
        return self

    def edit(
        self,
        message: Any,
        text: str,
        stream: StreamCallback | None = None,
        *,
        attachments: Any = KEEP,
    ) -> MessageT:
        """Replace a user message (a record, a Message or its key) with ``text`` and run
        from there: it and every row after it are superseded (kept, never sent again), the
        edited message is added as a new turn and answered here. ``attachments`` default to
        the original's (None or [] for none). Returns the answer. The same refusals as
        ``regenerate()``, and ``EditError`` for a message that isn't a current user message."""
        files = self._editing.checked(text, attachments)
        return drive(self._editing.replacing(message, text, files, stream), self.store)

    def edit_later(self, message: Any, text: str, *, attachments: Any = KEEP) -> Self:
        """``edit()`` without the model call; ``complete_later()`` answers it."""
        self._editing.replace_later(message, text, self._editing.checked(text, attachments))
        return self

    def fork(self, at: Any = None) -> Any:
        """A new chat with this one's configuration, tools and owner and copies of its
        messages up to and including ``at`` (a message, its record or key; None: the
        latest), linked to this chat and that message. Usage rows stay with this chat.

        A call whose result comes after ``at`` is copied with the error result "Not run: the
        conversation was forked before this call had a result." (so the fork never repeats
        a tool its origin may have run). Writes nothing here, so a chat that is running can
        be forked. Returns the new chat: a ``Chat`` for a persisted chat, a
        ``Conversation`` in memory (callbacks are not copied)."""
        return self._editing.fork(at, type(self))

    async def aregenerate(self, stream: StreamCallback | None = None) -> MessageT:
        """``regenerate()`` for async code."""
        return await drive_async(self._editing.replacing(None, None, None, stream), self.store)

    async def aregenerate_later(self) -> Self:
        """``regenerate_later()`` for async code."""
        await self.store.run_phase(self.regenerate_later)
        return self

    async def aedit(
        self,
        message: Any,
        text: str,
        stream: StreamCallback | None = None,
        *,
        attachments: Any = KEEP,
    ) -> MessageT:
        """``edit()`` for async code."""
        files = self._editing.checked(text, attachments)
        return await drive_async(self._editing.replacing(message, text, files, stream), self.store)

    async def aedit_later(self, message: Any, text: str, *, attachments: Any = KEEP) -> Self:
        """``edit_later()`` for async code."""
        await self.store.run_phase(partial(self.edit_later, message, text, attachments=attachments))
        return self

    async def afork(self, at: Any = None) -> Any:
        """``fork()`` for async code."""
        return await self.store.run_phase(partial(self.fork, at))

    # -- people in the loop: pending_approvals(), approve(), deny()... are PeopleInTheLoop's
    #    (:mod:`._tool_rounds`), this class's base. ------------------------------------------------

    # -- control -------------------------------------------------------------------------------
    def halt(self, reason: str) -> bool:
        """Stop the run after its current tool round, before its next model call; works
        from a tool, a callback, another thread or another process.

        The chat is stopped with ``stop_reason`` "halted: <reason>" and "halted" is sent
        (nothing is cancelled; the next message goes on normally). True when a run was in
        progress or queued; False, and nothing set, when none was."""
        return self.store.stopping.request_halt(halt_text(reason))

    def cancel_waiting(self) -> bool:
        """Apply a cancel now to a chat that waits (for a person, or a subagent) and that no
        run holds or is queued to run, since none would come back to see the flag: the calls
        of its round held for approval, a question or a deferred result (or not started) are
        answered as cancelled, each only if still undecided (a decision that got there first
        stands, a later one gets ``DecisionConflictError``); the flag is cleared, a waiting
        chat becomes idle, and "cancelled" is sent (calls held by subagents are settled by
        the subagents' own cancel). False, with nothing done, when no call waits or a run
        holds the chat or is queued to run it: its next checkpoint applies the cancel."""
        records = self.store.stopping.cancel_held(CANCELLED_TOOL_RESULT)
        if records is None:
            return False
        for record in records:
            self._callbacks.emit("after_tool_result", record)
            self._callbacks.emit("after_message", record)
        self._callbacks.emit("cancelled")
        return True

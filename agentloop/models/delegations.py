"""``ConversationDelegations``: the chat methods that only pass through to ``chat.conversation``.

Each does what the ``Conversation`` method of the same name does, with the same parameters;
where the engine's method returns the conversation (configuration, callbacks, ``ask_later``)
the chat's returns the chat. The verbs that do more for a persisted chat (``cancel``, the
people-in-the-loop decisions, ``complete_later``...) stay on ``AbstractChat``.
tests/test_chat_delegations.py holds both lists to ``Conversation``'s public methods.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Self

from ..engine.configuring import UNSET
from ..engine.editing import KEEP

if TYPE_CHECKING:
    from pydantic import BaseModel

    from ..engine import Conversation, StreamCallback
    from .messages import AbstractMessage

__all__ = ["ConversationDelegations"]


class ConversationDelegations:
    """Configuration, callbacks, verbs and reads of a chat, done by its ``Conversation``."""

    if TYPE_CHECKING:

        @property
        # AbstractChat's, one per instance.
        def conversation(self) -> Conversation[AbstractMessage]: ...

    # configuration (each persists and returns the chat)
    def with_model(self, model: str, provider: str | None = None) -> Self:
        """Use ``model`` (``"provider:model"`` or a known model id) from now on."""
        self.conversation.with_model(model, provider)
        return self

    def with_instructions(self, text: str, append: bool = False) -> Self:
        """Set the system message (replacing earlier ones unless ``append``)."""
        self.conversation.with_instructions(text, append)
        return self

    def with_tools(self, *tools: Any, replace: bool = False) -> Self:
        """Offer these tools (Tool classes, @tool functions, agents) to the model."""
        self.conversation.with_tools(*tools, replace=replace)
        return self

    def with_handoffs(self, *agents: Any) -> Self:
        """Offer handoffs to these agents (``transfer_to_<name>`` tools); docs/handoffs.md."""
        self.conversation.with_handoffs(*agents)
        return self

    def with_guardrails(self, *guardrails: Any, replace: bool = False) -> Self:
        """Run these guardrails on the chat's user messages, answers and tool calls, kept by
        import path (``agentloop.guardrails``; docs/guardrails.md)."""
        self.conversation.with_guardrails(*guardrails, replace=replace)
        return self

    def with_mcp(
        self,
        server: str,
        only: Iterable[str] | None = None,
        requires_approval: Iterable[str] | bool = (),
    ) -> Self:
        """Offer an MCP server's tools (all, or those in ``only``); see agentloop.tools.mcp."""
        self.conversation.with_mcp(server, only=only, requires_approval=requires_approval)
        return self

    def with_tool_options(
        self,
        *,
        choice: str | None = UNSET,
        calls: str = UNSET,
        concurrency: str | int | None = UNSET,
    ) -> Self:
        """``choice``, ``calls`` and ``concurrency`` of tool calls; an option not given keeps
        its current value."""
        self.conversation.with_tool_options(choice=choice, calls=calls, concurrency=concurrency)
        return self

    def with_temperature(self, temperature: float | None) -> Self:
        """Sampling temperature (None: the provider's default)."""
        self.conversation.with_temperature(temperature)
        return self

    def with_max_output_tokens(self, tokens: int | None) -> Self:
        """Cap the length of each answer."""
        self.conversation.with_max_output_tokens(tokens)
        return self

    def with_provider_options(self, **options: Any) -> Self:
        """Raw request fields merged into what the provider is sent."""
        self.conversation.with_provider_options(**options)
        return self

    def with_headers(self, **headers: str) -> Self:
        """Extra HTTP headers for the provider (stored with the chat: no secrets)."""
        self.conversation.with_headers(**headers)
        return self

    def with_schema(self, schema: type[BaseModel] | dict[str, Any] | None) -> Self:
        """Ask for structured output; answers are parsed into ``message.parsed``."""
        self.conversation.with_schema(schema)
        return self

    def with_caching(self, ttl: str | None = "5m", key: str | None = None) -> Self:
        """Prompt caching kept ``ttl`` ("5m" or "1h"), under ``key``; None: off."""
        self.conversation.with_caching(ttl, key)
        return self

    def with_thinking(
        self, effort: str | None = "medium", budget_tokens: int | None = None
    ) -> Self:
        """Let the model think: ``effort`` "low", "medium" or "high" (None: off)."""
        self.conversation.with_thinking(effort, budget_tokens)
        return self

    def with_context_window(self, tokens: int | None) -> Self:
        """The model's context window in tokens, overriding the catalog's."""
        self.conversation.with_context_window(tokens)
        return self

    def with_compaction(
        self, at: float | None = 0.8, keep_recent: int = 8, model: str | None = None
    ) -> Self:
        """Summarise older messages once the input passes ``at`` x the window (None: off)."""
        self.conversation.with_compaction(at, keep_recent, model)
        return self

    def with_fallbacks(self, *models: str) -> Self:
        """Models to try, in order, when a call fails in a way retrying can't fix."""
        self.conversation.with_fallbacks(*models)
        return self

    def with_limits(self, **limits: Any) -> Self:
        """Per-turn budgets (``max_model_calls``, ``max_tool_calls``, ``max_seconds``...)."""
        self.conversation.with_limits(**limits)
        return self

    # callbacks (this instance only; signals reach every chat)
    def before_message(self, callback: Callable[[], Any]) -> Self:
        """Call ``callback()`` before each model call."""
        self.conversation.before_message(callback)
        return self

    def after_message(self, callback: Callable[[Any], Any]) -> Self:
        """Call ``callback(message)`` after each message is added."""
        self.conversation.after_message(callback)
        return self

    def before_tool_call(self, callback: Callable[[Any], Any]) -> Self:
        """Call ``callback(tool_call)`` before each tool runs."""
        self.conversation.before_tool_call(callback)
        return self

    def after_tool_result(self, callback: Callable[[Any], Any]) -> Self:
        """Call ``callback(result_message)`` after each tool result is saved."""
        self.conversation.after_tool_result(callback)
        return self

    # verbs
    def ask_later(
        self, content: str, attachments: Any = None, *, if_busy: str | None = None
    ) -> Self:
        """Add a user message; no model call. ``if_busy``: what to do while another run
        holds the chat ("reject", "queue", "interrupt"; default ``AGENTLOOP["IF_BUSY"]``)."""
        self.conversation.ask_later(content, attachments, if_busy=if_busy)
        return self

    def ask(
        self, content: str, stream: StreamCallback | None = None, *, attachments: Any = None
    ) -> AbstractMessage:
        """``ask_later`` then ``complete``; returns the answer (a ``Message``)."""
        return self.conversation.ask(content, stream, attachments=attachments)

    def generate(self, stream: StreamCallback | None = None) -> AbstractMessage:
        """One model call; returns the saved assistant ``Message``."""
        return self.conversation.generate(stream)

    def run_tools(self) -> list[AbstractMessage]:
        """Run pending tool calls; returns the saved tool ``Message`` rows."""
        return self.conversation.run_tools()

    def step(self, stream: StreamCallback | None = None) -> AbstractMessage | None:
        """The next move, or None when complete or waiting."""
        return self.conversation.step(stream)

    def complete(self, stream: StreamCallback | None = None) -> AbstractMessage:
        """Step until complete or waiting; returns the last ``Message``."""
        return self.conversation.complete(stream)

    def halt(self, reason: str) -> bool:
        """Stop the run after its current tool round, before its next model call: the chat
        becomes ``stopped`` with ``stop_reason`` "halted: <reason>" (not a cancel).

        True when a run was in progress or queued; False, and nothing set, when none was."""
        return self.conversation.halt(reason)

    # async twins: the same verbs for async code (views under ASGI, Channels consumers)
    async def aask_later(
        self, content: str, attachments: Any = None, *, if_busy: str | None = None
    ) -> Self:
        """``ask_later`` for async code."""
        await self.conversation.aask_later(content, attachments, if_busy=if_busy)
        return self

    async def aask(
        self, content: str, stream: StreamCallback | None = None, *, attachments: Any = None
    ) -> AbstractMessage:
        """``ask`` for async code; ``stream`` may be sync or ``async def``."""
        return await self.conversation.aask(content, stream, attachments=attachments)

    async def agenerate(self, stream: StreamCallback | None = None) -> AbstractMessage:
        """``generate`` for async code."""
        return await self.conversation.agenerate(stream)

    async def arun_tools(self) -> list[AbstractMessage]:
        """``run_tools`` for async code (``async def`` tools awaited, sync ones on a thread)."""
        return await self.conversation.arun_tools()

    async def astep(self, stream: StreamCallback | None = None) -> AbstractMessage | None:
        """``step`` for async code."""
        return await self.conversation.astep(stream)

    async def acomplete(self, stream: StreamCallback | None = None) -> AbstractMessage:
        """``complete`` for async code."""
        return await self.conversation.acomplete(stream)

    # editing (docs/editing.md): replaced rows are superseded, kept, never sent again
    def regenerate(self, stream: StreamCallback | None = None) -> AbstractMessage:
        """A new answer to the last user message, here; the replaced rows are superseded."""
        return self.conversation.regenerate(stream)

    def regenerate_later(self) -> Self:
        """``regenerate()`` without the model call; ``complete_later()`` answers."""
        self.conversation.regenerate_later()
        return self

    def edit(
        self,
        message: Any,
        text: str,
        stream: StreamCallback | None = None,
        *,
        attachments: Any = KEEP,
    ) -> AbstractMessage:
        """Replace a user message with ``text`` and answer it here; later rows superseded."""
        return self.conversation.edit(message, text, stream, attachments=attachments)

    def edit_later(self, message: Any, text: str, *, attachments: Any = KEEP) -> Self:
        """``edit()`` without the model call; ``complete_later()`` answers."""
        self.conversation.edit_later(message, text, attachments=attachments)
        return self

    def fork(self, at: Any = None) -> Any:
        """A new chat (``Chat``) with copies of the messages up to ``at`` (None: all), linked
        to this one (``forked_from``); usage rows stay here."""
        return self.conversation.fork(at)

    async def aregenerate(self, stream: StreamCallback | None = None) -> AbstractMessage:
        """``regenerate`` for async code."""
        return await self.conversation.aregenerate(stream)

    async def aregenerate_later(self) -> Self:
        """``regenerate_later`` for async code."""
        await self.conversation.aregenerate_later()
        return self

    async def aedit(
        self,
        message: Any,
        text: str,
        stream: StreamCallback | None = None,
        *,
        attachments: Any = KEEP,
    ) -> AbstractMessage:
        """``edit`` for async code."""
        return await self.conversation.aedit(message, text, stream, attachments=attachments)

    async def aedit_later(self, message: Any, text: str, *, attachments: Any = KEEP) -> Self:
        """``edit_later`` for async code."""
        await self.conversation.aedit_later(message, text, attachments=attachments)
        return self

    async def afork(self, at: Any = None) -> Any:
        """``fork`` for async code."""
        return await self.conversation.afork(at)

    # reads
    def is_complete(self) -> bool:
        """Settled: the latest answer asked for no tools (or there is nothing yet)."""
        return self.conversation.is_complete()

    def is_waiting(self) -> bool:
        """A pending tool call is held by an approval, a question or a subagent."""
        return self.conversation.is_waiting()

    async def ais_complete(self) -> bool:
        """``is_complete`` for async code."""
        return await self.conversation.ais_complete()

    async def ais_waiting(self) -> bool:
        """``is_waiting`` for async code."""
        return await self.conversation.ais_waiting()

    def pending_results(self) -> list[Any]:
        """Calls of deferred tools waiting for their result from outside."""
        return self.conversation.pending_results()

"""The chat model's verbs are its ``Conversation``'s: ``chat.ask(...)`` is
``chat.conversation.ask(...)``, with no method written twice (issue 39).

``ConversationDelegations`` lists them, one line each: a :class:`Verb` answers with the
conversation's method itself (what it returns, the chat's records), a :class:`ChainedVerb`
(configuration, callbacks, ``ask_later``...: the engine's returns the conversation) returns
the chat instead. On the class, each is the ``Conversation`` method (its signature and
docstring, for ``help()`` and the docs). The verbs that do more for a persisted chat
(``cancel``, the people-in-the-loop decisions, ``complete_later``...) are ``AbstractChat``'s
own. tests/test_chat_delegations.py holds the lists to ``Conversation``'s public methods.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from ..engine import Conversation

__all__ = ["AsyncChainedVerb", "ChainedVerb", "ConversationDelegations", "Verb"]

P = ParamSpec("P")
R = TypeVar("R")
ChatT = TypeVar("ChatT")

if TYPE_CHECKING:
    from .message import AbstractMessage  # (at run time: models.message imports the chat)

    #: the conversation a persisted chat drives (its methods return the chat's records).
    Engine = Conversation[AbstractMessage]
else:
    Engine = Conversation


class Verb(Generic[P, R]):
    """A chat verb that is its conversation's method of the same name."""

    def __init__(self, method: Callable[Concatenate[Any, P], R]) -> None:
        self.method = method
        self.name = method.__name__

    @overload
    def __get__(self, chat: None, owner: type) -> Callable[Concatenate[Any, P], R]: ...
    @overload
    def __get__(self, chat: object, owner: type) -> Callable[P, R]: ...
    def __get__(self, chat: Any, owner: type) -> Callable[..., R]:
        if chat is None:
            return self.method
        bound: Callable[P, R] = getattr(chat.conversation, self.name)
        return bound


class ChainedVerb(Generic[P]):
    """A chat verb that calls its conversation's method of the same name and returns the chat
    (the engine's returns the conversation), so calls chain on the chat."""

    def __init__(self, method: Callable[Concatenate[Any, P], Any]) -> None:
        self.method = method
        self.name = method.__name__

    @overload
    def __get__(self, chat: None, owner: type) -> Callable[Concatenate[Any, P], Any]: ...
    @overload
    def __get__(self, chat: ChatT, owner: type) -> Callable[P, ChatT]: ...
    def __get__(self, chat: Any, owner: type) -> Callable[..., Any]:
        if chat is None:
            return self.method
        method = getattr(chat.conversation, self.name)

        def chained(*args: P.args, **kwargs: P.kwargs) -> Any:
            method(*args, **kwargs)
            return chat

        return chained


class AsyncChainedVerb(Generic[P]):
    """``ChainedVerb`` for an ``async def`` method: awaiting the chat's returns the chat."""

    def __init__(self, method: Callable[Concatenate[Any, P], Coroutine[Any, Any, Any]]) -> None:
        if not inspect.iscoroutinefunction(method):
            raise TypeError(f"{method.__name__} is not async: use ChainedVerb")
        self.method = method
        self.name = method.__name__

    @overload
    def __get__(
        self, chat: None, owner: type
    ) -> Callable[Concatenate[Any, P], Coroutine[Any, Any, Any]]: ...
    @overload
    def __get__(self, chat: ChatT, owner: type) -> Callable[P, Coroutine[Any, Any, ChatT]]: ...
    def __get__(self, chat: Any, owner: type) -> Callable[..., Any]:
        if chat is None:
            return self.method
        method = getattr(chat.conversation, self.name)

        async def chained(*args: P.args, **kwargs: P.kwargs) -> Any:
            await method(*args, **kwargs)
            return chat

        return chained


class ConversationDelegations:
    """Configuration, callbacks, verbs and reads of a chat, done by its ``Conversation``."""

    # configuration (each persists and returns the chat)
    with_model = ChainedVerb(Engine.with_model)
    with_instructions = ChainedVerb(Engine.with_instructions)
    with_tools = ChainedVerb(Engine.with_tools)
    with_handoffs = ChainedVerb(Engine.with_handoffs)
    with_guardrails = ChainedVerb(Engine.with_guardrails)
    with_mcp = ChainedVerb(Engine.with_mcp)
    with_tool_options = ChainedVerb(Engine.with_tool_options)
    with_temperature = ChainedVerb(Engine.with_temperature)
    with_max_output_tokens = ChainedVerb(Engine.with_max_output_tokens)
    with_provider_options = ChainedVerb(Engine.with_provider_options)
    with_headers = ChainedVerb(Engine.with_headers)
    with_schema = ChainedVerb(Engine.with_schema)
    with_caching = ChainedVerb(Engine.with_caching)
    with_thinking = ChainedVerb(Engine.with_thinking)
    with_context_window = ChainedVerb(Engine.with_context_window)
    with_compaction = ChainedVerb(Engine.with_compaction)
    with_fallbacks = ChainedVerb(Engine.with_fallbacks)
    with_memory = ChainedVerb(Engine.with_memory)
    with_limits = ChainedVerb(Engine.with_limits)

    # callbacks (this instance only; signals reach every chat)
    before_message = ChainedVerb(Engine.before_message)
    after_message = ChainedVerb(Engine.after_message)
    before_tool_call = ChainedVerb(Engine.before_tool_call)
    after_tool_result = ChainedVerb(Engine.after_tool_result)

    # verbs, and their async twins (views under ASGI, Channels consumers)
    ask_later = ChainedVerb(Engine.ask_later)
    ask = Verb(Engine.ask)
    generate = Verb(Engine.generate)
    run_tools = Verb(Engine.run_tools)
    step = Verb(Engine.step)
    complete = Verb(Engine.complete)
    halt = Verb(Engine.halt)
    aask_later = AsyncChainedVerb(Engine.aask_later)
    aask = Verb(Engine.aask)
    agenerate = Verb(Engine.agenerate)
    arun_tools = Verb(Engine.arun_tools)
    astep = Verb(Engine.astep)
    acomplete = Verb(Engine.acomplete)

    # iterated runs (docs/streaming.md): ask()/complete() as their events
    stream = Verb(Engine.stream)
    astream = Verb(Engine.astream)

    # editing (docs/editing.md): replaced rows are superseded, kept, never sent again
    regenerate = Verb(Engine.regenerate)
    regenerate_later = ChainedVerb(Engine.regenerate_later)
    edit = Verb(Engine.edit)
    edit_later = ChainedVerb(Engine.edit_later)
    fork = Verb(Engine.fork)
    aregenerate = Verb(Engine.aregenerate)
    aregenerate_later = AsyncChainedVerb(Engine.aregenerate_later)
    aedit = Verb(Engine.aedit)
    aedit_later = AsyncChainedVerb(Engine.aedit_later)
    afork = Verb(Engine.afork)

    # reads
    is_complete = Verb(Engine.is_complete)
    is_waiting = Verb(Engine.is_waiting)
    ais_complete = Verb(Engine.ais_complete)
    ais_waiting = Verb(Engine.ais_waiting)
    pending_results = Verb(Engine.pending_results)

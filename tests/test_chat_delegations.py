"""The chat model's verbs are the engine's: every public method of ``Conversation`` (but the
engine's own, listed below) is on ``AbstractChat`` with the same parameters, and calling it
on a chat calls the conversation's with the same arguments. The chat has no public verb the
conversation lacks but those it adds on purpose (listed), sync and async alike; its pass-
throughs are generated (``agentloop/models/delegations.py``: one line each), never written.

Checked against a mock conversation (``create_autospec`` of ``Conversation``) put where the
``conversation`` property caches it; no database. The chat's own verbs that do more than
pass through are listed with what they add: for them only the name and signature are held.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any
from unittest import mock

import pytest

from agentloop.engine import Conversation
from agentloop.models import AbstractChat, Chat
from agentloop.models.delegations import AsyncChainedVerb, ChainedVerb, Verb

#: The chat's public methods the conversation doesn't have: what a persisted chat adds.
CHAT_ONLY = {
    "complete_later": "the rest of the turn as background jobs",
    "resume_if_waiting": "queues the chat once a decision unblocked it",
    "decline": "refuses an MCP server's question: its call runs, held open in the worker",
    "question_desk": "where the process running an MCP call writes its server's questions",
}

#: Public methods of ``Conversation`` that are the engine's own, not a chat verb.
#: (``emit``, ``prepare_model_call``, ``accept_response`` and ``record_cancel`` are the
#: engine's too: attributes bound to its parts' methods, not methods of the class.)
ENGINE_ONLY = {
    "on": "the engine's event hook (claimed, subagents_waiting...: models/chat_events.py)",
    "cancel_waiting": "part of cancel(): the held calls of a chat no run holds",
    "settle_subagent": "a subagent's answer given to its parent's call (agents.subagents)",
    # one step and what it did, for the job body (runners.job); people use step()
    "advance": "StepResult of one step",
    "aadvance": "advance for async code",
    # the chat's own field of that name holds its tools' import paths
    "tools": "a model field on the chat",
}

#: The chat's verbs that do more than pass through (same name and signature, checked).
DELIBERATE = {
    "cancel": "also cancels the subagents waiting for a person, when no worker will",
    "acancel": "the chat's own cancel(), on a thread",
    "pending_approvals": "adds the waiting calls of its subagents",
    "pending_questions": "adds the waiting questions of its subagents",
    "approve": "through agents.subagents.decide: a subagent's call too, then resumes",
    "deny": "through agents.subagents.decide: a subagent's call too, then resumes",
    "answer": "through agents.subagents.decide: a subagent's call too, then resumes",
    "submit_result": "through agents.subagents.decide: a subagent's call too, then resumes",
}

#: what the engine's method returns when it returns itself: the chat's returns the chat.
CHAINABLE_RETURNS = {"Self", "Conversation"}


def public_methods(cls: type) -> dict[str, Any]:
    """``cls``'s public methods (plain and ``async def``; properties are not methods)."""
    return {
        name: member
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
    }


CONVERSATION = public_methods(Conversation)
CHECKED = sorted(set(CONVERSATION) - set(ENGINE_ONLY))
PASS_THROUGHS = [name for name in CHECKED if name not in DELIBERATE]


def parameters(function: Any) -> list[inspect.Parameter]:
    """Names, kinds, defaults and annotations of ``function``'s parameters (``self`` aside)."""
    return list(inspect.signature(function).parameters.values())[1:]


class Token:
    """A distinct argument, so a call with another value (or none) can't compare equal."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


def arguments_for(function: Any) -> tuple[list[Any], dict[str, Any]]:
    """One distinct value for every parameter (two for ``*args``, one extra ``**kwargs``)."""
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for parameter in parameters(function):
        kind = parameter.kind
        if kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            args.append(Token(parameter.name))
        elif kind is parameter.VAR_POSITIONAL:
            args += [Token(f"{parameter.name}[0]"), Token(f"{parameter.name}[1]")]
        elif kind is parameter.KEYWORD_ONLY:
            kwargs[parameter.name] = Token(parameter.name)
        else:
            kwargs[f"{parameter.name}_extra"] = Token(f"{parameter.name}_extra")
    return args, kwargs


def test_the_lists_name_public_methods_of_conversation() -> None:
    assert set(ENGINE_ONLY) - set(CONVERSATION) == set(), "gone from Conversation: unlist them"
    assert set(DELIBERATE) <= set(CHECKED)
    assert PASS_THROUGHS  # the set the delegation test walks is not empty by accident


@pytest.mark.parametrize("name", CHECKED)
def test_the_chat_has_the_conversations_method_with_the_same_parameters(name: str) -> None:
    engine = CONVERSATION[name]
    own = getattr(AbstractChat, name, None)

    assert inspect.isfunction(own), f"AbstractChat has no method {name}"
    assert inspect.iscoroutinefunction(own) == inspect.iscoroutinefunction(engine), name
    assert parameters(own) == parameters(engine), (
        f"AbstractChat.{name}{inspect.signature(own)} != "
        f"Conversation.{name}{inspect.signature(engine)}"
    )


@pytest.mark.parametrize("name", PASS_THROUGHS)
def test_the_chat_method_calls_the_conversations_with_the_same_arguments(name: str) -> None:
    chat = Chat()
    conversation = mock.create_autospec(Conversation, instance=True, spec_set=True)
    chat.__dict__["_conversation"] = conversation  # where the property caches it
    engine_method = getattr(conversation, name)
    engine_method.return_value = result = Token("result")
    args, kwargs = arguments_for(CONVERSATION[name])

    returned = getattr(chat, name)(*args, **kwargs)
    if inspect.iscoroutine(returned):
        returned = asyncio.run(returned)

    # autospec binds both calls to the signature: positional or by keyword compare alike.
    engine_method.assert_called_once_with(*args, **kwargs)
    assert len(conversation.mock_calls) == 1, conversation.mock_calls  # nothing else called
    chains = inspect.signature(CONVERSATION[name]).return_annotation in CHAINABLE_RETURNS
    assert returned is (chat if chains else result)


def chat_verbs() -> dict[str, Any]:
    """The chat's public verbs: its own methods and the generated ones (Django's model
    methods and the ORM's aside)."""
    verbs: dict[str, Any] = {}
    for klass in reversed(AbstractChat.__mro__):
        if klass.__module__.startswith("agentloop."):
            for name, member in vars(klass).items():
                generated = isinstance(member, (Verb, ChainedVerb, AsyncChainedVerb))
                if not name.startswith("_") and (generated or inspect.isfunction(member)):
                    verbs[name] = member
    return verbs


def test_the_chat_and_the_conversation_have_the_same_verbs_sync_and_async() -> None:
    chat = set(chat_verbs())

    assert chat - set(CHAT_ONLY) == set(CHECKED), "a verb on one and not the other"
    for name in CHECKED:
        twin = name[1:] if name.startswith("a") and name[1:] in CONVERSATION else "a" + name
        if twin in CONVERSATION:
            assert twin in chat, f"the chat has {name} but not its twin {twin}"


@pytest.mark.parametrize("name", PASS_THROUGHS)
def test_a_pass_through_is_generated_and_chains_where_the_engine_returns_itself(
    name: str,
) -> None:
    verb = next(vars(k)[name] for k in AbstractChat.__mro__ if name in vars(k))
    engine = CONVERSATION[name]
    chains = inspect.signature(engine).return_annotation in CHAINABLE_RETURNS

    assert verb.method is engine
    if not chains:
        assert type(verb) is Verb
    elif inspect.iscoroutinefunction(engine):
        assert type(verb) is AsyncChainedVerb
    else:
        assert type(verb) is ChainedVerb

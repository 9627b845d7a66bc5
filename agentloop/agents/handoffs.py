"""Handoffs: agents the model can hand the conversation over to, and the take-over itself.

``Billing.as_handoff()`` (or ``chat.with_handoffs(Billing)``, or ``handoffs = [Billing]`` on
an agent) is a tool named ``transfer_to_billing``. Calling it asks for the handoff
(``ToolContext.hand_off``); the tool round makes it (``agentloop.engine._tool_rounds``) with
:func:`take_over`, in the transaction that saves the call's result: the chat takes the new
agent's configuration and records it (``agent_path``, ``agent_inputs``, ``agent_digest``),
so the next model call is the new agent's, in this run and in any worker. ``Agent.find(pk)``
uses the same take-over: inside a tool of the chat's own run as a request the round makes,
elsewhere at once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import Field, create_model

from ..engine._chat_config import ToolOptions
from ..engine._tool_rounds import agent_label
from ..exceptions import ConfigurationError
from ..import_paths import import_path_of, load_by_path
from ..providers import resolve
from ..tools import Tool

#: an ``agentloop.Agent`` subclass (typed loosely: this module sits below the Agent class).
Agent = Any

__all__ = ["HandoffTool", "agent_path", "handoff_tool", "handoff_tools", "take_over"]

#: how a persisted chat's tool list names a handoff (see ``agentloop.tools._references``).
PREFIX = "handoff:"


class HandoffTool(Tool):
    """The tool that hands the conversation over to an agent (``Agent.as_handoff``)."""

    handoff_agent: ClassVar[type[Agent]]
    bound_inputs: ClassVar[dict[str, Any]] = {}
    #: the description given to ``as_handoff`` ("" when it is the default one).
    given_description: ClassVar[str] = ""

    @classmethod
    def default_name(cls, prefix: str = "") -> str:
        """``transfer_to_billing`` (``transfer_to_acme_billing`` with the prefix ``acme``)."""
        name = cls.handoff_agent.tool_name()
        return f"transfer_to_{prefix}_{name}" if prefix else f"transfer_to_{name}"

    @classmethod
    def renamed(cls, name: str) -> type[HandoffTool]:
        """The same handoff under another name."""
        agent = cls.handoff_agent
        description = cls.given_description or None
        return agent.as_handoff(name=name, description=description, **cls.bound_inputs)

    @classmethod
    def reference(cls) -> str:
        """How a persisted chat names this tool: ``handoff:<path>`` (+ bound inputs, name)."""
        extra = dict(cls.bound_inputs)
        if cls.name != cls.default_name():
            extra["__name__"] = cls.name
        if cls.given_description:
            extra["__description__"] = cls.given_description
        suffix = "?" + json.dumps(extra, sort_keys=True) if extra else ""
        return f"{PREFIX}{import_path_of(cls.handoff_agent)}{suffix}"

    def execute(self, *args: Any, **inputs: Any) -> str:
        agent = type(self).handoff_agent
        given = {name: value for name, value in inputs.items() if value}
        self.context.hand_off(agent, **{**type(self).bound_inputs, **given})
        before = agent_label(agent_path(self.context.chat))
        if before and before != agent.__name__:
            return f"Handed off from {before} to {agent.__name__}: {agent.__name__} goes on."
        return f"Handed off to {agent.__name__}: {agent.__name__} goes on."


def handoff_tool(
    agent: type[Agent],
    *,
    name: str | None = None,
    description: str | None = None,
    bound: Mapping[str, Any] | None = None,
) -> type[HandoffTool]:
    """``agent.as_handoff(...)``: the tool, whose parameters are the agent's inputs not bound
    (each optional: the chat's stored inputs fill those the model leaves empty)."""
    bound = dict(bound or {})
    unknown = sorted(set(bound) - set(agent.input_names()))
    if unknown:
        raise ConfigurationError(f"{agent.__name__} has no input(s) {', '.join(unknown)}.")
    descriptions = dict(agent.inputs) if isinstance(agent.inputs, Mapping) else {}
    fields: dict[str, Any] = {
        input_name: (str, Field(default="", description=descriptions.get(input_name) or None))
        for input_name in agent.input_names()
        if input_name not in bound
    }
    params = create_model(f"{agent.__name__}HandoffParams", **fields)
    default = f"Hand the conversation over to the {agent.__name__} agent"
    attrs: dict[str, Any] = {
        "description": description
        or (f"{default}: {agent.description}" if agent.description else f"{default}."),
        "Params": params,
        "handoff_agent": agent,
        "bound_inputs": bound,
        "given_description": description or "",
        "__module__": agent.__module__,
    }
    tool_class: type[HandoffTool] = type(f"{agent.__name__}Handoff", (HandoffTool,), attrs)
    tool_class.name = name or tool_class.default_name()
    return tool_class


def handoff_tools(agent: type[Agent]) -> list[type[HandoffTool]]:
    """The tools of an agent's ``handoffs`` (agents, import paths, ``as_handoff()`` tools)."""
    return [as_handoff_tool(item) for item in agent.handoffs]


def as_handoff_tool(item: Any) -> type[HandoffTool]:
    """A handoff tool from an agent, its import path, or a tool ``as_handoff()`` made."""
    if isinstance(item, str):
        item = load_by_path(item)
    if isinstance(item, type) and issubclass(item, HandoffTool):
        return item
    as_handoff = getattr(item, "as_handoff", None)
    if not callable(as_handoff):
        raise ConfigurationError(f"{item!r} is not an agent: a handoff goes to an Agent subclass.")
    tool_class: type[HandoffTool] = as_handoff()
    return tool_class


# -- the take-over --------------------------------------------------------------------------
def agent_path(chat: Any) -> str:
    """The import path of the agent ``chat`` follows ("" for none): a persisted chat's
    ``agent_path``, or the agent of an in-memory one."""
    if hasattr(chat, "_meta"):
        return str(chat.agent_path or "")
    agent = getattr(getattr(chat, "store", None), "agent", None)
    return _path(agent) if agent is not None else ""


def _path(agent: Any) -> str:
    """Its import path; for an in-memory chat's agent, which need not be importable, its
    dotted name."""
    try:
        return import_path_of(agent)
    except ConfigurationError:
        return f"{agent.__module__}.{agent.__qualname__}"


def take_over(agent: type[Agent], chat: Any, given: Mapping[str, Any]) -> dict[str, Any]:
    """``agent`` takes ``chat`` over (a persisted chat or an in-memory Conversation): its
    configuration applied, what the previous agent set and ``agent`` doesn't put back to
    the defaults, and ``agent`` recorded as the chat's. The chat's stored inputs are kept for
    the inputs ``agent`` declares, ``given`` adds to them. Checks first (inputs, model,
    import path), so a ``ConfigurationError`` leaves everything as it was. Returns the
    record: ``{"from": <path or "">, "to": <path>, "inputs": {...}}``."""
    persisted = hasattr(chat, "_meta")
    store = None if persisted else chat.store
    before = agent_path(chat)
    stored = chat.agent_inputs if persisted else store.agent_inputs  # type: ignore[union-attr]
    merged = {**(stored or {}), **given}
    inputs = {name: value for name, value in merged.items() if name in agent.input_names()}
    current = agent.fingerprint(inputs)  # raises on a missing input
    if agent.model:
        resolve(agent.model, agent.provider)  # a model no provider here serves: fail now
    path = import_path_of(agent) if persisted else _path(agent)
    previous = _loaded(before)
    if previous is not None and previous is not agent:
        _put_back(chat, previous, agent)
    agent.configure(chat, **inputs)
    if persisted:
        type(chat)._default_manager.filter(pk=chat.pk).update(
            agent_path=path, agent_inputs=inputs, agent_digest=current
        )
        chat.agent_path, chat.agent_inputs, chat.agent_digest = path, inputs, current
    else:
        _follow_in_memory(chat, agent, inputs, current)
    return {"from": before, "to": path, "inputs": inputs}


def _loaded(path: str) -> Any:
    """The agent at ``path``, or None (none, or it no longer imports)."""
    if not path:
        return None
    try:
        return load_by_path(path)
    except ConfigurationError:
        return None


def _put_back(chat: Any, previous: type[Agent], agent: type[Agent]) -> None:
    """What ``previous`` set and ``agent`` leaves alone goes back to its default, so nothing
    of the previous agent (a schema, a tool choice, a limit) stays behind."""
    if previous.instructions and not agent.instructions:
        chat.with_instructions("")
    if previous.temperature is not None and agent.temperature is None:
        chat.with_temperature(None)
    if previous.schema is not None and agent.schema is None:
        chat.with_schema(None)
    defaults = ToolOptions().model_dump()
    options = {key: defaults[key] for key in previous.tool_options if key not in agent.tool_options}
    if options:
        chat.with_tool_options(**options)
    limits = {key: None for key in previous.limits if key not in agent.limits}
    if limits:
        chat.with_limits(**limits)
    if previous.fallbacks and not agent.fallbacks:
        chat.with_fallbacks()


def _follow_in_memory(chat: Any, agent: type[Agent], inputs: dict[str, Any], digest: str) -> None:
    """An in-memory chat follows ``agent`` from now on (its verbs apply the class as it is)."""
    store = chat.store
    first = store.agent is None
    store.agent, store.agent_inputs, store.agent_digest = agent, dict(inputs), digest
    store.agent_name = agent.__name__  # for traces
    if first:
        chat.on("claimed", lambda: follow_in_memory(chat))


def follow_in_memory(chat: Any) -> None:
    """At a verb's start: an in-memory chat takes its agent's configuration as it is now."""
    store = chat.store
    if store.agent is not None:
        store.agent_digest = store.agent.follow(chat, store.agent_inputs, store.agent_digest)

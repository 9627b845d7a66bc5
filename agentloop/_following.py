"""Chats follow their agent's code: each verb re-applies the agent's configuration when it
changed (a deploy), and ``Agent.find`` hands a chat over to another agent."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .exceptions import ConfigurationError
from .importing import load_by_path

if TYPE_CHECKING:
    from .agents import Agent

__all__ = ["fingerprint", "follow", "follow_agent", "hand_over"]

logger = logging.getLogger("agentloop")


def _name(obj: Any) -> str:
    """A stable name for a tool, an agent or a schema (it need not be importable)."""
    bound = getattr(obj, "bound_inputs", None)
    agent = getattr(obj, "agent_class", None)
    if agent is not None:
        return f"{_name(agent)}:{getattr(obj, 'name', '')}:{json.dumps(bound, sort_keys=True)}"
    if isinstance(obj, type) or callable(obj):
        return f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', repr(obj))}"
    return json.dumps(obj, sort_keys=True, default=str)


def fingerprint(agent: type[Agent], inputs: Mapping[str, Any]) -> str:
    """A digest of what ``agent.configure(chat, **inputs)`` applies: equal digests, nothing
    to apply (so an unchanged agent costs a verb no query)."""
    applied = {
        "model": agent.model,
        "provider": agent.provider,
        "instructions": agent.render_instructions(inputs),
        "tools": [_name(tool) for tool in agent.tools],
        "tool_options": dict(agent.tool_options),
        "temperature": agent.temperature,
        "schema": None if agent.schema is None else _name(agent.schema),
        "limits": dict(agent.limits),
    }
    text = json.dumps(applied, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def follow(agent: type[Agent], chat: Any, inputs: Mapping[str, Any], applied: str) -> str:
    """Apply ``agent``'s configuration to ``chat`` when it changed since the ``applied``
    fingerprint; returns the current one."""
    current = fingerprint(agent, inputs)
    if current != applied:
        agent.configure(chat, **inputs)
    return current


def follow_agent(chat: Any) -> None:
    """At a verb's start (after the claim): a persisted chat made by an agent takes the
    agent's current configuration. An agent that no longer imports, or no longer fits the
    chat's inputs, leaves the stored configuration as it is (logged)."""
    path = chat.agent_path
    if not path:
        return
    try:
        agent = load_by_path(path)
        current = follow(agent, chat, chat.agent_inputs or {}, chat.agent_digest)
    except ConfigurationError as exc:
        logger.warning("Chat %s keeps its configuration: agent %s: %s", chat.pk, path, exc)
        return
    if current != chat.agent_digest:
        type(chat)._default_manager.filter(pk=chat.pk).update(agent_digest=current)
        chat.agent_digest = current


def hand_over(agent: type[Agent], chat: Any, path: str, inputs: Mapping[str, Any]) -> None:
    """``agent`` takes ``chat`` over: its configuration applied and recorded on the chat, so
    every later verb follows ``agent``."""
    given = {**(chat.agent_inputs or {}), **inputs}
    kept = {name: value for name, value in given.items() if name in agent.input_names()}
    current = follow(agent, chat, kept, "")  # raises before writing on missing inputs
    type(chat)._default_manager.filter(pk=chat.pk).update(
        agent_path=path, agent_inputs=kept, agent_digest=current
    )
    chat.agent_path, chat.agent_inputs, chat.agent_digest = path, kept, current

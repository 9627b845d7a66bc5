"""Chats follow their agent's code: at each verb a persisted chat made by an agent takes the
agent's configuration as the code has it now (a deploy changed it, say)."""

from __future__ import annotations

import logging
from typing import Any

from ..exceptions import ConfigurationError
from ..import_paths import load_by_path

__all__ = ["follow_agent"]

logger = logging.getLogger("agentloop")


def follow_agent(chat: Any) -> None:
    """At a verb's start (after the claim): a persisted chat made by an agent takes the
    agent's current configuration. An agent that no longer imports, or no longer fits the
    chat's inputs, leaves the stored configuration as it is (logged)."""
    path = chat.agent_path
    if not path:
        return
    try:
        agent = load_by_path(path)
        current = agent.follow(chat, chat.agent_inputs or {}, chat.agent_digest)
    except ConfigurationError as exc:
        logger.warning("Chat %s keeps its configuration: agent %s: %s", chat.pk, path, exc)
        return
    if current != chat.agent_digest:
        type(chat)._default_manager.filter(pk=chat.pk).update(agent_digest=current)
        chat.agent_digest = current

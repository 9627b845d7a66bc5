"""Tool references: how a persisted chat names its tools, and turning a name back into a tool.

A chat row stores each tool as a reference a worker in another process can load: an import
path (``myapp.tools.lookup_order``), ``agent:<path>?{...}`` for an agent offered as a tool,
``handoff:<path>?{...}`` for a handoff to an agent, or ``mcp:server/tool?{...}`` for a tool
of an MCP server. This module knows every kind; the
kinds' own modules (:mod:`agentloop.tools`, :mod:`agentloop.tools.mcp`) know none of the others.
"""

from __future__ import annotations

import json
from typing import Any

from ..exceptions import ConfigurationError
from ..import_paths import import_path_of, load_by_path
from ._tool import FunctionTool, Tool
from .mcp import PREFIX as MCP_PREFIX
from .mcp import load_mcp_tool

__all__ = ["load_tool", "made_tool", "tool_reference"]


def tool_reference(tool_class: type[Tool]) -> str:
    """How a persisted chat names a tool: its import path (agents: ``agent:<path>``)."""
    reference = getattr(tool_class, "reference", None)
    if callable(reference):
        return str(reference())
    if isinstance(tool_class, type) and issubclass(tool_class, FunctionTool):
        what = f"@tool function {tool_class.__qualname__!r}"  # a class, but written as a function
    else:
        what = f"tool class {getattr(tool_class, '__qualname__', tool_class)!r}"
    return import_path_of(tool_class, what=what, advice=_TOOL_ADVICE)


#: the fix for a tool that can't be stored by import path.
_TOOL_ADVICE = (
    "define tools of persisted chats in a module (e.g. myapp/tools.py, not a shell or a "
    "function body) and import them from there, so a worker in another process can load them"
)


def load_tool(reference: str) -> type[Tool]:
    """The Tool class a :func:`tool_reference` names (``agent:``, ``mcp:`` or an import path);
    errors name the reference."""
    if reference.startswith(MCP_PREFIX):
        return load_mcp_tool(reference)
    if reference.startswith("agent:"):
        path, _, extra = reference.removeprefix("agent:").partition("?")
        agent = load_by_path(path)
        bound = json.loads(extra) if extra else {}
        name = bound.pop("__name__", None)
        tool_class: type[Tool] = agent.as_tool(name=name, **bound)
        return tool_class
    if reference.startswith("handoff:"):
        path, _, extra = reference.removeprefix("handoff:").partition("?")
        try:
            agent = load_by_path(path)
        except ConfigurationError as exc:
            raise ConfigurationError(
                f"The chat's handoff to {path!r} can't be offered: {exc}"
            ) from exc
        if not callable(getattr(agent, "as_handoff", None)):
            raise ConfigurationError(f"{reference!r}: {path!r} is not an agent to hand off to.")
        bound = json.loads(extra) if extra else {}
        name, description = bound.pop("__name__", None), bound.pop("__description__", None)
        handoff: type[Tool] = agent.as_handoff(name=name, description=description, **bound)
        return handoff
    loaded = load_by_path(reference)
    if isinstance(loaded, type) and issubclass(loaded, Tool):
        return loaded
    converted = made_tool(loaded, "as_tool")
    if converted is None:
        raise ConfigurationError(f"{reference!r} is not a tool.")
    return converted


def made_tool(obj: Any, method: str) -> type[Tool] | None:
    """The Tool class ``obj.<method>()`` makes (an agent's ``as_tool``, ``as_handoff``);
    None when ``obj`` has no such method, or it makes no Tool class."""
    make = getattr(obj, method, None)
    if not callable(make):
        return None
    made = make()
    return made if isinstance(made, type) and issubclass(made, Tool) else None

"""Tools from MCP servers: ``chat.with_mcp("files", only=None, requires_approval=())``.

Servers are configured by name in ``AGENTLOOP["MCP_SERVERS"]`` (a command for stdio, or a
URL for streamable HTTP). ``with_mcp`` lists the server's tools once and stores each on the
chat as a reference, ``mcp:files/read_file?{...}``, that carries the tool's name,
description and input schema: a worker in any process rebuilds the tool from the chat row
alone, and a model call never waits for (or fails on) the server. Only running a tool
talks to the server; a server that is down, too slow, or reports an error gives the model
an error result. The short form ``mcp:files/read_file`` is also understood: the schema is
then fetched from the server when the tool is loaded (once per process).

Calls go through :mod:`agentloop.tools.mcp._connections` (sessions kept open on a background
event loop per process). The ``mcp`` package is needed only to talk to a server.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable
from functools import lru_cache
from typing import TYPE_CHECKING, Any, ClassVar

from ...exceptions import ConfigurationError, MCPServerError, ToolError
from ...messages import ToolDefinition
from .._tool import Tool, arguments_schema
from ._connections import Asking, Stopped, close_connections, list_tools
from ._connections import call_tool as _call_tool
from ._settings import server_settings
from .elicitation import person_answers

if TYPE_CHECKING:
    from mcp.types import CallToolResult
    from mcp.types import Tool as RemoteTool

__all__ = [
    "STOPPED_RESULT",
    "MCPTool",
    "close_connections",
    "load_mcp_tool",
    "mcp_tools",
    "result_text",
]

PREFIX = "mcp:"
#: the result of a call given up because the chat was cancelled while it ran.
STOPPED_RESULT = "The call was stopped because the chat was cancelled; its effects are unknown."
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_-]")


class MCPTool(Tool):
    """A tool run by an MCP server; made by :func:`mcp_tools`, one subclass per tool."""

    #: the server's name in ``AGENTLOOP["MCP_SERVERS"]``.
    server: ClassVar[str] = ""
    #: the tool's name on the server (``name`` is what the model calls it).
    remote_name: ClassVar[str] = ""
    #: the JSON schema of the arguments, as the server lists it.
    input_schema: ClassVar[dict[str, Any]] = {}

    @classmethod
    def definition(cls) -> ToolDefinition:
        """The server's name, description and schema for this tool."""
        return ToolDefinition(
            name=cls.name, description=cls.description, parameters=cls.input_schema
        )

    @classmethod
    def parse_arguments(cls, arguments: dict[str, Any]) -> dict[str, Any]:
        """The arguments as the model sent them: the server validates its own schema."""
        return dict(arguments)

    @classmethod
    def unexpected_keys(cls, arguments: dict[str, Any]) -> list[str]:
        """Keys the server's schema refuses (it sets ``additionalProperties`` to false)."""
        if cls.input_schema.get("additionalProperties", True) is not False:
            return []
        properties = cls.input_schema.get("properties") or {}
        return [key for key in arguments if key not in properties]

    @classmethod
    def reference(cls) -> str:
        """``mcp:<server>/<tool>?<json>``: all a worker needs to rebuild this tool."""
        details: dict[str, Any] = {"description": cls.description, "schema": cls.input_schema}
        if cls.name != cls.remote_name:
            details["name"] = cls.name
        if cls.requires_approval is True:
            details["requires_approval"] = True
        return f"{PREFIX}{cls.server}/{cls.remote_name}?{json.dumps(details, sort_keys=True)}"

    def execute(self, /, *args: Any, **arguments: Any) -> str:
        """Call the tool on its server; failures and error results raise ToolError."""
        # self is positional-only: a server's tool may well take an argument named "self".
        cls = type(self)
        context = getattr(self, "context", None)  # unset when called outside a chat
        stop = context.cancel_requested if context is not None else None
        try:
            settings = server_settings(cls.server)
            asking = None
            if settings.elicitation:
                # The chat writes the server's questions on this call's row (a persisted
                # chat's ``question_desk``); elsewhere nobody can answer and it hears "cancel".
                open_desk = getattr(getattr(context, "chat", None), "question_desk", None)
                key = context.tool_call.key if context is not None else None
                desk = open_desk(key) if open_desk is not None and key is not None else None
                asking = Asking(person_answers(desk, cls.server, settings))
            result = _call_tool(cls.server, settings, cls.remote_name, arguments, stop, asking)
        except (MCPServerError, ConfigurationError) as exc:
            raise ToolError(str(exc)) from exc
        except Stopped:
            raise ToolError(STOPPED_RESULT) from None
        text = result_text(result)
        if result.is_error:
            raise ToolError(text or f"MCP tool {cls.remote_name!r} reported an error.")
        return text


def result_text(result: CallToolResult) -> str:
    """A tool result as text for the model: text blocks as they are, others described."""
    # Local: the mcp package is an optional extra; a result exists only if it is installed.
    from mcp.types import EmbeddedResource, ResourceLink, TextContent, TextResourceContents

    parts: list[str] = []
    for block in result.content:
        if isinstance(block, TextContent):
            parts.append(block.text)
        elif isinstance(block, EmbeddedResource) and isinstance(
            block.resource, TextResourceContents
        ):
            parts.append(block.resource.text)
        elif isinstance(block, EmbeddedResource | ResourceLink):
            uri = block.resource.uri if isinstance(block, EmbeddedResource) else block.uri
            parts.append(f"[resource {uri}, not shown]")
        else:  # images and audio
            parts.append(f"[{block.type} ({block.mime_type}), not shown]")
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False)
    return "\n".join(parts)


def _tool_class(
    server: str,
    remote_name: str,
    *,
    description: str,
    schema: dict[str, Any],
    name: str | None = None,
    requires_approval: bool = False,
) -> type[MCPTool]:
    attrs: dict[str, Any] = {
        "name": name or _UNSAFE_NAME.sub("_", remote_name)[:64],
        "description": description,
        "server": server,
        "remote_name": remote_name,
        "input_schema": schema,
        "requires_approval": requires_approval,
        "__module__": __name__,
        "__qualname__": f"MCPTool[{server}/{remote_name}]",
    }
    return type(f"MCPTool[{server}/{remote_name}]", (MCPTool,), attrs)


def _from_listing(server: str, remote: RemoteTool, requires_approval: bool) -> type[MCPTool]:
    schema = arguments_schema(json.loads(json.dumps(remote.input_schema)))  # a copy to clean
    return _tool_class(
        server,
        remote.name,
        description=remote.description or remote.title or "",
        schema=schema,
        requires_approval=requires_approval,
    )


def _names(value: Iterable[str] | str | None) -> list[str] | None:
    if value is None:
        return None
    return [value] if isinstance(value, str) else list(value)


def mcp_tools(
    server: str,
    only: Iterable[str] | None = None,
    requires_approval: Iterable[str] | bool = (),
) -> list[type[MCPTool]]:
    """The tools of MCP server ``server``, listed now: all, or those named in ``only``.

    Those named in ``requires_approval`` (``True``: all of them) wait for
    ``chat.approve(...)``. Unknown names raise ConfigurationError; a server that can't be
    reached raises MCPServerError.
    """
    if "/" in server or "?" in server:
        raise ConfigurationError(f"MCP server names can't contain '/' or '?': {server!r}")
    listed = {remote.name: remote for remote in list_tools(server, server_settings(server))}
    wanted = _names(only)
    names = list(listed) if wanted is None else wanted
    if isinstance(requires_approval, bool):
        approval = set(names) if requires_approval else set()
    else:
        approval = set(_names(requires_approval) or ())
    missing = sorted({*names, *approval} - set(listed))
    if missing:
        raise ConfigurationError(
            f"MCP server {server!r} has no tool {', '.join(map(repr, missing))} "
            f"(it has: {', '.join(sorted(listed)) or 'none'})."
        )
    return [_from_listing(server, listed[name], name in approval) for name in names]


_listings: dict[tuple[str, str], dict[str, RemoteTool]] = {}
_listings_lock = threading.Lock()


def _listed_tool(server: str, remote_name: str) -> RemoteTool:
    """A tool as the server lists it, fetched once per process and server configuration."""
    settings = server_settings(server)
    key = (server, settings.key)
    with _listings_lock:
        listed = _listings.get(key)
    if listed is None:
        listed = {remote.name: remote for remote in list_tools(server, settings)}
        with _listings_lock:
            _listings[key] = listed
    if remote_name not in listed:
        raise ConfigurationError(
            f"MCP server {server!r} has no tool {remote_name!r} "
            f"(it has: {', '.join(sorted(listed)) or 'none'})."
        )
    return listed[remote_name]


@lru_cache(maxsize=1024)
def load_mcp_tool(reference: str) -> type[MCPTool]:
    """The tool an ``mcp:`` reference names; errors name the reference."""
    target, _, details = reference.removeprefix(PREFIX).partition("?")
    server, _, remote_name = target.partition("/")
    if not server or not remote_name:
        raise ConfigurationError(f"{reference!r} is not an MCP tool reference (mcp:server/tool).")
    if not details:
        return _from_listing(server, _listed_tool(server, remote_name), requires_approval=False)
    try:
        stored = json.loads(details)
        return _tool_class(
            server,
            remote_name,
            description=str(stored.get("description", "")),
            schema=dict(stored["schema"]),
            name=stored.get("name"),
            requires_approval=stored.get("requires_approval") is True,
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigurationError(f"{reference[:200]!r} is not a valid MCP tool reference.") from exc

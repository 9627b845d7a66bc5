"""An MCP server of our own for the tests, written with the ``mcp`` SDK's server API.

Run it as a program, over stdio or streamable HTTP::

    python tests/mcp_server.py stdio
    python tests/mcp_server.py http 8765      # http://127.0.0.1:8765/mcp

It imports nothing from this repository, so it runs from any directory. Every tool call is
appended to ``$AGENTLOOP_TEST_MCP_LOG`` (when set) as one JSON line: the tool, its
arguments, and the server's pid and parent pid, so a test can see what ran, and where.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from mcp.server.mcpserver import Context, Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field

FILES = {"notes.txt": "Buy milk.", "todo.txt": "Write the docs."}
PNG = bytes.fromhex("89504e470d0a1a0a")  # enough of a PNG for a content block

server = MCPServer("agentloop-test-files")


def _log(tool: str, **arguments: Any) -> None:
    path = os.environ.get("AGENTLOOP_TEST_MCP_LOG")
    if path:
        line = {"tool": tool, "arguments": arguments, "pid": os.getpid(), "ppid": os.getppid()}
        with open(path, "a") as log:
            log.write(json.dumps(line) + "\n")


@server.tool()
def read_file(path: str) -> str:
    """Reads a text file.

    Args:
        path: The file's name, e.g. notes.txt.
    """
    _log("read_file", path=path)
    if path not in FILES:
        raise ToolError(f"No such file: {path}")
    return FILES[path]


@server.tool()
def list_files() -> str:
    """Lists the files, one name a line."""
    _log("list_files")
    return "\n".join(sorted(FILES))


@server.tool(name="delete-file")
def delete_file(path: str) -> str:
    """Deletes a file (the tests require approval for it)."""
    _log("delete-file", path=path)
    return f"Deleted {path}."


@server.tool()
def add(a: int, b: int) -> int:
    """Adds two integers."""
    _log("add", a=a, b=b)
    return a + b


@server.tool()
def explode() -> str:
    """Fails with an unexpected exception (a bug in the tool)."""
    _log("explode")
    raise RuntimeError("the tool has a bug")


@server.tool()
def slow(seconds: float) -> str:
    """Answers after a while."""
    _log("slow", seconds=seconds)
    time.sleep(seconds)
    return "slept"


@server.tool(structured_output=False)
def snapshot() -> list[Any]:
    """A caption and a (tiny) PNG image."""
    return ["A red dot.", Image(data=PNG, format="png")]


@server.tool()
def server_process() -> dict[str, int]:
    """The pid of this server process (the same pid means the same session)."""
    return {"pid": os.getpid()}


@server.tool()
def environment(name: str) -> str:
    """The value of one of this server's environment variables ("" when unset)."""
    return os.environ.get(name, "")


class Booking(BaseModel):
    """What book_table asks a person for (its elicitation's requested schema)."""

    people: int = Field(ge=1, le=12, description="How many people")
    name: str = Field(description="The name the table is booked under")


@server.tool()
async def book_table(day: str, ctx: Context) -> str:
    """Books a table, asking a person how many people and in whose name (elicitation)."""
    _log("book_table", day=day)
    answer = await ctx.elicit(f"A table on {day}: for how many people, in whose name?", Booking)
    _log("book_table answered", action=answer.action)
    if answer.action == "accept":
        return f"Booked a table on {day} for {answer.data.people}, name {answer.data.name}."
    return f"No table booked on {day}: the person chose {answer.action}."


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")

"""Tools the model can call: ``Tool`` classes, the ``@tool`` decorator, what a running tool
knows (``ToolContext``), tool references (how a persisted chat names its tools) and tools
from MCP servers (:mod:`agentloop.tools.mcp`).

The code lives in private modules: ``_tool`` (defining and running tools), ``_context`` (the
running call) and ``_references`` (names to tools and back); import from here.
"""

from ..exceptions import NeedsInput, ToolError
from ._context import Handoff, ToolContext, current_tool_context, running
from ._references import load_tool, tool_reference
from ._tool import (
    AskPerson,
    FunctionTool,
    Tool,
    ToolOutcome,
    arguments_problem,
    arguments_schema,
    describe_validation_error,
    format_result,
    snake_case,
    tool,
)

__all__ = [
    "AskPerson",
    "FunctionTool",
    "Handoff",
    "NeedsInput",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolOutcome",
    "arguments_problem",
    "arguments_schema",
    "current_tool_context",
    "describe_validation_error",
    "format_result",
    "load_tool",
    "running",
    "snake_case",
    "tool",
    "tool_reference",
]

# A chat row names a tool by its import path: agentloop's own tool is named by its public one.
AskPerson.__module__ = __name__

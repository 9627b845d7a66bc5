"""Running one tool call: its arguments validated, the tool run (sync, or an ``async def``
awaited), and whatever it returned, raised or asked for (a handoff too) turned into a
``ToolOutcome``."""

from __future__ import annotations

import inspect
import traceback
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from asgiref.sync import async_to_sync
from pydantic import ValidationError

from ..exceptions import ToolError, ToolWaiting
from ..messages import ToolCall
from ..tools import (
    Tool,
    ToolContext,
    ToolOutcome,
    arguments_problem,
    describe_validation_error,
    format_result,
    running,
)
from . import tracing
from .effects import RunTool

__all__ = ["aexecute_tool", "execute_tool", "unaskable"]


def _instance(
    tool_class: type[Tool],
    call: ToolCall,
    chat: Any,
    background: bool,
    cancel_check: Callable[[], bool] | None,
) -> tuple[Tool, dict[str, Any]] | ToolOutcome:
    """The tool ready to run with its validated arguments, or the outcome of bad ones."""
    try:
        arguments = tool_class.parse_arguments(call.arguments)
    except ValidationError as exc:
        message = describe_validation_error(call.name, exc)
        return ToolOutcome(message, is_error=True, error=message)
    instance = tool_class()
    instance.context = ToolContext(call, chat, background=background, cancel_check=cancel_check)
    return instance, arguments


async def _awaited(value: Any) -> Any:
    return await value


def _value_of(value: Any) -> Any:
    """A sync verb runs an ``async def`` tool to completion (on an event loop of its own)."""
    return async_to_sync(_awaited)(value) if inspect.isawaitable(value) else value


def execute_tool(
    tool_class: type[Tool],
    call: ToolCall,
    chat: Any = None,
    background: bool = False,
    cancel_check: Callable[[], bool] | None = None,
    savepoint: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> ToolOutcome:
    """Validate the arguments and run the tool; every failure becomes an error outcome.
    ``savepoint`` wraps the run (a transactional tool's: a failed run's writes roll back)."""
    ready = _instance(tool_class, call, chat, background, cancel_check)
    if isinstance(ready, ToolOutcome):
        return ready
    instance, arguments = ready

    def run() -> str:
        with savepoint(), tracing.tool_call(call, tool_class) as span, running(instance.context):
            return span.result(format_result(_value_of(instance.execute(**arguments))))

    return _with_handoff(_outcome(call, run), instance)


async def aexecute_tool(tool: RunTool) -> ToolOutcome:
    """``execute_tool`` for an ``async def`` tool, awaited on the running event loop."""
    tool_class, call = tool.tool_class, tool.call
    ready = _instance(tool_class, call, tool.chat, tool.background, tool.cancel_check)
    if isinstance(ready, ToolOutcome):
        return ready
    instance, arguments = ready
    try:
        with tracing.tool_call(call, tool_class) as span, running(instance.context):
            content = span.result(format_result(await instance.execute(**arguments)))
    except Exception as exc:
        failure = exc

        def reraise() -> Any:
            raise failure

        return _with_handoff(_outcome(call, reraise), instance)
    return _with_handoff(_outcome(call, lambda: content), instance)


def _with_handoff(outcome: ToolOutcome, instance: Tool) -> ToolOutcome:
    """The outcome, carrying the handoff the tool asked for when it gave a result (a call
    that failed or now waits hands nothing off)."""
    handoff = instance.context.handoff
    if handoff is not None and not outcome.is_error and outcome.wait_reason is None:
        outcome.handoff = handoff
    return outcome


def _outcome(call: ToolCall, run: Callable[[], str]) -> ToolOutcome:
    """What the tool's run gave (``run()``'s result text or what it raised), as an outcome."""
    try:
        return ToolOutcome(run())
    except ToolWaiting as exc:
        return ToolOutcome(wait_reason=exc.reason, question=exc.question, after_wait=exc.then)
    except ToolError as exc:
        return ToolOutcome(str(exc) or type(exc).__name__, is_error=True, error=repr(exc))
    except Exception as exc:
        # A bug in a tool must not crash the loop: the model hears about it,
        # and the traceback is kept on the tool call for whoever debugs it.
        return ToolOutcome(
            f"Tool {call.name!r} failed: {type(exc).__name__}: {exc}",
            is_error=True,
            error=traceback.format_exc(),
        )


def unaskable(tool_class: type[Tool], call: ToolCall) -> ToolOutcome | None:
    """A call about to wait for a person (or a system) must be one that could run as it is:
    arguments its tool refuses, or keys it takes no parameter for, are an error result for
    the model now (one line), never a question. None when the call may wait."""
    problem = arguments_problem(tool_class, call.arguments)
    return None if problem is None else ToolOutcome(problem, is_error=True, error=problem)

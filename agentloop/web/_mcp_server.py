"""The agents served over MCP (docs/mcp.md, serving agents): the SDK's low-level server.

Each agent of ``AGENTLOOP["MCP_SERVE"]["agents"]`` is a tool: ``task`` (and the agent's
inputs, or ``chat`` to go on with a chat the caller made before) in, the chat's answer out.
A call makes a persisted chat owned by the caller, runs it (in the background, or on a
thread here) and follows it until it settles, sending a progress notification per model
answer and tool call and, while a person must decide, one every ``keepalive`` seconds. The
caller's cancellation (``notifications/cancelled``, or the request's stream closed) cancels
the chat. Following a chat reads it every ``poll_interval`` seconds, each read on a thread
whose connection is closed (or given back to the pool) after it: a call that waits holds no
database connection.

Who calls is the transport's business: HTTP (``agentloop.web.mcp_asgi``) puts the token's
user on the request, stdio (``manage.py agentloop mcp-serve``) has one user for the process.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp_types as types
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import connections
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError

from ..agents import Agent
from ..conf import MCPServe, agentloop_settings, get_chat_model
from ..engine._transcript_reading import next_move
from ..exceptions import AgentloopError, CancelledError
from ..import_paths import import_path_of, load_by_path
from ..models import ChatState
from ..tools import snake_case

__all__ = ["build_server", "exposed_agents"]

logger = logging.getLogger("agentloop.mcp")

#: the key of a result's ``_meta`` that names its chat.
CHAT_META = "agentloop/chat"
SETTLED = (ChatState.IDLE, ChatState.STOPPED, ChatState.FAILED)

#: the tools' output: the answer, and the chat to name to go on with it.
OUTPUT_SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "description": "The agent's answer."},
        "chat": {
            "type": ["integer", "string"],
            "description": "The chat the call ran: pass it as `chat` to go on with it.",
        },
    },
    "required": ["answer", "chat"],
}


class BadCallError(Exception):
    """A call refused before anything ran: its one line goes back as an error result."""


def exposed_agents() -> dict[str, type[Agent]]:
    """The agents ``AGENTLOOP["MCP_SERVE"]["agents"]`` names, by tool name."""
    agents: dict[str, type[Agent]] = {}
    for path in agentloop_settings.MCP_SERVE.agents:
        agent = load_by_path(path)
        if not (isinstance(agent, type) and issubclass(agent, Agent)):
            raise AgentloopError(f"AGENTLOOP['MCP_SERVE']['agents']: {path} is not an Agent.")
        agents[snake_case(agent.__name__)] = agent
    return agents


def tool_of(name: str, agent: type[Agent]) -> types.Tool:
    """The MCP tool an agent is: ``task``, its inputs (for a new chat) and ``chat``."""
    descriptions = dict(agent.inputs) if isinstance(agent.inputs, dict) else {}
    properties: dict[str, Any] = {
        "task": {
            "type": "string",
            "description": "The task, with everything needed written to stand alone.",
        }
    }
    for input_name in agent.input_names():
        text = descriptions.get(input_name) or f"The agent's input {input_name}."
        properties[input_name] = {"type": "string", "description": f"{text} (a new chat needs it)"}
    properties["chat"] = {
        "type": ["integer", "string"],
        "description": "Go on with this chat (the `chat` of an earlier answer) instead of "
        "starting a new one; the agent's inputs are then left out.",
    }
    return types.Tool(
        name=name,
        description=agent.description or f"The {agent.__name__} agent.",
        input_schema={"type": "object", "properties": properties, "required": ["task"]},
        output_schema=OUTPUT_SCHEMA,
    )


# -- the database, from the event loop ------------------------------------------------------
async def in_thread(function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)`` on a worker thread, its database connections closed after it (a
    pooled one goes back to the pool): nothing is held between two reads of a call."""

    def run() -> Any:
        try:
            return function(*args)
        finally:
            connections.close_all()

    return await sync_to_async(run, thread_sensitive=False)()


@dataclass(frozen=True)
class Started:
    chat: Any  # the chat's pk
    asked: int  # the pk of the task's user message
    here: bool  # run in this process ("in_process"), else by the runner


def start(agent: type[Agent], user_pk: Any, arguments: dict[str, Any], conf: MCPServe) -> Started:
    """Make (or find) the caller's chat, add the task and set it running."""
    arguments = dict(arguments)
    task = arguments.pop("task", None)
    if not isinstance(task, str) or not task.strip():
        raise BadCallError("`task` is required: a non-empty string.")
    chat_id = arguments.pop("chat", None)
    user = get_user_model()._default_manager.get(pk=user_pk)
    if chat_id is None:
        inputs = {key: str(value) for key, value in arguments.items()}
        chat = agent.create(owner=user, **inputs)
    else:
        if arguments:
            raise BadCallError(
                f"Chat {chat_id} has its inputs already: leave {', '.join(arguments)} out."
            )
        # Only the caller's own chats of this agent: any other is "no chat", whoever has it.
        found = get_chat_model()._default_manager.filter(
            owner=user, agent_path=import_path_of(agent)
        )
        try:
            chat = found.filter(pk=chat_id).first()
        except (ValueError, TypeError, ValidationError):
            chat = None
        if chat is None:
            raise BadCallError(f"No chat {chat_id} of {agent.__name__} for you.")
        if chat.state not in SETTLED:
            raise BadCallError(f"Chat {chat.pk} is {chat.state}: wait for it to settle.")
    chat.ask_later(task)
    asked = chat.messages.filter(role="user").order_by("-pk").values_list("pk", flat=True)[0]
    if conf.run == "background":
        chat.complete_later()
    return Started(chat.pk, asked, here=conf.run == "in_process")


def run_here(chat_pk: Any) -> str:
    """The in-process run: ``complete()`` on this thread, until the chat is done or waits
    for a person. "cancelled" when a cancel stopped it (a failure is recorded on the chat)."""
    try:
        get_chat_model()._default_manager.get(pk=chat_pk).complete()
    except CancelledError:
        return "cancelled"
    except AgentloopError as exc:
        logger.info("MCP chat %s ended: %s: %s", chat_pk, type(exc).__name__, exc)
    except Exception:
        logger.exception("MCP chat %s failed", chat_pk)
    return "ended"


def spawn(function: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
    """``function(*args)`` on a thread of its own (a run lasts, and would take one of the
    loop's executor threads from the reads), its connections closed when it ends."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(outcome: Any) -> None:
        if not future.done():
            future.set_result(outcome)

    def run() -> None:
        outcome: Any = "ended"
        try:
            outcome = function(*args)
        finally:
            connections.close_all()
            loop.call_soon_threadsafe(settle, outcome)

    threading.Thread(target=run, daemon=True, name="agentloop-mcp-run").start()
    return future


def cancel(chat_pk: Any) -> None:
    chat = get_chat_model()._default_manager.filter(pk=chat_pk).first()
    if chat is not None:
        chat.cancel()


@dataclass
class Reading:
    """What one read of a followed chat found."""

    notes: list[str] = field(default_factory=list)
    cursor: int = 0
    waiting: str = ""
    result: types.CallToolResult | None = None
    #: run here: the chat's next move once no run holds it (engine: "done", "wait", ...).
    next: str = ""


def read(started: Started, cursor: int) -> Reading:
    """The chat's finished messages after ``cursor`` (as progress notes), what it waits for,
    and its result once it has settled."""
    chat = get_chat_model()._default_manager.get(pk=started.chat)
    reading = Reading(cursor=cursor)
    rows = (
        chat.messages.filter(pk__gt=cursor)
        .select_related("tool_call")
        .prefetch_related("tool_calls")
        .order_by("pk")
    )
    for message in rows:
        if message.status == "partial":
            break  # still streaming: read again once it is saved
        reading.cursor = message.pk
        reading.notes.extend(notes_of(message))
    if started.here:
        # Run here, the chat is idle between runs: what it would do next says the rest.
        reading.next = next_move(chat.conversation.messages)
        if reading.next == "wait":
            reading.waiting = waiting_for(chat)
        elif reading.next == "done" or chat.state in (ChatState.STOPPED, ChatState.FAILED):
            reading.result = result_of(chat, started)
    elif chat.state == ChatState.WAITING:
        reading.waiting = waiting_for(chat)
    elif chat.state in SETTLED:
        reading.result = result_of(chat, started)
    return reading


def notes_of(message: Any) -> list[str]:
    if message.role == "assistant":
        calls = [call.name for call in message.tool_calls.all()]
        return [f"Calling {', '.join(calls)}"] if calls else ["Answered"]
    if message.role == "tool" and message.tool_call is not None:
        failed = " (an error)" if message.is_error else ""
        return [f"{message.tool_call.name} finished{failed}"]
    return []


def waiting_for(chat: Any) -> str:
    held = [f"approval of {call.name} (call {call.call_id})" for call in chat.pending_approvals()]
    held += [f"an answer to {call.question!r}" for call in chat.pending_questions()]
    what = "; ".join(held) or "a person"
    return f"Chat {chat.pk} waits for {what}"


def result_of(chat: Any, started: Started) -> types.CallToolResult:
    meta = {CHAT_META: chat.pk}
    if chat.state == ChatState.FAILED:
        return error_result(f"The chat failed: {chat.error}", meta)
    if chat.state == ChatState.STOPPED:
        return error_result(f"The chat stopped: {chat.stop_reason or 'stopped'}", meta)
    answer = (
        chat.messages.filter(pk__gt=started.asked, role="assistant", status="complete")
        .order_by("-pk")
        .first()
    )
    if answer is None or answer.tool_calls.exists():
        return error_result("The chat was cancelled.", meta)
    text = json.dumps(answer.parsed) if answer.parsed is not None else answer.content
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content={"answer": text, "chat": chat.pk},
        meta=meta,
    )


def error_result(text: str, meta: dict[str, Any] | None = None) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], is_error=True, meta=meta
    )


class Progress:
    """The call's progress notifications: the count goes up by one with each."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.count = 0
        self.sent_at = time.monotonic()

    async def send(self, message: str) -> None:
        self.count += 1
        self.sent_at = time.monotonic()
        await self.ctx.session.report_progress(self.count, None, message)


async def follow(started: Started, progress: Progress, conf: MCPServe) -> types.CallToolResult:
    """Read the chat until it settles, reporting what it did and what it waits for; run
    here, start a run at first and again once a person decided what it waited for."""
    cursor, waited = started.asked, ""
    run = spawn(run_here, started.chat) if started.here else None
    await progress.send(f"Started chat {started.chat}")
    while True:
        running = run is not None and not run.done()
        reading: Reading = await in_thread(read, started, cursor)
        cursor = reading.cursor
        for note in reading.notes:
            await progress.send(note)
        if started.here and running:
            pass  # the run goes on: nothing to decide before it ends
        elif run is not None and run.result() == "cancelled":
            return error_result("The chat was cancelled.", {CHAT_META: started.chat})
        elif reading.result is not None:
            return reading.result
        elif started.here and reading.next in ("tools", "generate"):
            run = spawn(run_here, started.chat)  # decided: the run goes on
        if reading.waiting and (
            reading.waiting != waited or time.monotonic() - progress.sent_at >= conf.keepalive
        ):
            await progress.send(reading.waiting)
        waited = reading.waiting
        await anyio.sleep(conf.poll_interval)


def build_server(user_of: Callable[[Any], Any]) -> Server[Any]:
    """The MCP server; ``user_of(ctx)`` is the calling user's pk (None: refused), asked at
    each call on a worker thread (it may read the database)."""
    conf = agentloop_settings.MCP_SERVE

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        agents = exposed_agents()
        return types.ListToolsResult(tools=[tool_of(name, agent) for name, agent in agents.items()])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        user_pk = await in_thread(user_of, ctx)
        if user_pk is None:
            raise MCPError(types.INVALID_REQUEST, "The token is not valid (any more).")
        agent = exposed_agents().get(params.name)
        if agent is None:
            raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {params.name}")
        try:
            started = await in_thread(start, agent, user_pk, params.arguments or {}, conf)
        except (BadCallError, AgentloopError) as exc:
            return error_result(str(exc))
        try:
            return await follow(started, Progress(ctx), conf)
        except anyio.get_cancelled_exc_class():
            # The caller gave up (notifications/cancelled, or its request's stream closed):
            # the chat stops too. Shielded: this call is being cancelled already.
            with anyio.CancelScope(shield=True):
                await in_thread(cancel, started.chat)
            raise

    return Server(
        conf.name,
        version="1",
        instructions="Each tool is an agent: give it a task, get its answer.",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )

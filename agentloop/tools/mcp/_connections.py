"""Sessions with MCP servers, kept open on one background event loop per process.

The engine is synchronous and the ``mcp`` SDK is asynchronous. Each process gets one
daemon thread running an asyncio loop; a session per configured server is opened there on
first use and kept open, and any thread (a step, a tool thread, a Celery task) runs its call
on that loop and waits for the result. Keeping sessions open matters for stdio servers:
starting one costs a subprocess and an interpreter start (about a second for a Python
server), a call on an open session a few milliseconds.

A forked child (a Celery prefork worker) does not inherit the thread, so the state is
dropped after a fork and the child opens sessions of its own on first use. A session that
breaks is dropped and the next call reconnects; the failing call gives the model an error.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import cache
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

from ...conf import agentloop_settings
from ...exceptions import ConfigurationError, MCPServerError
from ...process.per_process import PerProcess
from ._settings import ServerSettings

if TYPE_CHECKING:
    from mcp import Client
    from mcp.types import CallToolResult
    from mcp.types import Tool as RemoteTool

__all__ = ["Asking", "Stopped", "call_tool", "close_connections", "list_tools", "require_sdk"]

T = TypeVar("T")
logger = logging.getLogger(__name__)

#: the install hint of a process without the SDK.
SDK_MISSING = 'MCP tool servers need the mcp package: pip install "django-agentloop[mcp]"'
#: pages of a tool listing read at most (a server whose cursor never ends can't hang a step).
MAX_LISTING_PAGES = 100
#: seconds the closing of one session may take (a stdio server gets 2 s to exit, then a kill).
CLOSE_TIMEOUT = 10.0


def require_sdk() -> None:
    """Raise ConfigurationError with the install hint when the ``mcp`` package is missing."""
    try:
        import mcp  # noqa: F401 - only whether it imports matters
    except ImportError as exc:
        raise ConfigurationError(SDK_MISSING) from exc


def _describe(exc: BaseException, settings: ServerSettings) -> str:
    """One line about a failure: the innermost error of an exception group, URL left out."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if settings.url:
        text = text.replace(settings.url, "<url>")  # a URL may carry a token
    return " ".join(text.split())[:300]


def _server_stderr() -> TextIO:
    """Where a stdio server's stderr goes: ours, when it is a real file.

    A Celery worker replaces ``sys.stderr`` with a logging proxy that has no file
    descriptor for a subprocess to inherit; the process's original stderr is used then.
    """
    for stream in (sys.stderr, sys.__stderr__):
        try:
            if stream is not None:
                stream.fileno()
                return stream
        except (AttributeError, OSError, ValueError):
            continue
    return _devnull()


@cache
def _devnull() -> TextIO:
    return open(os.devnull, "w")  # noqa: SIM115 - one per process, open for its life


@asynccontextmanager
async def _connected(settings: ServerSettings, on_elicit: Any = None) -> AsyncIterator[Client]:
    """A connected SDK client for the server; leaving closes it (and its HTTP client).

    ``on_elicit`` answers the server's questions (elicitation); without it the client does
    not offer the capability, and a server that asks anyway gets an error from the SDK.
    With it the session opens with the initialize handshake ("legacy"): in the newer
    protocol a stdio server has no channel to send a request in the middle of a call."""
    # Local: the mcp package is an optional extra, needed only once a server is used.
    from mcp import Client, StdioServerParameters, stdio_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    mode: Any = "legacy" if on_elicit is not None else "auto"
    if settings.command is not None:
        command, *args = settings.command
        parameters = StdioServerParameters(
            command=command, args=args, env=settings.env or None, cwd=settings.cwd
        )
        transport = stdio_client(parameters, errlog=_server_stderr())
        async with Client(transport, mode=mode, elicitation_callback=on_elicit) as client:
            yield client
        return
    assert settings.url is not None  # noqa: S101 - ServerSettings requires one of the two
    # The SDK leaves an HTTP client it was given open: this one is closed here.
    async with create_mcp_http_client(headers=settings.headers or None) as http:
        transport = streamable_http_client(settings.url, http_client=http)
        async with Client(transport, mode=mode, elicitation_callback=on_elicit) as client:
            yield client


class Asking:
    """How one call's server questions (MCP elicitation) reach a person, and back.

    The server's request arrives on the event loop, which must not block; it is put on
    ``questions`` and the thread waiting for the call answers it with ``answer(params,
    stop, gone)`` (a function that may wait minutes, reading the database between naps),
    then hands the result back to the loop. ``timer`` is the call's own timeout, paused
    while a person is asked: a person's minutes don't count against ``timeout``.
    """

    def __init__(self, answer: Callable[[Any, Callable[[], bool] | None, Callable[[], bool]], Any]):
        self.answer = answer
        self.questions: queue.SimpleQueue[tuple[Any, asyncio.Future[Any]]] = queue.SimpleQueue()
        self.timer: asyncio.Timeout | None = None


class _Connection:
    """One session with one server, held open by a task of its own on the loop."""

    def __init__(self, name: str, settings: ServerSettings) -> None:
        self.name = name
        self.settings = settings
        self.closed = False
        #: taken by a call (servers that may ask questions: one call per session at a time).
        self.busy = False
        #: the call in flight on this session that the server's questions are about.
        self.asking: Asking | None = None
        loop = asyncio.get_running_loop()
        self._ready: asyncio.Future[Client] = loop.create_future()
        self._stop = asyncio.Event()
        self._task = loop.create_task(self._hold(), name=f"agentloop-mcp-{name}")

    async def _hold(self) -> None:
        # The SDK's transports live in task groups that must be entered and left by one
        # task: this one, for the life of the session.
        try:
            on_elicit = self._on_elicit if self.settings.elicitation else None
            async with _connected(self.settings, on_elicit) as client:
                self._ready.set_result(client)
                await self._stop.wait()
        except asyncio.CancelledError:
            if not self._ready.done():
                self._ready.cancel()
            raise
        except BaseException as exc:  # noqa: BLE001 - a dead server may raise anything
            if not self._ready.done():
                self._ready.set_exception(exc)
        finally:
            self.closed = True

    async def _on_elicit(self, context: Any, params: Any) -> Any:
        """The server asks for input during a call: the call's thread asks a person."""
        # Local: the mcp package is an optional extra (this runs only inside its session).
        from mcp.types import ElicitResult

        asking = self.asking
        if asking is None:  # nobody to ask (a listing, or a call outside any chat)
            return ElicitResult(action="cancel")
        loop = asyncio.get_running_loop()
        reply: asyncio.Future[Any] = loop.create_future()
        asking.questions.put((params, reply))
        timer = asking.timer
        if timer is not None:
            timer.reschedule(None)
        try:
            return await reply
        finally:
            if timer is not None and not timer.expired():
                timer.reschedule(loop.time() + self.settings.timeout)

    async def client(self) -> Client:
        """The connected client; MCPServerError when the server can't be reached in time."""
        timeout = self.settings.connect_timeout
        # wait() neither cancels the shared future nor raises its error: each caller reads it.
        done, _ = await asyncio.wait([self._ready], timeout=timeout)
        if not done or self._ready.cancelled():  # cancelled: another caller's wait timed out
            await self.close()
            raise MCPServerError(f"MCP server {self.name!r} did not connect within {timeout:g} s.")
        failure = self._ready.exception()
        if failure is not None:
            raise MCPServerError(
                f"MCP server {self.name!r} is unavailable: {_describe(failure, self.settings)}"
            )
        return self._ready.result()

    async def close(self) -> None:
        """End the session (a stdio server's process exits with it)."""
        self.closed = True
        if self._ready.done():
            self._stop.set()
        else:
            self._task.cancel()
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT):
                await asyncio.wait([self._task])
        except TimeoutError:
            self._task.cancel()


class Stopped(Exception):  # noqa: N818 - a signal, not an error
    """The caller's ``stop()`` asked to give up waiting (the chat was cancelled)."""


class _Loop:
    """The process's background event loop and its open connections."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.connections: dict[str, _Connection] = {}
        #: sessions with servers that may ask questions, one call at a time each.
        self.pools: dict[str, list[_Connection]] = {}
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="agentloop-mcp", daemon=True
        )
        self.thread.start()

    def run(
        self,
        work: Callable[[], Awaitable[T]],
        timeout: float,
        stop: Callable[[], bool] | None = None,
        asking: Asking | None = None,
    ) -> T:
        """Run ``work()`` on the loop and wait for it, from any other thread.

        ``stop`` is asked every ``CANCEL_POLL_INTERVAL`` seconds while waiting; when it says
        so, the work is cancelled and :class:`Stopped` raised. The server's questions put on
        ``asking`` are answered here, in this thread; ``timeout`` starts again after each.
        """
        if threading.current_thread() is self.thread:
            raise RuntimeError("agentloop.tools.mcp can't wait for its own event loop")

        async def wrapped() -> T:
            return await work()

        future = asyncio.run_coroutine_threadsafe(wrapped(), self.loop)
        deadline = time.monotonic() + timeout
        often = stop is not None or asking is not None
        poll = max(agentloop_settings.CANCEL_POLL_INTERVAL, 0.01) if often else timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                return future.result(max(0.0, min(poll, remaining)))
            except concurrent.futures.TimeoutError:
                if asking is not None and self._answer(asking, future, stop):
                    deadline = time.monotonic() + timeout  # a person's time doesn't count
                    continue
                if stop is not None and stop():
                    future.cancel()
                    raise Stopped from None
                if remaining <= poll:
                    # The loop's own timeouts come first; this only guards against a stuck loop.
                    future.cancel()
                    raise MCPServerError(f"MCP call did not finish within {timeout:g} s.") from None

    def _answer(
        self,
        asking: Asking,
        future: concurrent.futures.Future[Any],
        stop: Callable[[], bool] | None,
    ) -> bool:
        """Answer the questions waiting on ``asking``; whether there were any."""
        # Local: the mcp package is an optional extra (a question comes only through it).
        from mcp.types import ElicitResult

        answered = False
        while True:
            try:
                params, reply = asking.questions.get_nowait()
            except queue.Empty:
                return answered
            try:
                result = asking.answer(params, stop, future.done)
            except BaseException:
                # Stopped (a cancel), or the database failed: the server hears "cancel",
                # the call is given up, and the caller sees why.
                self.loop.call_soon_threadsafe(_settle, reply, ElicitResult(action="cancel"))
                future.cancel()
                raise
            self.loop.call_soon_threadsafe(_settle, reply, result)
            answered = True

    async def connection(self, name: str, settings: ServerSettings) -> _Connection:
        """The open connection to ``name``; a new one after a failure or a settings change.

        A server that may ask questions gets an idle session of its own per call (opened
        when all are busy): the SDK does not say which call a question is about, so a
        session carries one call at a time. Give it back with :meth:`done_with`."""
        if settings.elicitation:
            return await self._idle(name, settings)
        current = self.connections.get(name)
        if current is not None and not current.closed and current.settings.key == settings.key:
            return current
        # Replaced before the first await, so callers arriving meanwhile share the new one.
        created = self.connections[name] = _Connection(name, settings)
        if current is not None:
            await current.close()
        return created

    async def _idle(self, name: str, settings: ServerSettings) -> _Connection:
        pool = self.pools.setdefault(name, [])
        for stale in [c for c in pool if c.closed or c.settings.key != settings.key]:
            pool.remove(stale)
            if not stale.busy:  # a busy one is closed when its call gives it back
                await stale.close()
        for connection in pool:
            if not connection.busy:
                connection.busy = True
                return connection
        created = _Connection(name, settings)
        created.busy = True
        pool.append(created)
        return created

    async def done_with(self, connection: _Connection) -> None:
        """A call is over with ``connection``: idle again, or closed if it was replaced."""
        connection.busy, connection.asking = False, None
        if connection.settings.elicitation and connection not in self.pools.get(
            connection.name, []
        ):
            await connection.close()

    async def close_all(self) -> None:
        connections, self.connections = list(self.connections.values()), {}
        pools, self.pools = self.pools, {}
        connections += [connection for pool in pools.values() for connection in pool]
        for connection in connections:
            await connection.close()


def _settle(reply: asyncio.Future[Any], result: Any) -> None:
    if not reply.done():
        reply.set_result(result)


#: this process's loop thread and its sessions. A forked child opens sessions of its own; the
#: parent's stdio servers stay the parent's (their pipes close only with its sessions).
_state = PerProcess(_Loop)


def _wait_limit(settings: ServerSettings) -> float:
    """How long a caller waits at most: connecting and calling, plus room to close."""
    return settings.connect_timeout + settings.timeout + CLOSE_TIMEOUT


def _request(
    name: str,
    settings: ServerSettings,
    doing: str,
    use: Callable[[Client], Awaitable[T]],
    stop: Callable[[], bool] | None = None,
    asking: Asking | None = None,
) -> T:
    """Run ``use(client)`` on server ``name``'s session; every failure is an MCPServerError
    saying what could not be done (``doing``: "run 'read_file'", "list its tools")."""
    require_sdk()
    state = _state.get()

    async def work() -> T:
        connection = await state.connection(name, settings)
        try:
            return await using(connection)
        finally:
            await state.done_with(connection)

    async def using(connection: _Connection) -> T:
        # Local: the mcp package is an optional extra (require_sdk() checked it is there).
        from mcp import MCPError

        client = await connection.client()
        connection.asking = asking
        try:
            async with asyncio.timeout(settings.timeout) as timer:
                if asking is not None:
                    asking.timer = timer
                return await use(client)
        except TimeoutError:
            raise MCPServerError(
                f"MCP server {name!r} did not {doing} within {settings.timeout:g} s."
            ) from None
        except MCPError as exc:  # an answer, if a refusal: the session itself is fine
            raise MCPServerError(
                f"MCP server {name!r} refused to {doing}: {_describe(exc, settings)}"
            ) from None
        except Exception as exc:
            await connection.close()  # broken: the next call reconnects
            raise MCPServerError(
                f"MCP server {name!r} failed to {doing}: {_describe(exc, settings)}"
            ) from None

    async def logged() -> T:
        try:
            return await work()
        except MCPServerError as exc:
            # The message names the server, never its URL, environment or headers.
            logger.warning("%s", exc)
            raise

    return state.run(logged, _wait_limit(settings), stop, asking)


def call_tool(
    name: str,
    settings: ServerSettings,
    tool: str,
    arguments: dict[str, Any],
    stop: Callable[[], bool] | None = None,
    asking: Asking | None = None,
) -> CallToolResult:
    """Call ``tool`` on server ``name``; MCPServerError when it is down or too slow,
    :class:`Stopped` when ``stop()`` says so while it runs. Questions the server asks
    meanwhile are answered through ``asking`` (none: "cancel")."""

    async def use(client: Client) -> CallToolResult:
        return await client.call_tool(tool, arguments)

    return _request(name, settings, f"run {tool!r}", use, stop, asking)


def list_tools(name: str, settings: ServerSettings) -> list[RemoteTool]:
    """Every tool server ``name`` offers (all pages of its listing)."""

    async def use(client: Client) -> list[RemoteTool]:
        found: list[RemoteTool] = []
        cursor: str | None = None
        for _ in range(MAX_LISTING_PAGES):
            page = await client.list_tools(cursor=cursor, cache_mode="refresh")
            found.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
        return found

    return _request(name, settings, "list its tools", use)


def close_connections() -> None:
    """Close every open MCP session of this process (stdio servers exit); the next call
    opens new ones. For tests, and for code that changes servers at run time."""
    state = _state.peek()
    if state is not None and state.thread.is_alive():
        state.run(state.close_all, CLOSE_TIMEOUT * (len(state.connections) + 1))


atexit.register(close_connections)

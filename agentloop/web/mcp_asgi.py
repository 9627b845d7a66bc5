"""The agents served over MCP's streamable HTTP, mounted beside Django (docs/mcp.md).

::

    # myproject/asgi.py
    from django.core.asgi import get_asgi_application
    from agentloop.web.mcp_asgi import mount_mcp

    application = mount_mcp(get_asgi_application(), path="/mcp")

Requests under ``path`` go to the MCP endpoint; everything else to the application given.
Each request must carry ``Authorization: Bearer <token>``, a token of ``MCPToken`` (made in
the admin or by ``manage.py agentloop mcp-token``); without one, or with a token that is
unknown, revoked or whose user is inactive, the answer is a 401 and nothing runs. A
session is bound to the user who opened it: another user's request naming it gets a 404.

The SDK's session manager starts with the server's ASGI lifespan (uvicorn sends it), or at
the first request under servers that send none (daphne); the lifespan is not passed on to
the application (Django's handler refuses it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connections

__all__ = ["MCPMount", "mount_mcp"]

#: the scope key the request's user pk is put under (read by the server's handlers).
SCOPE_USER_KEY = "agentloop.mcp_user"


Scope = dict[str, Any]
Receive = Any
Send = Any


def mount_mcp(application: Any, path: str = "/mcp") -> MCPMount:
    """``application`` with the MCP endpoint at ``path`` (and the paths under it)."""
    return MCPMount(application, path)


def _authenticate(header: str) -> Any:
    """The pk of the user a ``Bearer`` header's token belongs to, or None."""
    # Local: the models need the app registry, ready once the ASGI application is made.
    from ..models import MCPToken

    scheme, _, raw = header.partition(" ")
    if scheme.lower() != "bearer" or not raw.strip():
        return None
    try:
        user = MCPToken.objects.authenticate(raw.strip())
    finally:
        connections.close_all()  # this worker thread holds no connection afterwards
    return None if user is None else user.pk


class MCPMount:
    """An ASGI application: the MCP endpoint at ``path``, ``application`` elsewhere."""

    def __init__(self, application: Any, path: str = "/mcp") -> None:
        self.application = application
        self.path = "/" + path.strip("/")
        self._manager: Any = None
        self._lock = asyncio.Lock()
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    def serves(self, scope: Scope) -> bool:
        path: str = scope.get("path", "")
        return path == self.path or path.startswith(self.path + "/")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http" and self.serves(scope):
            await self._serve(scope, receive, send)
        else:
            await self.application(scope, receive, send)

    # -- the session manager's life ---------------------------------------------------------
    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.start()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def start(self) -> None:
        """Start the SDK's session manager (once; later calls return at once)."""
        async with self._lock:
            if self._task is not None:
                return
            # Local: the mcp SDK is an optional extra, imported once the endpoint is used.
            from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

            # Local: the server module imports the mcp SDK (the mcp extra) and the models.
            from ._mcp_server import build_server

            manager = StreamableHTTPSessionManager(app=build_server(_user_of_request))
            ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._stop = asyncio.Event()
            stop = self._stop

            async def hold() -> None:
                # The manager's task group is entered and left by this one task.
                try:
                    async with manager.run():
                        ready.set_result(None)
                        await stop.wait()
                except BaseException as exc:
                    if not ready.done():
                        ready.set_exception(exc)
                    raise

            self._task = asyncio.get_running_loop().create_task(hold(), name="agentloop-mcp")
            await ready
            self._manager = manager

    async def stop(self) -> None:
        """Stop the session manager: open sessions end, calls in flight are cancelled."""
        if self._task is None or self._stop is None:
            return
        self._stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    # -- a request --------------------------------------------------------------------------
    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        header = ""
        for key, value in scope.get("headers", []):
            if key == b"authorization":
                header = value.decode("latin-1")
        user_pk = await sync_to_async(_authenticate, thread_sensitive=False)(header)
        if user_pk is None:
            await _refuse(send, "A valid token is required: Authorization: Bearer <token>.")
            return
        await self.start()
        # Local: the mcp SDK is an optional extra, imported once the endpoint is used.
        from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
        from mcp.server.auth.provider import AccessToken

        # The SDK binds a session to the principal that opened it: here, the user.
        # (The token itself is not kept: the session is the user's, whichever token.)
        principal = AccessToken(
            token="-",  # noqa: S106 - a placeholder: no token is kept on the request
            client_id=f"user-{user_pk}",
            scopes=[],
            subject=str(user_pk),
        )
        scope = {**scope, "user": AuthenticatedUser(principal), SCOPE_USER_KEY: user_pk}
        await self._manager.handle_request(scope, receive, send)


def _user_of_request(ctx: Any) -> Any:
    request = getattr(ctx, "request", None)
    return None if request is None else request.scope.get(SCOPE_USER_KEY)


async def _refuse(send: Send, text: str) -> None:
    body = json.dumps({"error": "unauthorized", "error_description": text}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"www-authenticate", b'Bearer error="invalid_token"'),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})

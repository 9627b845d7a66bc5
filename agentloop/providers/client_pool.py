"""A provider's model calls as lanes: one httpx client per connection in flight.

httpcore's connection pool looks at every connection it holds each time a request starts
and each time a response ends: it polls each idle one for a close by the server, and counts
the idle ones again for each of them. With hundreds of model calls in flight in one process
(a ``gevent`` worker), one client's pool cost more CPU than the rest of the step
(``bench/in_flight.py``). A lane is a client that holds one connection; a call takes an idle
lane (or makes one) and gives it back, so the work per call is the same at any concurrency.

At most ``size`` lanes are out at once (``PROVIDERS[name]["max_connections"]``): a call past
that waits for one, as long as the pool timeout allows, then fails with ``httpx.PoolTimeout``
like httpx's own pool. ``keep`` idle lanes stay, their connections alive for the next calls;
every client shares the process's TLS context (``tls_context``: the CA bundle loaded once).
Async calls take lanes of their event loop (``alane``), kept until the loop shuts down, and
``size`` bounds each loop's async calls as it bounds the process's sync ones.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from itertools import islice
from typing import Any

import httpx

__all__ = ["Lanes", "read_to_the_end", "tls_context"]

#: What a stream may still send after the answer's last event before the connection is
#: dropped rather than read on (normally nothing: the body's end).
_EVENTS_AFTER_THE_ANSWER = 16


_tls: Any = None
_tls_lock = threading.Lock()


def tls_context() -> Any:
    """This process's TLS context for provider clients, made on first use: reading the CA
    bundle costs about 30 ms of CPU, once rather than for every client (an async model
    call makes one)."""
    global _tls
    if _tls is None:
        with _tls_lock:
            if _tls is None:
                _tls = httpx.create_ssl_context()
    return _tls


class Lanes:
    """Clients of one connection each, within ``limits`` (``max_connections`` out at once,
    ``max_keepalive_connections`` kept idle); ``client`` is ``httpx.Client``'s arguments."""

    def __init__(self, limits: httpx.Limits, **client: Any) -> None:
        self._client = {
            **client,
            "limits": httpx.Limits(max_connections=1, max_keepalive_connections=1),
            "verify": tls_context(),  # the CA bundle, read once for every lane
        }
        self._keep = limits.max_keepalive_connections or 0
        self._size = limits.max_connections or 100
        self._free = threading.BoundedSemaphore(self._size)
        self._lock = threading.Lock()
        self._idle: list[httpx.Client] = []
        # Async lanes: an AsyncClient belongs to the loop it first ran on, so idle ones are
        # kept per loop, and closed as the loop shuts down its async generators (``keepers``).
        self._async_idle: weakref.WeakKeyDictionary[Any, list[httpx.AsyncClient]] = (
            weakref.WeakKeyDictionary()
        )
        self._async_free: weakref.WeakKeyDictionary[Any, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )
        self._keepers: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()

    @contextmanager
    def lane(self, wait: float | None) -> Iterator[httpx.Client]:
        """A client for one call (its response read or closed inside the block); waits up to
        ``wait`` seconds (None: no limit) while every lane is out."""
        if not self._free.acquire(timeout=wait):
            raise httpx.PoolTimeout(f"no connection came free in {wait:g} s")
        try:
            with self._lock:
                client = self._idle.pop() if self._idle else None
            if client is None:
                client = httpx.Client(**self._client)
            try:
                yield client
            finally:
                self._give_back(client)
        finally:
            self._free.release()

    @asynccontextmanager
    async def alane(self, wait: float | None = None) -> AsyncIterator[httpx.AsyncClient]:
        """``lane`` for an async call, from the running loop's own lanes: at most ``size``
        out at once per loop (waiting up to ``wait`` seconds, None: no limit); up to
        ``keep`` idle ones per loop stay open until it shuts down (``asyncio.run``,
        asgiref's ``async_to_sync`` and ASGI servers do as they end)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            idle = self._async_idle.get(loop)
            if new_loop := idle is None:
                idle = self._async_idle[loop] = []
                self._async_free[loop] = asyncio.Semaphore(self._size)
            free = self._async_free[loop]
        if new_loop:
            keeper = _closing_at_shutdown(idle)  # the loop's shutdown closes what it kept
            await keeper.__anext__()
            with self._lock:
                self._keepers[loop] = keeper  # held: a collected one would close them now
        try:
            async with asyncio.timeout(wait):
                await free.acquire()
        except TimeoutError:
            raise httpx.PoolTimeout(f"no connection came free in {wait:g} s") from None
        try:
            client = idle.pop() if idle else httpx.AsyncClient(**self._client)
            try:
                yield client
            finally:
                if not client.is_closed and len(idle) < self._keep:
                    idle.append(client)
                else:
                    await client.aclose()
        finally:
            free.release()

    def _give_back(self, client: httpx.Client) -> None:
        with self._lock:
            if not client.is_closed and len(self._idle) < self._keep:
                self._idle.append(client)  # the last in is the next out: its connection is warm
                return
        client.close()

    def close(self) -> None:
        """Close the idle lanes (the ones out close as they come back; async ones kept by a
        loop close with it)."""
        with self._lock:
            idle, self._idle = self._idle, []
            self._keep = 0
        for client in idle:
            client.close()


async def _closing_at_shutdown(idle: list[httpx.AsyncClient]) -> AsyncIterator[None]:
    try:
        yield
    finally:
        clients, idle[:] = list(idle), []
        for client in clients:
            await client.aclose()


def read_to_the_end(events: Iterator[Any]) -> None:
    """Read what follows a streamed answer's last event (``[DONE]``, ``message_stop``): the
    end of the chunked body. httpx gives a connection back to its client only from a
    response read to its end; one closed before is dropped, and the next model call would
    connect (and shake hands over TLS) again."""
    try:
        for _ in islice(events, _EVENTS_AFTER_THE_ANSWER):
            pass
    except (httpx.HTTPError, httpx.StreamError):
        pass  # the answer is whole; only this connection's reuse is lost

"""A provider's model calls go through lanes (agentloop/providers/client_pool.py): one client and
one connection per call in flight, at most ``max_connections`` at once, idle ones kept for
the next calls. A real HTTP/1.1 server on localhost answers after a pause and counts the
requests in progress and the connections it accepted."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from agentloop.exceptions import ProviderTimeout
from agentloop.messages import Message, ModelRequest
from agentloop.providers.openai import OpenAIProvider
from tests.providers.local_servers import CountingServer, KeepAliveHandler, serving


class _Slow(CountingServer):
    def __init__(self, pause: float) -> None:
        super().__init__(_Answer)
        self.pause = pause
        self.in_progress = self.most_at_once = 0
        # With ``hold`` set, no answer goes before that many requests came in (or 10 s passed):
        # calls "at once" then are, however slowly a loaded machine starts their threads.
        self.hold = self.arrived = 0
        self.all_in = threading.Condition(self.lock)


class _Answer(KeepAliveHandler):
    server: _Slow

    def do_POST(self) -> None:  # noqa: N802 - the handler's API
        self.rfile.read(int(self.headers.get("content-length", 0)))
        with self.server.lock:
            self.server.in_progress += 1
            self.server.most_at_once = max(self.server.most_at_once, self.server.in_progress)
            self.server.arrived += 1
            self.server.all_in.notify_all()
            self.server.all_in.wait_for(lambda: self.server.arrived >= self.server.hold, 10)
        time.sleep(self.server.pause)
        with self.server.lock:
            self.server.in_progress -= 1
        message = {"role": "assistant", "content": "ok"}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        usage = {"prompt_tokens": 1, "completion_tokens": 1}
        body = json.dumps({"choices": [choice], "usage": usage}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def slow() -> Iterator[_Slow]:
    with serving(_Slow(pause=0.3)) as server:
        yield server


def _provider(settings: Any, server: _Slow, **options: Any) -> OpenAIProvider:
    settings.AGENTLOOP = {**settings.AGENTLOOP, "PROVIDERS": {"lanes": options}}
    return OpenAIProvider(name="lanes", base_url=f"{server.url}/v1", api_key="test-key")


def _calls_at_once(provider: OpenAIProvider, count: int) -> list[Any]:
    request = ModelRequest(model="m", messages=[Message(role="user", content="hi")])
    results: list[Any] = [None] * count

    def call(index: int) -> None:
        try:
            results[index] = provider.request(request).content
        except Exception as exc:
            results[index] = exc

    threads = [threading.Thread(target=call, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


def _async_calls_at_once(provider: OpenAIProvider, count: int) -> list[Any]:
    import asyncio

    request = ModelRequest(model="m", messages=[Message(role="user", content="hi")])

    async def calls() -> list[Any]:
        answers = await asyncio.gather(
            *(provider.arequest(request) for _ in range(count)), return_exceptions=True
        )
        return [a if isinstance(a, BaseException) else a.content for a in answers]

    return asyncio.run(calls())


@pytest.fixture(params=["sync", "async"])
def calls_at_once(request: pytest.FixtureRequest) -> Any:
    """Calls at once from threads, or from coroutines on one loop (an ASGI process's)."""
    return _calls_at_once if request.param == "sync" else _async_calls_at_once


def test_no_more_calls_than_max_connections_are_in_flight_and_the_rest_wait(
    settings, slow, calls_at_once
):
    provider = _provider(settings, slow, max_connections=2)
    try:
        assert calls_at_once(provider, 5) == ["ok"] * 5
    finally:
        provider.close()
    assert slow.most_at_once == 2
    assert slow.connections == 2  # the waiting calls took the lanes the first ones gave back


def test_a_call_waiting_longer_than_the_pool_timeout_fails_as_a_timeout(
    settings, slow, calls_at_once
):
    provider = _provider(settings, slow, max_connections=1, timeout=httpx.Timeout(10, pool=0.05))
    try:
        results = calls_at_once(provider, 2)
    finally:
        provider.close()
    assert results.count("ok") == 1
    (failed,) = [result for result in results if result != "ok"]
    assert isinstance(failed, ProviderTimeout)
    assert str(failed) == "lanes did not answer in time (PoolTimeout)"


def test_idle_lanes_beyond_the_keep_alive_count_are_closed(settings, slow):
    """Without ``max_connections``, httpx's defaults: 100 at once, 20 kept alive."""
    provider = _provider(settings, slow)
    try:
        slow.hold = 25
        assert _calls_at_once(provider, 25) == ["ok"] * 25
        assert slow.connections == 25
        slow.arrived = 0
        assert _calls_at_once(provider, 25) == ["ok"] * 25
        assert slow.connections == 30  # 20 lanes kept their connections; 5 were made again
    finally:
        provider.close()


def test_every_client_shares_one_tls_context_and_async_calls_make_none(settings, monkeypatch):
    """Reading the CA bundle costs about 30 ms of CPU: once per process, not once per lane or
    per async model call (each makes a client of its own)."""
    import asyncio
    import ssl

    from agentloop.providers import client_pool

    loads: list[Any] = []
    load = ssl.SSLContext.load_verify_locations

    def counted(context: ssl.SSLContext, *args: Any, **kwargs: Any) -> Any:
        loads.append(context)
        return load(context, *args, **kwargs)

    monkeypatch.setattr(client_pool, "_tls", None)
    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counted)
    request = ModelRequest(model="m", messages=[Message(role="user", content="hi")])
    with serving(_Slow(pause=0)) as server:
        provider = _provider(settings, server)
        try:

            async def three() -> list[str]:
                return [(await provider.arequest(request)).content for _ in range(3)]

            assert asyncio.run(three()) == ["ok"] * 3
            assert _calls_at_once(provider, 3) == ["ok"] * 3
        finally:
            provider.close()
    assert loads == [client_pool.tls_context()]  # the CA bundle, read once


def test_async_calls_on_one_loop_keep_their_connections_until_the_loop_ends(settings):
    """An AsyncClient belongs to its loop: each loop's calls share its kept connections (a
    TCP and TLS handshake per call otherwise), which close as the loop shuts down."""
    import asyncio

    from tests.helpers import wait_until

    request = ModelRequest(model="m", messages=[Message(role="user", content="hi")])
    with serving(_Slow(pause=0.05)) as server:
        provider = _provider(settings, server)

        async def calls() -> list[str]:
            at_once = await asyncio.gather(*(provider.arequest(request) for _ in range(3)))
            one_by_one = [await provider.arequest(request) for _ in range(4)]
            return [answer.content for answer in (*at_once, *one_by_one)]

        try:
            assert asyncio.run(calls()) == ["ok"] * 7
            assert server.connections == 3  # three at once; the four after took them again
            wait_until(lambda: server.closed == 3, "the loop's connections to close with it")
            assert asyncio.run(calls()) == ["ok"] * 7  # a new loop: connections of its own
            assert server.connections == 6
            wait_until(lambda: server.closed == 6, "the second loop's connections to close")
        finally:
            provider.close()

"""Every model call is bounded: a total deadline, a cancel that closes the response, and a
per-process limit of calls in flight per provider (``MODEL_CALL_TIMEOUT``,
``MODEL_CONCURRENCY``).

Against a tiny real HTTP server whose SSE endpoint sends only ``: keep-alive`` comments (the
provider that held a worker forever), sync and async, in this process and from a worker
process cancelled over Redis.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.db import connections

import agentloop
from agentloop import providers
from agentloop.conf import settings_errors
from agentloop.exceptions import CancelledError, ConfigurationError, ProviderTimeout
from agentloop.messages import ModelRequest, ModelResponse
from agentloop.models import Chat
from agentloop.providers import ChunkCallback, Provider
from agentloop.providers.call_slots import slots_for
from agentloop.providers.openai import OpenAIProvider
from tests.helpers import wait_until
from tests.processes import run_script, start_script, summary
from tests.sse_reading import REDIS_URL  # the Redis the event tests use

#: generous bound of every wait (a loaded 2-core machine).
DEADLINE = 60.0


def finishes(function: Callable[[], Any], timeout: float = DEADLINE) -> Any:
    """Run ``function`` on a thread; what it returned or raised, or AssertionError when it
    is still running after ``timeout`` seconds (it would hang the test otherwise)."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = function()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"still running after {timeout} s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


# -- a provider that sends only keep-alive comments ----------------------------------------
class KeepAliveServer(ThreadingHTTPServer):
    """Answers every POST with an SSE stream of ``: keep-alive`` comments, forever."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _KeepAlive)
        self.requests = 0
        self.in_flight: dict[str, int] = {}
        #: the most requests for each model answered at once.
        self.most: dict[str, int] = {}
        self.lock = threading.Lock()
        #: requests whose client closed the connection while comments were still coming.
        self.closed_by_client = 0
        self.stopping = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _KeepAlive(BaseHTTPRequestHandler):
    server: KeepAliveServer

    def do_POST(self) -> None:  # noqa: N802 - the handler's API
        model = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))["model"]
        server = self.server
        with server.lock:
            server.requests += 1
            server.in_flight[model] = server.in_flight.get(model, 0) + 1
            server.most[model] = max(server.most.get(model, 0), server.in_flight[model])
        try:
            self._comments()
        finally:
            with server.lock:
                server.in_flight[model] -= 1

    def _comments(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        try:
            while not self.server.stopping.is_set():
                self.wfile.write(b": keep-alive\n\n")
                self.wfile.flush()
                time.sleep(0.05)
        except OSError:
            self.server.closed_by_client += 1

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the handler's API
        return None


@pytest.fixture
def keepalive(settings) -> Iterator[KeepAliveServer]:
    """The server, registered as provider "keepalive" (one attempt per call: no retries)."""
    server = KeepAliveServer()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    providers.register("keepalive", OpenAIProvider(base_url=server.url, api_key="test-key"))
    settings.AGENTLOOP = {**settings.AGENTLOOP, "MODEL_RETRIES": 0}
    try:
        yield server
    finally:
        providers.unregister("keepalive")
        server.stopping.set()
        server.shutdown()
        server.server_close()


def with_call_timeout(settings, seconds: float) -> None:
    settings.AGENTLOOP = {
        **settings.AGENTLOOP,
        "PROVIDERS": {**settings.AGENTLOOP.get("PROVIDERS", {}), "keepalive": {
            "call_timeout": seconds}},
    }  # fmt: skip


def ignore(chunk: Any) -> None:
    return None


def test_keep_alive_comments_do_not_extend_a_sync_call_past_its_deadline(keepalive, settings):
    with_call_timeout(settings, 1)
    chat = agentloop.chat("keepalive:model")

    with pytest.raises(ProviderTimeout, match=r"longer than its 1 s deadline \(MODEL_CALL_TIMEOUT"):
        finishes(lambda: chat.ask("Hi", stream=ignore))
    wait_until(lambda: keepalive.closed_by_client == 1, "the connection to be closed")


def test_keep_alive_comments_do_not_extend_an_async_call_past_its_deadline(keepalive, settings):
    with_call_timeout(settings, 1)
    chat = agentloop.chat("keepalive:model")

    with pytest.raises(ProviderTimeout, match="MODEL_CALL_TIMEOUT"):
        finishes(lambda: asyncio.run(chat.aask("Hi", stream=ignore)))
    wait_until(lambda: keepalive.closed_by_client == 1, "the connection to be closed")


def test_a_non_streamed_call_ends_at_its_deadline_too(keepalive, settings):
    with_call_timeout(settings, 1)
    chat = agentloop.chat("keepalive:model")

    with pytest.raises(ProviderTimeout, match="MODEL_CALL_TIMEOUT"):
        finishes(lambda: chat.ask("Hi"))


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_cancel_closes_a_response_that_sends_only_keep_alives(keepalive, mode):
    chat = agentloop.chat("keepalive:model")  # the default deadline: 600 s
    if mode == "sync":
        run: Callable[[], Any] = lambda: chat.ask("Hi", stream=ignore)  # noqa: E731
    else:
        run = lambda: asyncio.run(chat.aask("Hi", stream=ignore))  # noqa: E731
    canceller = threading.Thread(
        target=lambda: (wait_until(lambda: keepalive.requests == 1, "the call"), chat.cancel())
    )
    canceller.start()

    with pytest.raises(CancelledError):
        finishes(run)
    canceller.join()
    wait_until(lambda: keepalive.closed_by_client == 1, "the connection to be closed")
    assert [m.role for m in chat.messages] == ["user"]


@pytest.mark.django_db(transaction=True)
def test_a_halt_lets_the_model_call_in_flight_go_on(keepalive, settings, user):
    """A halt stops the run before its next model call, not during one: its notice makes
    the run read the row, it doesn't abort the call (which here ends at its deadline)."""
    with_call_timeout(settings, 2)
    chat = Chat.objects.create(model="keepalive:model", owner=user)

    def halt_it() -> None:
        wait_until(lambda: keepalive.requests == 1, "the call")
        assert Chat.objects.get(pk=chat.pk).halt("enough")
        connections.close_all()

    halter = threading.Thread(target=halt_it)
    halter.start()

    def ask() -> None:
        try:
            chat.ask("Hi", stream=ignore)
        finally:
            connections.close_all()

    with pytest.raises(ProviderTimeout, match="MODEL_CALL_TIMEOUT"):
        finishes(ask)
    halter.join()


@pytest.mark.django_db(transaction=True)
def test_a_cancel_from_another_process_stops_a_worker_stuck_on_keep_alives(keepalive, user):
    """A worker's step (``run_step``) whose provider sends only comments: the cancel made
    here reaches it over Redis and closes the response (the flag is read every 600 s)."""
    redis = pytest.importorskip("redis")
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1).ping()
    except redis.RedisError:
        pytest.skip(f"Redis does not answer at {REDIS_URL}")
    chat = Chat.objects.create(model="keepalive:model", owner=user)
    chat.ask_later("Hi")
    Chat.objects.filter(pk=chat.pk).update(state="queued")  # as complete_later() leaves it
    provider = {"class": "agentloop.providers.openai.OpenAIProvider",
                "base_url": keepalive.url, "api_key": "test-key"}  # fmt: skip
    worker_settings = {"REDIS_URL": REDIS_URL, "CANCEL_POLL_INTERVAL": 600, "MODEL_RETRIES": 0,
                       "PROVIDERS": {"keepalive": provider}}  # fmt: skip
    worker = start_script(
        "concurrent_steps.py", chat.pk, env={"AGENTLOOP_TEST_SETTINGS": json.dumps(worker_settings)}
    )
    try:
        wait_until(lambda: keepalive.requests == 1, "the worker's call")
        with override_redis(REDIS_URL):
            assert Chat.objects.get(pk=chat.pk).cancel()
        output, errors = worker.communicate(timeout=DEADLINE)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()  # reaps it and closes its pipes

    assert summary(output)["actions"] == {str(chat.pk): "cancelled"}, errors
    assert keepalive.closed_by_client == 1
    assert list(chat.usage_records.values_list("status", flat=True)) == ["cancelled"]


def override_redis(url: str) -> Any:
    from django.conf import settings
    from django.test import override_settings

    return override_settings(AGENTLOOP={**settings.AGENTLOOP, "REDIS_URL": url})


# -- MODEL_CONCURRENCY -----------------------------------------------------------------------
class Gate(Provider):
    """Holds every call until ``open`` is set; counts the calls in flight."""

    name = "gate"

    def __init__(self) -> None:
        self.open = threading.Event()
        self.in_flight = 0
        self.most = 0
        self._lock = threading.Lock()

    def request(
        self, request: ModelRequest, *, on_chunk: ChunkCallback | None = None
    ) -> ModelResponse:
        with self._lock:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
        try:
            self.open.wait(DEADLINE)
            return ModelResponse(content="through")
        finally:
            with self._lock:
                self.in_flight -= 1


@pytest.fixture
def gate() -> Iterator[Gate]:
    provider = providers.register("gate", Gate())
    assert isinstance(provider, Gate)
    yield provider
    provider.open.set()
    providers.unregister("gate")


def limit(settings, **extra: Any) -> None:
    settings.AGENTLOOP = {**settings.AGENTLOOP, **extra}


def test_no_more_calls_than_the_providers_limit_run_at_once(gate, settings):
    limit(settings, MODEL_CONCURRENCY={"gate": 2})
    chats = [agentloop.chat("gate:model") for _ in range(5)]
    answers: list[str] = []
    threads = [
        threading.Thread(target=lambda chat=chat: answers.append(chat.ask("Hi").content))
        for chat in chats
    ]
    for thread in threads:
        thread.start()
    [slots] = slots_for("gate", "model")
    wait_until(lambda: gate.in_flight == 2 and slots.waiting == 3, "two calls and three waiting")

    gate.open.set()
    for thread in threads:
        thread.join(DEADLINE)

    assert answers == ["through"] * 5  # waiting for a slot is not a failure
    assert gate.most == 2
    assert (slots.taken, slots.waiting) == (0, 0)


def test_coroutines_and_threads_share_one_limit(gate, settings):
    limit(settings, MODEL_CONCURRENCY={"default": 1})

    async def three() -> list[str]:
        chats = [agentloop.chat("gate:model") for _ in range(3)]
        answers = await asyncio.gather(*(chat.aask("Hi") for chat in chats))
        return [answer.content for answer in answers]

    in_a_thread = threading.Thread(target=lambda: agentloop.chat("gate:model").ask("Hi"))
    in_a_thread.start()
    [slots] = slots_for("gate", "model")
    opener = threading.Thread(
        target=lambda: (wait_until(lambda: slots.waiting == 3, "three waiting"), gate.open.set())
    )
    opener.start()

    assert finishes(lambda: asyncio.run(three())) == ["through"] * 3
    in_a_thread.join(DEADLINE)
    opener.join()
    assert gate.most == 1


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_cancel_stops_a_call_waiting_for_a_slot(gate, settings, mode):
    limit(settings, MODEL_CONCURRENCY={"gate:model": 1})
    holder = threading.Thread(target=lambda: agentloop.chat("gate:model").ask("Hi"))
    holder.start()
    wait_until(lambda: gate.in_flight == 1, "the first call")
    waiting = agentloop.chat("gate:model")
    if mode == "sync":
        run: Callable[[], Any] = lambda: waiting.ask("Hi")  # noqa: E731
    else:
        run = lambda: asyncio.run(waiting.aask("Hi"))  # noqa: E731
    [slots] = slots_for("gate", "model")
    threading.Thread(
        target=lambda: (wait_until(lambda: slots.waiting == 1, "a wait"), waiting.cancel())
    ).start()

    with pytest.raises(CancelledError):
        finishes(run)
    assert (gate.in_flight, slots.waiting) == (1, 0)  # the first call holds its slot on
    gate.open.set()
    holder.join(DEADLINE)
    assert slots.taken == 0


def test_waiting_for_a_slot_counts_against_the_calls_deadline(gate, settings):
    limit(
        settings,
        MODEL_CONCURRENCY={"gate": 1},
        MODEL_RETRIES=0,
        PROVIDERS={"gate": {"call_timeout": 1}},
    )
    holder = threading.Thread(target=lambda: agentloop.chat("gate:model").ask("Hi"))
    holder.start()
    wait_until(lambda: gate.in_flight == 1, "the first call")

    with pytest.raises(ProviderTimeout, match=r"no model-call slot came free"):
        finishes(lambda: agentloop.chat("gate:model").ask("Hi"))
    gate.open.set()
    holder.join(DEADLINE)


def test_a_model_limit_and_its_providers_limit_both_apply(settings):
    limit(settings, MODEL_CONCURRENCY={"openai": 50, "openai:gpt-4.1": 10, "default": 5})

    assert [(s.name, s.size) for s in slots_for("openai", "gpt-4.1")] == [
        ("openai:gpt-4.1", 10),
        ("openai", 50),
    ]
    assert [(s.name, s.size) for s in slots_for("openai", "o3")] == [("openai", 50)]
    assert [(s.name, s.size) for s in slots_for("anthropic", "claude")] == [("anthropic", 5)]


def test_model_concurrency_and_call_timeout_are_validated():
    assert settings_errors({"MODEL_CONCURRENCY": {"openai": 0}})["MODEL_CONCURRENCY"]
    assert (
        "'openai:' is not 'default'"
        in settings_errors({"MODEL_CONCURRENCY": {"openai:": 3}})["MODEL_CONCURRENCY"]
    )
    assert settings_errors({"MODEL_CALL_TIMEOUT": "600"})["MODEL_CALL_TIMEOUT"]
    assert settings_errors({"MODEL_CONCURRENCY": {"openai": None, "default": 8}}) == {}
    assert settings_errors({"MODEL_CALL_TIMEOUT": None}) == {}


def test_under_gevent_calls_wait_for_slots_end_at_deadlines_and_stop_at_a_cancel(keepalive):
    pytest.importorskip("gevent", reason="gevent runs the gevent pool (pip install gevent)")

    done = run_script("gevent_calls.py", keepalive.url, timeout=DEADLINE * 3)

    reported = summary(done.stdout + done.stderr)
    outcomes = reported["outcomes"]
    *bounded, cancelled = outcomes
    assert all(o.startswith("ProviderTimeout: keepalive:") for o in bounded), outcomes
    assert any("no model-call slot came free" in o for o in bounded), outcomes
    assert cancelled.startswith("CancelledError"), outcomes
    # Eight greenlets, three calls at once in the process; the server saw them overlap (its
    # count may show one more: a handler notices a timed-out client at its next write).
    assert reported["most"] == 3
    assert keepalive.most["model"] >= 3


def test_a_providers_call_timeout_that_is_not_seconds_is_a_clear_error(gate, settings):
    limit(settings, PROVIDERS={"gate": {"call_timeout": "soon"}})

    with pytest.raises(ConfigurationError) as raised:
        agentloop.chat("gate:model").ask("Hi")

    assert str(raised.value) == (
        "AGENTLOOP['PROVIDERS']['gate']['call_timeout'] must be a positive number of seconds "
        "or None, not 'soon'"
    )
    assert gate.most == 0


def test_a_call_sent_at_its_deadline_gets_no_zero_timeout(keepalive):
    """A slot that came free at the deadline: a 0 s timeout would make the socket
    non-blocking, and under gevent the connect failed with "[Errno 115] Operation now in
    progress", not with the deadline's ProviderTimeout."""
    from agentloop.providers.watchdog import CallWatch, watching
    from tests.helpers import user_request

    provider = OpenAIProvider(base_url=keepalive.url, api_key="test-key")
    with watching(CallWatch(time.monotonic() - 1, None)):
        timeout = provider._post(user_request("keepalive:model"), True)["timeout"]

    assert min(timeout.connect, timeout.read, timeout.write, timeout.pool) > 0


def test_a_providers_max_connections_widens_its_client_and_is_checked(settings):
    """httpx keeps 100 connections per client by default: a gevent worker with more calls
    in flight than that queues the rest unless the provider is set wider."""
    settings.AGENTLOOP = {
        **settings.AGENTLOOP,
        "PROVIDERS": {"wide": {"max_connections": 300}, "odd": {"max_connections": "many"}},
    }
    wide = OpenAIProvider(name="wide", api_key="test-key")
    assert wide.client._transport._pool._max_connections == 300
    assert OpenAIProvider(api_key="test-key").client._transport._pool._max_connections == 100

    with pytest.raises(ConfigurationError) as raised:
        OpenAIProvider(name="odd", api_key="test-key").client  # noqa: B018 - made on first use
    assert str(raised.value) == (
        "AGENTLOOP['PROVIDERS']['odd']['max_connections'] must be a whole number of at least 1, "
        "not 'many'"
    )

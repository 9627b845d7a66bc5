"""Shared fixtures: no network, a scripted provider registered as "scripted", users; and the
fixtures of the real parts several test modules use (Celery workers on Redis, ...), whose
helpers live in modules named for them (tests/workers.py, ...): a test module imports no
other test module (tests/test_test_layout.py)."""

from __future__ import annotations

import os
import time
import types
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission
from django.test import Client, override_settings
from django.utils import timezone

from agentloop import events, providers
from agentloop.conf import agentloop_settings
from agentloop.models import Chat, ChatState
from agentloop.testing import ScriptedProvider, block_network
from tests import browsers, doc_blocks, mcp_servers, sse_reading, workers
from tests.agents import register_agents_provider
from tests.budget_helpers import PricedProvider


@pytest.fixture(autouse=True)
def _no_network() -> Iterator[None]:
    """Tests never reach a real provider: only loopback connections are allowed."""
    with block_network():
        yield


@pytest.fixture(autouse=True)
def _fresh_settings() -> Iterator[None]:
    agentloop_settings.reload()
    yield
    agentloop_settings.reload()


@pytest.fixture
def scripted() -> Iterator[ScriptedProvider]:
    """A ScriptedProvider registered as "scripted" (model "scripted:test"); add replies to it."""
    provider = ScriptedProvider()
    providers.register("scripted", provider)
    yield provider
    providers.unregister("scripted")


@pytest.fixture
def chat(user):
    """A persisted chat on the "scripted" model, owned by ``user`` (files may override it)."""
    from agentloop.models import Chat  # the models load once Django is set up

    return Chat.objects.create(model="scripted:test", owner=user)


@pytest.fixture
def user(django_user_model):
    return django_user_model.objects.create_user(username="ada", password="pw")


@pytest.fixture
def viewer(client, django_user_model):
    """The test client logged in as staff who may view chats but not change them."""
    staff = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_chat"))
    client.force_login(staff)
    return client


@pytest.fixture
def priced() -> Iterator[PricedProvider]:
    """A scripted provider registered as "priced" whose every token costs
    ``tests.budget_helpers.PRICE_PER_TOKEN`` (test_limits.py has a flat-priced one)."""
    model = PricedProvider()
    providers.register("priced", model)
    yield model
    providers.unregister("priced")


@pytest.fixture
def owner(user) -> Client:
    """A test client logged in as ``user``, the ``chat`` fixture's owner."""
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def brains() -> Iterator[object]:
    """The "agents" provider (tests/agents.py): ``brains.script("You are LEAD.", replies...)``."""
    provider = register_agents_provider()
    yield provider
    providers.unregister("agents")


@pytest.fixture
def run_log(tmp_path, monkeypatch):
    """Tools in tests/tools.py log each run here (see ``tests.tools.runs``)."""
    path = tmp_path / "runs.log"
    monkeypatch.setenv("AGENTLOOP_TEST_RUN_LOG", str(path))
    return path


# -- real Celery workers (tests/workers.py) ---------------------------------------------------
@pytest.fixture(scope="module")
def redis_client() -> Any:
    """A client of the Celery tests' Redis (``tests.workers.REDIS_URL``); skips without it."""
    try:
        import celery  # noqa: F401
        import redis
    except ImportError as exc:
        workers.unavailable(f"{exc.name} is not installed (pip install -e '.[redis]')")
    client = redis.Redis.from_url(workers.REDIS_URL, socket_connect_timeout=1)
    try:
        client.ping()
    except redis.RedisError as exc:
        workers.unavailable(f"Redis does not answer at {workers.REDIS_URL}: {exc}")
    return client


@pytest.fixture
def background(redis_client, tmp_path) -> Iterator[workers.Background]:
    """A queue of this test's own; the test process enqueues to it through Redis and
    ``background.start_worker(name)`` starts real workers on it (killed at the end)."""
    from celery import current_app

    # Importing the app makes it this thread's current app: put the previous one back after.
    previous_current = current_app._get_current_object()
    from tests.celery_app import app

    queue = f"agentloop-test-{uuid.uuid4().hex[:12]}"
    previous_queue = app.conf.task_default_queue
    app.conf.task_default_queue = queue
    app.set_current()
    state = workers.Background(queue, tmp_path, tmp_path / "runs.log", tmp_path / "model_calls.log")
    agentloop = {**settings.AGENTLOOP, "BACKGROUND": "celery", "REDIS_URL": workers.REDIS_URL}
    try:
        with override_settings(AGENTLOOP=agentloop):
            yield state
    finally:
        for worker in state.workers:
            worker.kill()
        previous_current.set_current()
        app.conf.task_default_queue = previous_queue
        redis_client.delete(queue)


# -- the MCP test server over HTTP (tests/mcp_servers.py) ------------------------------------
@pytest.fixture(scope="module")
def http_server(tmp_path_factory) -> Iterator[mcp_servers.HttpServer]:
    """The MCP test server over streamable HTTP, one per test module."""
    server = mcp_servers.HttpServer.start(tmp_path_factory.mktemp("mcp-http"))
    yield server
    server.stop()


# -- the event stream on Redis (tests/sse_reading.py) ----------------------------------------
@pytest.fixture
def redis_events(settings) -> Iterator[Any]:
    """The Redis backend on this run's database, emptied before and after each test."""
    try:
        import redis
    except ImportError as exc:  # pragma: no cover - the redis extra is a dev dependency
        sse_reading.unavailable(f"{exc.name} is not installed (pip install -e '.[redis]')")
    client = redis.Redis.from_url(sse_reading.REDIS_URL, socket_connect_timeout=1)
    try:
        client.ping()
    except redis.RedisError as exc:
        sse_reading.unavailable(f"Redis does not answer at {sse_reading.REDIS_URL}: {exc}")
    client.flushdb()
    settings.AGENTLOOP = {**settings.AGENTLOOP, "REDIS_URL": sse_reading.REDIS_URL}
    try:
        yield client
    finally:
        events.flush()  # this test's queued events land now, not in the next test's database
        client.flushdb()
        client.close()


# -- a real browser on the test site (tests/browsers.py) -------------------------------------
@pytest.fixture(scope="module")
def browser_available() -> None:
    """Skips the module without Chromium or Playwright (fails under ``CI=true``); a browser
    test module uses it and ``orm_next_to_playwright`` (``pytest.mark.usefixtures``)."""
    reason = browsers.missing()
    if reason and browsers.IN_CI:
        pytest.fail(f"{reason}; under CI=true the browser tests must run")
    if reason:
        pytest.skip(reason)


@pytest.fixture
def no_run_left_behind() -> Iterator[None]:
    """A browser test ends with no chat running in its server, before its rows are flushed."""
    yield
    running = Chat.objects.filter(state__in=[ChatState.QUEUED, ChatState.RUNNING])
    running.update(cancel_requested_at=timezone.now())
    deadline = time.monotonic() + 30
    while running.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


# Playwright's sync API runs an event loop in this thread; the test's own ORM calls are
# plain blocking calls between page actions, which is what Django's guard is about.
@pytest.fixture(scope="module")
def orm_next_to_playwright() -> Iterator[None]:
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    yield
    if previous is None:
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    else:
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture(scope="module")
def site(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[browsers.Server]:
    """``manage.py runserver`` (threaded WSGI, no reloader) on the test database."""
    with django_db_blocker.unblock():
        server = browsers.runserver(tmp_path_factory.mktemp("runserver") / "server.log")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def browser(browser_available) -> Iterator[object]:
    """Headless Chromium, one per test module."""
    from playwright.sync_api import sync_playwright  # the dev extra, checked by browser_available

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=browsers.CHROMIUM, headless=True, args=browsers.CHROMIUM_ARGS
        )
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser) -> Iterator[object]:
    """A tab of the module's browser (its page errors fail the test: tests/browsers.py)."""
    with browsers.open_tab(browser) as tab:
        yield tab


@pytest.fixture
def person(django_user_model):
    """Who logs in through a browser test's pages (``browsers.log_in``)."""
    return django_user_model.objects.create_user(username="ada", password="lovelace")


# -- the documentation's examples (tests/doc_blocks.py) --------------------------------------
@pytest.fixture
def example_module() -> Iterator[types.ModuleType]:
    """A fresh ``myapp.tools`` module; providers and signal receivers are restored after."""
    with doc_blocks.example_module() as module:
        yield module

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
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission
from django.test import Client, override_settings
from django.utils import timezone

from agentloop import live_events as events
from agentloop import providers
from agentloop.conf import agentloop_settings
from agentloop.models import Chat, ChatState
from agentloop.testing import ScriptedProvider, block_network
from tests import browsers, doc_blocks, mcp_servers, redis_urls, sse_reading, workers
from tests.agents import register_agents_provider
from tests.budget_helpers import PricedProvider

TESTS = Path(__file__).resolve().parent

#: fixtures that give a test its marks (pyproject.toml's markers; make test-quick leaves out
#: the tests marked worker, browser or subprocess).
_MARKED_BY_FIXTURES = {
    "worker": {"background", "worker_pool"},
    "browser": {"browser", "page", "site"},
}
_USES_DATABASE = {"db", "transactional_db", "django_db_setup"}
#: Modules whose tests use the database only to keep rows, with nothing the database itself
#: decides (its SQL, locks, transactions, value round trips, query plans) under test: pages in
#: a browser, views and protocols, the docs and the terminal, the engine's features. CI runs
#: them on one database per Python (3.11 with PostgreSQL, 3.13 with SQLite); every other test
#: that uses a database, marked ``database``, runs on both databases on both Pythons
#: (make test's SQLITE_TESTS=db / POSTGRES_TESTS=db; tests/README.md). A new module is
#: ``database`` until it is listed here.
_BACKEND_AGNOSTIC = {
    "test_ag_ui", "test_ag_ui_client",
    "test_agent_following", "test_agents", "test_approval_edits", "test_async",
    "test_attachments", "test_background", "test_batches", "test_batches_celery",
    "test_bench_smoke", "test_chat_delegations", "test_checks", "test_checks_vertex",
    "test_compaction", "test_compaction_paths", "test_compaction_replay",
    "test_compaction_units", "test_control", "test_control_celery", "test_custom_models",
    "test_decision_views", "test_demo", "test_django_tasks", "test_docs", "test_editing",
    "test_editing_celery", "test_editing_views", "test_evals_batches", "test_event_keys",
    "test_example_site",
    "test_fallbacks", "test_first_hour", "test_guardrail_limits", "test_guardrails",
    "test_guardrails_admin",
    "test_guardrails_celery", "test_guardrails_parallel", "test_handoffs",
    "test_handoffs_celery", "test_limits", "test_long_conversations_celery", "test_mcp",
    "test_mcp_celery", "test_mcp_elicitation", "test_mcp_serve", "test_mcp_serve_setup",
    "test_memory_chat", "test_model_call_bounds", "test_model_options",
    "test_partial_output", "test_pool_checks", "test_prices", "test_public_api",
    "test_rate_limits_celery", "test_request_json", "test_signals", "test_sse",
    "test_sse_access", "test_stream_caps", "test_streaming",
    "test_subagent_control", "test_terminal", "test_terminal_escapes",
    "test_testing_providers", "test_thinking", "test_tools", "test_tracing", "test_typing",
    "test_ui_stream", "test_usechat", "test_views",
}  # fmt: skip
#: Modules of end-to-end stories on real workers and processes (kills, crashes, races across
#: workers, erasure and budgets mid-run) whose dependence on the database is through the
#: primitives the ``database`` modules check on both databases and both Pythons: claims and
#: leases (test_store_contract, test_lease_holders, test_one_writer), conditional writes and
#: decisions (test_one_writer, test_people_in_the_loop), spend (test_budgets, test_budgets_race),
#: set-based control (test_bulk_control), erasure (test_data_erasure) and transactional tools
#: (test_transactional_tools). Each runs on both databases, once each (3.11 with PostgreSQL,
#: 3.13 with SQLite), as the backend-agnostic modules do: their four-way runs were 56% of a
#: ``db`` run's time for no primitive the others don't already run four ways. A test of theirs
#: that runs on one database only is marked ``database`` by hand, so it runs on both Pythons.
_SCENARIOS = {
    "test_bulk_control_celery", "test_budgets_celery", "test_celery_worker", "test_chaos",
    "test_data_erasure_celery", "test_deferred", "test_evals_celery", "test_halt_concurrent",
    "test_memory_celery", "test_per_process", "test_resume", "test_transactional_tools_celery",
}  # fmt: skip


def pytest_configure(config: pytest.Config) -> None:
    listed = _BACKEND_AGNOSTIC | _SCENARIOS | set(_LONGEST_FIRST)
    gone = sorted(name for name in listed if not (TESTS / f"{name.replace('.', '/')}.py").exists())
    if gone:
        raise pytest.UsageError(f"tests/conftest.py lists modules that don't exist: {gone}")


def _backend_agnostic(module: str) -> bool:
    name = module.rsplit(".", 1)[-1]
    agnostic = name in _BACKEND_AGNOSTIC or name.endswith("_browser") or ".providers." in module
    return agnostic or name in _SCENARIOS


#: The longest modules (summed test time of CI's two whole runs, tests/README.md; named from
#: tests/, as ``providers.test_redaction``), run first:
#: ``pytest -n`` hands modules out in this order, so a run doesn't end waiting on one long
#: module that a process took last.
_LONGEST_FIRST = (
    "test_admin", "test_browser", "test_mcp", "test_install", "test_people_in_the_loop",
    "test_celery_worker", "test_resume", "test_bad_input_properties", "providers.test_redaction",
    "test_transactional_tools", "test_bench_smoke", "test_per_process", "test_one_writer",
    "test_transactional_tools_celery",
    # This wave's longest, each timed alone (they start servers, workers or node; in a fresh
    # clone the node and browser modules' first test also installs or builds their packages).
    "test_mcp_serve", "test_evals_celery", "test_mcp_elicitation", "test_mcp_celery",
    "test_usechat_browser", "test_ag_ui_client", "test_partial_output", "test_memory_celery",
)  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: place for place, name in enumerate(_LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.module.__name__.removeprefix("tests."), len(rank)))
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        for mark, names in _MARKED_BY_FIXTURES.items():
            if fixtures & names:
                item.add_marker(mark)
        uses_database = fixtures & _USES_DATABASE or item.get_closest_marker("django_db")
        if uses_database and not _backend_agnostic(item.module.__name__):
            item.add_marker("database")


def _printable(text: str) -> str:
    """``text`` with lone surrogates escaped (``\\ud800``), so it can be encoded as UTF-8."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    # The bad-input tests log text with lone surrogates on purpose; pytest -n sends each
    # report to the main process as UTF-8, which a lone surrogate in its captured output
    # (or a failure's text) would stop with an internal error, ending the whole run.
    report = yield
    report.sections = [(title, _printable(text)) for title, text in report.sections]
    if isinstance(report.longrepr, str):
        report.longrepr = _printable(report.longrepr)
    elif report.longrepr is not None and not isinstance(report.longrepr, tuple):
        shown = str(report.longrepr)
        if _printable(shown) != shown:
            report.longrepr = _printable(shown)
    return report


@pytest.fixture(scope="session", autouse=True)
def _flush_by_delete() -> Iterator[None]:
    """On PostgreSQL, a transactional test's flush deletes the rows instead of TRUNCATE.

    Django empties every table after each ``transaction=True`` test with one TRUNCATE of all
    of them, which makes each table anew on disk: 0.47 s for 45 nearly empty tables against
    0.04 s for DELETEs (measured here; the tests leave a few rows). The DELETEs run in one
    transaction (Django's flush), where PostgreSQL checks the deferred foreign keys at commit.
    """
    from django.db import connection

    operations = type(connection.ops)
    if connection.vendor != "postgresql":
        yield
        return
    truncate = operations.sql_flush

    def delete(self, style, tables, *, reset_sequences=False, allow_cascade=False):  # type: ignore[no-untyped-def]
        if reset_sequences or allow_cascade:
            return truncate(self, style, tables, reset_sequences=reset_sequences,
                            allow_cascade=allow_cascade)  # fmt: skip
        keyword = style.SQL_KEYWORD("DELETE FROM")
        return [f"{keyword} {style.SQL_FIELD(self.quote_name(table))};" for table in tables]

    operations.sql_flush = delete
    yield
    operations.sql_flush = truncate


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
    if redis_urls.MISSING:
        workers.unavailable(redis_urls.MISSING)
    client = redis.Redis.from_url(workers.REDIS_URL, socket_connect_timeout=1)
    try:
        client.ping()
    except redis.RedisError as exc:
        workers.unavailable(f"Redis does not answer at {workers.REDIS_URL}: {exc}")
    return client


@pytest.fixture(scope="module")
def worker_pool(redis_client, tmp_path_factory) -> Iterator[workers.Pool]:
    """The workers a module's tests share (tests/workers.py ``Pool``), killed at its end."""
    from celery import current_app

    # Importing the app makes it this thread's current app: put the previous one back after.
    previous_current = current_app._get_current_object()
    from tests.celery_app import app

    previous_current.set_current()
    pool = workers.Pool(tmp_path_factory.mktemp("workers"), app)
    yield pool
    pool.close()


@pytest.fixture
def background(worker_pool, redis_client, tmp_path) -> Iterator[workers.Background]:
    """A queue of this test's own; the test process enqueues to it through Redis and
    ``background.start_worker(name)`` gives real workers on it: started for the test, or kept
    from an earlier test of the module with the same settings (tests/workers.py ``Pool``)."""
    from celery import current_app

    previous_current = current_app._get_current_object()
    app = worker_pool.app
    queue = f"agentloop-test-{uuid.uuid4().hex[:12]}"
    previous_queue = app.conf.task_default_queue
    app.conf.task_default_queue = queue
    app.set_current()
    worker_pool.serve(tmp_path)
    state = workers.Background(
        queue, tmp_path, tmp_path / "runs.log", tmp_path / "model_calls.log", pool=worker_pool
    )
    agentloop = {**settings.AGENTLOOP, "BACKGROUND": "celery", "REDIS_URL": workers.REDIS_URL}
    try:
        with override_settings(AGENTLOOP=agentloop):
            yield state
    finally:
        state.close()
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
    if redis_urls.MISSING:
        sse_reading.unavailable(redis_urls.MISSING)
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

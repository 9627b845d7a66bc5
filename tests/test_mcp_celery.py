"""MCP tools run by a real ``celery worker`` process (DESIGN §16 with §3).

The test process adds the server's tools to a chat (listing them through a session of its
own); the worker (prefork pool) rebuilds them from the chat row and calls the server
through sessions it opens itself: over stdio it starts its own server process. Workers,
Redis and the skip rules are those of tests/test_celery_worker.py (tests/workers.py, the
``background`` fixture of tests/conftest.py).
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from agentloop.models import Chat, ToolCall
from agentloop.tools.mcp import close_connections
from tests.helpers import transcript
from tests.mcp_servers import DEADLINE, calls, configure, stdio_entry
from tests.workers import settled

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]


def over_http(server: Any) -> dict[str, dict[str, Any]]:
    """MCP_SERVERS naming the module's HTTP server twice: "files", and "tables" allowed to
    ask. The tests on HTTP start their workers with these same settings, so the second test
    gets the first one's kept worker (tests/workers.py ``Pool``) instead of starting one."""
    return {"files": {"url": server.url}, "tables": {"url": server.url, "elicitation": True}}


@pytest.fixture(params=["stdio", "http"])
def mcp_servers(request, tmp_path):
    """MCP_SERVERS naming the test server over stdio or HTTP, and the log of its tool calls."""
    if request.param == "stdio":
        log = tmp_path / "stdio-calls.log"
        yield {"files": stdio_entry(log)}, log
    else:
        yield request.getfixturevalue("http_servers")
    close_connections()


@pytest.fixture
def http_servers(http_server):
    """:func:`over_http` for the module's HTTP server, and its log (emptied)."""
    http_server.log.unlink(missing_ok=True)
    yield over_http(http_server), http_server.log
    close_connections()


def test_a_worker_rebuilds_mcp_tools_from_the_row_and_runs_them(
    background,  # noqa: F811 - the imported fixture
    mcp_servers,
    user,
):
    servers, log = mcp_servers
    entry = servers["files"]
    worker = background.start_worker("w1", MCP_SERVERS=servers)
    with configure(**servers):
        chat = Chat.objects.create(model="rules:test", owner=user)
        chat.with_mcp("files", only=["list_files", "add"])
    close_connections()  # from here on, only the worker talks to the server

    chat.ask_later("tools:list_files,add").complete_later()
    background.wait(lambda: settled(chat), "the chat to settle")

    assert transcript(chat, "role", "content", "call_id", "status") == [
        ("user", "tools:list_files,add", None, "complete"),
        ("assistant", "", None, "complete"),
        ("tool", "notes.txt\ntodo.txt", "call_1_0_0", "complete"),
        ("tool", "5", "call_1_0_1", "complete"),
        ("assistant", "done: notes.txt\ntodo.txt; 5", None, "complete"),
    ]
    logged = calls(log)
    assert [(c["tool"], c["arguments"]) for c in logged] == [
        ("list_files", {}),
        ("add", {"a": 2, "b": 3}),
    ]
    if "command" in entry:
        # The stdio server the worker started: a child of the worker's pool process.
        assert {c["ppid"] for c in logged} != {os.getpid()}
        assert len({c["pid"] for c in logged}) == 1  # one session for both calls
    assert worker.process.poll() is None


def test_a_worker_holds_the_call_while_a_person_answers_the_servers_question(
    background,  # noqa: F811 - the imported fixture
    http_servers,
    user,
):
    """On HTTP only: the worker's side of a question is the same whatever carries it, and
    tests/test_mcp_elicitation.py asks over both transports."""
    servers, log = http_servers
    background.start_worker("w1", MCP_SERVERS=servers)
    with configure(**servers):
        chat = Chat.objects.create(model="rules:test", owner=user)
        chat.with_mcp("tables", only=["book_table"])
    close_connections()

    chat.ask_later("tools:book_table").complete_later()
    deadline = time.monotonic() + DEADLINE
    while not chat.pending_questions():
        assert time.monotonic() < deadline, "the worker's call did not ask"
        time.sleep(0.1)
    (asked,) = chat.pending_questions()
    chat.refresh_from_db()
    assert chat.state == "running" and chat.lease_token  # the worker holds it meanwhile

    owner = Client()
    owner.force_login(user)
    url = reverse("agentloop:answer", args=[chat.pk, asked.pk])
    assert owner.post(url, {"text": '{"people": 5, "name": "Ada"}'}).status_code == 204
    background.wait(lambda: settled(chat), "the chat to settle")

    assert transcript(chat, "role", "content") == [
        ("user", "tools:book_table"),
        ("assistant", ""),
        ("tool", "Booked a table on friday for 5, name Ada."),
        ("assistant", "done: Booked a table on friday for 5, name Ada."),
    ]
    assert ToolCall.objects.get(pk=asked.pk).elicitation["response"]["by"] == user.pk
    assert [c["tool"] for c in calls(log)] == ["book_table", "book_table answered"]  # once

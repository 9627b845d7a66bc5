"""Agents served over MCP (docs/mcp.md, serving agents), driven by the SDK's own client
against real server processes: uvicorn serving the test site (tests/asgi.py mounts the
endpoint at /mcp) for streamable HTTP, and ``manage.py agentloop mcp-serve`` for stdio.

The agent is tests/mcp_agents.py's ``Reporter`` on the "rules" model: the task's first word
says what the model does (two rounds of tools, a long sleep, a call that needs approval).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from django.db import connection, connections

from agentloop.models import Chat, ChatState, MCPToken, ToolCall
from tests.helpers import wait_until
from tests.processes import REPO_ROOT, process_env
from tests.sse_reading import uvicorn_serving
from tests.workers import REDIS_URL

pytest.importorskip("mcp", reason="the mcp extra")

from mcp import Client, StdioServerParameters, stdio_client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp.shared._httpx_utils import create_mcp_http_client  # noqa: E402
from mcp.shared.exceptions import MCPError  # noqa: E402

pytestmark = [pytest.mark.subprocess, pytest.mark.django_db(transaction=True)]

SERVING = {
    "MCP_SERVE": {
        "agents": ["tests.mcp_agents.Reporter"],
        "run": "in_process",
        "poll_interval": 0.05,
        "keepalive": 0.3,
    },
}
AGENT_PATH = "tests.mcp_agents.Reporter"
#: the environment that makes tests/asgi.py mount the MCP endpoint at /mcp.
MOUNTED = {"AGENTLOOP_TEST_MCP_MOUNT": "1"}
#: a long run: a hundred rounds of one nap (0.1 s) each, checked for a cancel between them.
LONG = "tools:" + "|".join(["nap"] * 100)


@pytest.fixture(scope="module")
def site(tmp_path_factory, django_db_setup, django_db_blocker) -> Iterator[str]:
    """The MCP endpoint of uvicorn serving the test site, one server for the module (each
    test's rows are its own: the server reads the test database as it is)."""
    with (
        django_db_blocker.unblock(),
        uvicorn_serving(tmp_path_factory.mktemp("mcp"), SERVING, **MOUNTED) as url,
    ):
        yield url + "/mcp"


@pytest.fixture
def token(user) -> str:
    return MCPToken.objects.issue(user, name="tests")[1]


@asynccontextmanager
async def over_http(url: str, token: str | None, mode: str = "auto") -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"} if token else None
    async with create_mcp_http_client(headers=headers) as http:
        async with Client(streamable_http_client(url, http_client=http), mode=mode) as client:
            yield client


@asynccontextmanager
async def over_stdio(token: str, settings: dict[str, Any]) -> AsyncIterator[Client]:
    env = process_env(AGENTLOOP_MCP_TOKEN=token, AGENTLOOP_TEST_SETTINGS=json.dumps(settings))
    parameters = StdioServerParameters(
        command=sys.executable, args=["-m", "django", "agentloop", "mcp-serve"], env=env,
        cwd=str(REPO_ROOT),
    )  # fmt: skip
    async with Client(stdio_client(parameters), mode="legacy") as client:
        yield client


class Notes:
    """The progress notifications one call received."""

    def __init__(self) -> None:
        self.received: list[tuple[float, str | None]] = []

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        self.received.append((progress, message))

    @property
    def messages(self) -> list[str]:
        return [message or "" for _, message in self.received]


def text(result: Any) -> str:
    return "\n".join(block.text for block in result.content)


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


async def in_db_thread(function: Any, *args: Any) -> Any:
    """``function(*args)`` on a thread (the test's loop must not block), its connection
    closed after: a thread left holding one would keep the test database open."""

    def call() -> Any:
        try:
            return function(*args)
        finally:
            connections.close_all()

    return await asyncio.to_thread(call)


# -- streamable HTTP ---------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["auto", "legacy"])  # the 2026 wire, and the handshake one
def test_an_agent_is_a_tool_whose_call_runs_a_chat_of_the_caller_with_progress(
    site, token, user, mode
):
    notes = Notes()

    async def main() -> tuple[Any, Any]:
        async with over_http(site, token, mode) as client:
            tools = await client.list_tools()
            result = await client.call_tool(
                "reporter", {"task": "tools:step_one|step_two", "topic": "owls"},
                progress_callback=notes,
            )  # fmt: skip
            return tools, result

    tools, result = run(main())

    (tool,) = tools.tools
    assert tool.name == "reporter"
    assert tool.description.startswith("Writes a report on a topic")
    assert set(tool.input_schema["properties"]) == {"task", "topic", "chat"}
    assert not result.is_error
    assert text(result) == "done: two done"
    chat = Chat.objects.get()
    assert result.structured_content == {"answer": "done: two done", "chat": chat.pk}
    assert (chat.owner, chat.agent_path, chat.state) == (user, AGENT_PATH, ChatState.IDLE)
    assert chat.messages.get(role="system").content == "You report on owls."
    assert notes.messages == [
        f"Started chat {chat.pk}",
        "Calling step_one",
        "step_one finished",
        "Calling step_two",
        "step_two finished",
        "Answered",
    ]
    assert [progress for progress, _ in notes.received] == [1, 2, 3, 4, 5, 6]


def test_a_call_goes_on_with_the_callers_own_chat_and_never_reaches_another_users(
    site, token, user, django_user_model
):
    olga = django_user_model.objects.create_user(username="olga")
    hers = Chat.objects.create(owner=olga, agent_path=AGENT_PATH, model="rules:test")
    mine_elsewhere = Chat.objects.create(owner=user, model="rules:test")  # no agent of its

    async def main() -> list[Any]:
        async with over_http(site, token) as client:
            first = await client.call_tool("reporter", {"task": "hello", "topic": "owls"})
            chat = first.structured_content["chat"]
            again = await client.call_tool("reporter", {"task": "again", "chat": chat})
            others = [
                await client.call_tool("reporter", {"task": "hello", "chat": key})
                for key in (hers.pk, mine_elsewhere.pk, 999_999, "not-a-key")
            ]
            return [first, again, *others]

    first, again, *refused = run(main())

    assert text(first) == "echo: hello"
    assert text(again) == "echo: again"
    assert again.structured_content["chat"] == first.structured_content["chat"]
    chat = Chat.objects.get(pk=first.structured_content["chat"])
    assert [m.content for m in chat.messages.filter(role="user")] == ["hello", "again"]
    for result, key in zip(
        refused, (hers.pk, mine_elsewhere.pk, 999_999, "not-a-key"), strict=True
    ):
        assert result.is_error
        assert text(result) == f"No chat {key} of Reporter for you."
    assert not hers.messages.exists() and not mine_elsewhere.messages.exists()


def test_a_bad_call_gets_one_line_and_nothing_runs(site, token):
    async def main() -> list[Any]:
        async with over_http(site, token) as client:
            return [
                await client.call_tool("reporter", {"task": "hello"}),  # no topic
                await client.call_tool("reporter", {"task": "  ", "topic": "owls"}),
            ]

    missing, empty = run(main())

    assert missing.is_error and text(missing) == "Reporter needs the input(s) topic."
    assert empty.is_error and text(empty) == "`task` is required: a non-empty string."
    assert not Chat.objects.filter(messages__role="user").exists()


@pytest.mark.parametrize("given", [None, "agentloop_not-a-token", "revoked", "inactive"])
def test_a_missing_or_bad_token_is_refused_before_anything_runs(site, user, given):
    import httpx2

    token = given
    if given == "revoked":
        row, token = MCPToken.objects.issue(user)
        row.delete()
    elif given == "inactive":
        token = MCPToken.objects.issue(user)[1]
        type(user).objects.filter(pk=user.pk).update(is_active=False)

    async def main() -> None:
        async with over_http(site, token) as client:
            await client.list_tools()

    with pytest.raises(BaseException) as caught:  # in the SDK's task groups
        run(main())
    assert any(isinstance(error, MCPError) for error in _leaves(caught.value)), caught.value
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    answer = httpx2.post(site, json=body, headers=headers)
    assert answer.status_code == 401
    assert answer.json()["error_description"] == (
        "A valid token is required: Authorization: Bearer <token>."
    )
    assert not Chat.objects.exists()


def _leaves(error: BaseException) -> Iterator[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            yield from _leaves(inner)
    else:
        yield error


def test_another_user_cannot_use_a_session_someone_else_opened(site, token, django_user_model):
    import httpx2

    olga = django_user_model.objects.create_user(username="olga")
    hers = MCPToken.objects.issue(olga)[1]
    hello = {
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "tests", "version": "1"}},
    }  # fmt: skip
    accept = {"Accept": "application/json, text/event-stream"}
    opened = httpx2.post(site, json=hello, headers={**accept, "Authorization": f"Bearer {token}"})
    session = opened.headers["mcp-session-id"]
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
    as_olga = {**accept, "Authorization": f"Bearer {hers}", "mcp-session-id": session,
               "mcp-protocol-version": "2025-11-25"}  # fmt: skip

    assert opened.status_code == 200
    assert httpx2.post(site, json=listing, headers=as_olga).status_code == 404


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_the_clients_cancellation_cancels_the_chat(site, token, mode):
    notes = Notes()

    async def main() -> None:
        async with over_http(site, token, mode) as client:
            call = asyncio.ensure_future(
                client.call_tool("reporter", {"task": LONG, "topic": "owls"},
                                 progress_callback=notes)
            )  # fmt: skip
            while "nap finished" not in notes.messages:  # the run is under way
                await asyncio.sleep(0.02)
            call.cancel()  # the SDK sends notifications/cancelled (or closes the stream)
            with pytest.raises(asyncio.CancelledError):
                await call
            await asyncio.sleep(0.5)  # the session stays open while the server cancels

    run(main())

    chat = Chat.objects.get()
    wait_until(
        lambda: not Chat.objects.filter(pk=chat.pk, lease_token__gt="").exists(),
        "the run to stop",
        timeout=30,
    )
    chat.refresh_from_db()
    assert chat.state == ChatState.IDLE
    assert chat.cancel_requested_at is None  # the run saw it, and recorded the cancel
    assert 0 < chat.tool_calls.filter(name="nap", state="succeeded").count() < 50
    assert not chat.messages.filter(role="assistant", content__startswith="done").exists()


def test_an_approval_holds_the_call_until_a_person_decides(site, token, user):
    notes = Notes()

    async def main() -> Any:
        async with over_http(site, token) as client:
            call = asyncio.ensure_future(
                client.call_tool("reporter", {"task": "tools:publish", "topic": "owls"},
                                 progress_callback=notes)
            )  # fmt: skip
            while not any("waits for approval of publish" in m for m in notes.messages):
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)  # held: keep-alive notes come, the call doesn't return
            assert not call.done()
            held = await in_db_thread(lambda: ToolCall.objects.get(name="publish"))
            chat = await in_db_thread(lambda: Chat.objects.get(pk=held.chat_id))
            await in_db_thread(chat.approve, held.call_id, user)
            return await asyncio.wait_for(call, 30)

    result = run(main())

    chat = Chat.objects.get()
    waiting = f"Chat {chat.pk} waits for approval of publish (call call_1_0_0)"
    assert notes.messages.count(waiting) >= 2  # at once, then every keepalive
    assert notes.messages[-2:] == ["publish finished", "Answered"]
    assert text(result) == "done: published"
    assert chat.tool_calls.get(name="publish").decision == "approved"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="counts backends: PostgreSQL")
def test_a_call_held_for_a_person_holds_no_database_connection(tmp_path, token):
    application = f"agentloop-mcp-{uuid.uuid4().hex[:8]}"
    settings = {**SERVING, "MCP_SERVE": {**SERVING["MCP_SERVE"], "poll_interval": 0.2}}
    notes = Notes()

    def backends() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [application]
            )
            return int(cursor.fetchone()[0])

    async def main(url: str) -> list[int]:
        async with over_http(url + "/mcp", token) as client:
            call = asyncio.ensure_future(
                client.call_tool("reporter", {"task": "tools:publish", "topic": "owls"},
                                 progress_callback=notes)
            )  # fmt: skip
            while not any("waits for approval" in m for m in notes.messages):
                await asyncio.sleep(0.05)
            counts = []
            for _ in range(20):  # a second of the wait, the call reading the chat 5 times
                counts.append(await in_db_thread(backends))
                await asyncio.sleep(0.05)
            call.cancel()
            return counts

    with uvicorn_serving(
        tmp_path, settings, AGENTLOOP_TEST_DB_APPLICATION=application, **MOUNTED
    ) as url:
        counts = run(main(url))

    assert max(counts) <= 1  # a read in flight at most
    assert counts.count(0) >= 15  # and mostly none at all


# -- the job path: a Celery worker runs the chat -----------------------------------------------
@pytest.mark.worker
def test_run_by_a_celery_worker_the_call_follows_the_chat_and_an_approval_holds_it(
    background, tmp_path, token, user
):
    background.start_worker("w1")
    settings = {**SERVING, "MCP_SERVE": {**SERVING["MCP_SERVE"], "run": "background"},
                "BACKGROUND": "celery", "REDIS_URL": REDIS_URL}  # fmt: skip
    notes = Notes()

    async def main(url: str) -> tuple[Any, Any]:
        async with over_http(url + "/mcp", token) as client:
            plain = await client.call_tool("reporter", {"task": "tools:step_one", "topic": "owls"})
            call = asyncio.ensure_future(
                client.call_tool("reporter", {"task": "tools:publish", "topic": "owls"},
                                 progress_callback=notes)
            )  # fmt: skip
            while not any("waits for approval of publish" in m for m in notes.messages):
                await asyncio.sleep(0.05)
            assert not call.done()
            held = await in_db_thread(lambda: ToolCall.objects.get(name="publish"))
            chat = await in_db_thread(lambda: Chat.objects.get(pk=held.chat_id))
            await in_db_thread(approve, chat, held.call_id)  # the worker goes on
            approved = await asyncio.wait_for(call, 60)

            naps = Notes()
            long = asyncio.ensure_future(
                client.call_tool(
                    "reporter", {"task": LONG, "topic": "bats"}, progress_callback=naps
                )
            )
            while "nap finished" not in naps.messages:
                await asyncio.sleep(0.02)
            long.cancel()  # the worker's run stops at its next checkpoint
            with pytest.raises(asyncio.CancelledError):
                await long
            await asyncio.sleep(0.5)
            return plain, approved

    from celery import current_app

    app = current_app._get_current_object()  # the test's queue (tests/conftest.py background)

    def approve(chat: Any, call_id: str) -> None:
        app.set_current()  # Celery's current app is per thread: this thread's job goes there too
        chat.approve(call_id, user)

    with uvicorn_serving(
        tmp_path, settings, AGENTLOOP_TEST_QUEUE=background.queue, **MOUNTED
    ) as url:
        plain, approved = run(main(url))

    assert text(plain) == "done: one done"
    assert text(approved) == "done: published"
    cancelled = Chat.objects.get(agent_inputs={"topic": "bats"})
    wait_until(
        lambda: Chat.objects.filter(pk=cancelled.pk, state=ChatState.IDLE).exists(),
        "the worker to stop the cancelled chat",
        timeout=30,
    )
    assert 0 < cancelled.tool_calls.filter(name="nap", state="succeeded").count() < 50
    # The worker logs its model calls (the server, not given the log, would not): all four.
    calls = [line["rule"] for line in background.model_calls() if line["rule"] != LONG]
    assert calls == ["tools:step_one"] * 2 + ["tools:publish"] * 2


# -- stdio ------------------------------------------------------------------------------------
def test_over_stdio_the_command_serves_the_agents_as_the_tokens_user_and_a_cancel_stops_one(
    token, user
):
    """One ``mcp-serve`` process (a Django start is most of this test's time) for a call, a
    cancelled call, and a call after the token was revoked."""
    notes, naps = Notes(), Notes()

    async def main() -> tuple[Any, Any]:
        async with over_stdio(token, SERVING) as client:
            tools = await client.list_tools()
            result = await client.call_tool(
                "reporter", {"task": "tools:step_one", "topic": "bats"}, progress_callback=notes
            )
            call = asyncio.ensure_future(
                client.call_tool("reporter", {"task": LONG, "topic": "owls"},
                                 progress_callback=naps)
            )  # fmt: skip
            while "nap finished" not in naps.messages:
                await asyncio.sleep(0.02)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            await asyncio.sleep(0.5)
            await in_db_thread(lambda: MCPToken.objects.all().delete())  # revoked
            with pytest.raises(MCPError, match="The token is not valid"):
                await client.call_tool("reporter", {"task": "hello", "topic": "bats"})
            return tools, result

    tools, result = run(main())

    assert [tool.name for tool in tools.tools] == ["reporter"]
    assert text(result) == "done: one done"
    chat = Chat.objects.get(agent_inputs={"topic": "bats"})
    assert chat.owner == user
    assert notes.messages[1:] == ["Calling step_one", "step_one finished", "Answered"]

    cancelled = Chat.objects.get(agent_inputs={"topic": "owls"})
    wait_until(
        lambda: not Chat.objects.filter(pk=cancelled.pk, lease_token__gt="").exists(),
        "the run to stop",
        timeout=30,
    )
    assert 0 < cancelled.tool_calls.filter(name="nap", state="succeeded").count() < 50
    assert not cancelled.messages.filter(role="assistant", content__startswith="done").exists()
    assert Chat.objects.count() == 2  # the refused call made none


def test_over_stdio_a_missing_or_bad_token_stops_the_command():
    started = {
        given: subprocess.Popen(  # noqa: S603 - our own interpreter
            [sys.executable, "-m", "django", "agentloop", "mcp-serve"],
            env=process_env(AGENTLOOP_MCP_TOKEN=given, AGENTLOOP_TEST_SETTINGS=json.dumps(SERVING)),
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for given in ("", "agentloop_not-a-token")
    }
    ended = {given: (process.communicate("", timeout=60), process.returncode)
             for given, process in started.items()}  # fmt: skip

    for given, expected in (
        ("", "Set $AGENTLOOP_MCP_TOKEN to a token"),
        ("agentloop_not-a-token", "$AGENTLOOP_MCP_TOKEN is not a valid token"),
    ):
        (out, err), code = ended[given]
        assert (code, out) == (1, "")  # nothing said on the protocol's stream
        assert expected in err

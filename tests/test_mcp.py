"""MCP tool servers (DESIGN §16): ``with_mcp``, tools persisted by reference, calls through
a real server of our own (tests/mcp_server.py, in a subprocess) over stdio and over
streamable HTTP, and every way a server can fail giving the model an error result."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

import agentloop
from agentloop.exceptions import CancelledError, ConfigurationError, MCPServerError, ToolError
from agentloop.messages import ToolCallState
from agentloop.models import Chat, ToolCall
from agentloop.testing import tool_call
from agentloop.tools import load_tool
from agentloop.tools.mcp import STOPPED_RESULT, MCPTool, close_connections, load_mcp_tool, mcp_tools
from tests.mcp_servers import DEADLINE, calls, configure, free_port, stdio_entry

pytestmark = [pytest.mark.subprocess]


@pytest.fixture(autouse=True)
def _fresh_sessions() -> Iterator[None]:
    """Each test opens its own sessions (and so its own stdio server process)."""
    yield
    close_connections()


@pytest.fixture
def http_files(http_server) -> Iterator[Path]:
    """Server "files" over streamable HTTP: the module's one server process (its log emptied
    for each test); yields the log of its tool calls.

    What a test checks of agentloop's side of MCP (references, schemas, content, errors,
    timeouts, cancels, approvals) is the same whatever carries the calls, so those tests
    use this server rather than a stdio process of their own; the tests of a stdio server's
    own life (its process, its session, its environment) use :func:`stdio_files`."""
    http_server.log.unlink(missing_ok=True)
    with configure(files={"url": http_server.url}):
        yield http_server.log


@pytest.fixture(params=["stdio", "http"])
def files(request, tmp_path) -> Iterator[Path]:
    """Server "files" configured over stdio or HTTP; yields the log of its tool calls."""
    if request.param == "http":
        yield request.getfixturevalue("http_files")
        return
    log = tmp_path / "stdio-calls.log"
    with configure(files=stdio_entry(log)):
        yield log


@pytest.fixture
def stdio_files(tmp_path) -> Iterator[Path]:
    """Server "files" over stdio only (a process of its own); yields the log of its calls."""
    log = tmp_path / "stdio-calls.log"
    with configure(files=stdio_entry(log)):
        yield log


def results(chat: Chat) -> list[tuple[str, str, bool]]:
    rows = chat.messages.filter(role="tool").select_related("tool_call").order_by("id")
    return [(m.tool_call.name, m.content, m.is_error) for m in rows]


# -- a tool round through the server --------------------------------------------------------
@pytest.mark.django_db
def test_a_tool_round_runs_through_the_server(files, scripted, user):
    scripted.add(tool_call("read_file", {"path": "notes.txt"}), "Your notes say: Buy milk.")
    chat = Chat.objects.create(model="scripted:test", owner=user).with_mcp("files")

    answer = chat.ask("What do my notes say?")

    assert answer.content == "Your notes say: Buy milk."
    assert results(chat) == [("read_file", "Buy milk.", False)]
    assert [(c["tool"], c["arguments"]) for c in calls(files)] == [
        ("read_file", {"path": "notes.txt"})
    ]
    offered = {tool.name for tool in scripted.requests[0].tools}
    assert {"read_file", "list_files", "delete-file", "add"} <= offered


@pytest.mark.django_db
def test_tools_are_stored_by_reference_and_rebuilt_from_the_row(http_files, user):
    chat = Chat.objects.create(model="scripted:test", owner=user).with_mcp("files", only=["add"])

    (reference,) = Chat.objects.get(pk=chat.pk).tools
    rebuilt = load_tool(reference)

    assert reference.startswith("mcp:files/add?")
    assert rebuilt.definition().model_dump() == {
        "name": "add",
        "description": "Adds two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    }


@pytest.mark.django_db
def test_a_model_call_needs_no_server_once_the_tools_are_stored(
    http_files, tmp_path, scripted, user
):
    chat = Chat.objects.create(model="scripted:test", owner=user).with_mcp("files")
    close_connections()
    scripted.add("No tools needed.")

    with configure(files={"command": [str(tmp_path / "no-such-server")]}):
        answer = Chat.objects.get(pk=chat.pk).ask("Hello")

    assert answer.content == "No tools needed."
    assert "read_file" in {tool.name for tool in scripted.requests[0].tools}


@pytest.mark.django_db
def test_the_short_reference_fetches_the_schema_from_the_server(http_files):
    tool_class = load_mcp_tool("mcp:files/read_file")

    assert tool_class.definition().parameters["required"] == ["path"]
    assert tool_class().execute(path="todo.txt") == "Write the docs."


def test_the_session_stays_open_between_calls(stdio_files):
    tools = {tool.name: tool for tool in mcp_tools("files", only=["server_process", "add"])}

    first = tools["server_process"]().execute()
    tools["add"]().execute(a=1, b=2)
    second = tools["server_process"]().execute()

    assert first == second  # one server process: one session


def test_a_forked_child_opens_a_session_of_its_own(stdio_files):
    (server_process,) = mcp_tools("files", only=["server_process"])
    in_parent = server_process().execute()
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        # Forking a process that has threads is what Celery's prefork pool does.
        warnings.simplefilter("ignore", DeprecationWarning)
        child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.write(write_end, server_process().execute().encode())
        finally:
            os._exit(0)
    os.close(write_end)
    os.waitpid(child, 0)
    with os.fdopen(read_end) as pipe:
        in_child = pipe.read()

    assert json.loads(in_child)["pid"] != json.loads(in_parent)["pid"]
    assert server_process().execute() == in_parent  # the parent's session is untouched


def test_content_other_than_text_is_described_not_sent(http_files):
    (snapshot,) = mcp_tools("files", only=["snapshot"])

    assert snapshot().execute() == "A red dot.\n[image (image/png), not shown]"


def test_only_offers_the_named_tools_in_that_order(http_files):
    tools = mcp_tools("files", only=["list_files", "read_file"])

    assert [tool.name for tool in tools] == ["list_files", "read_file"]


def test_a_tool_name_the_server_lacks_is_a_configuration_error(http_files):
    with pytest.raises(ConfigurationError, match=r"MCP server 'files' has no tool 'rm_rf'"):
        mcp_tools("files", only=["read_file", "rm_rf"])


def test_the_in_memory_chat_takes_mcp_tools_too(http_files, scripted):
    scripted.add(tool_call("add", {"a": 2, "b": 40}), "42.")
    chat = agentloop.chat("scripted:test").with_mcp("files", only=["add"])

    assert chat.ask("2 + 40?").content == "42."
    assert [m.content for m in chat.messages if m.role == "tool"] == ["42"]


def test_env_reaches_the_stdio_server_but_not_the_chat(tmp_path):
    entry = stdio_entry(tmp_path / "calls.log")
    entry["env"]["MCP_TEST_TOKEN"] = "s3cret-token"
    with configure(files=entry):
        (environment,) = mcp_tools("files", only=["environment"])

        assert environment().execute(name="MCP_TEST_TOKEN") == "s3cret-token"
        assert "s3cret-token" not in environment.reference()


# -- settings -------------------------------------------------------------------------------
def test_a_server_missing_from_settings_is_a_one_line_configuration_error(stdio_files):
    with pytest.raises(ConfigurationError) as caught:
        agentloop.chat("scripted:test").with_mcp("search")

    message = str(caught.value)
    assert message == "MCP server 'search' is not in AGENTLOOP['MCP_SERVERS'] (configured: files)."


def test_an_entry_with_both_command_and_url_is_refused_without_its_values():
    entry = {"command": ["srv"], "url": "http://127.0.0.1:1/mcp?token=s3cret"}
    with configure(files=entry), pytest.raises(ConfigurationError) as caught:
        mcp_tools("files")

    assert "give 'command' (stdio) or 'url'" in str(caught.value)
    assert "s3cret" not in str(caught.value)
    assert "\n" not in str(caught.value)


def test_without_the_mcp_package_the_error_says_what_to_install(stdio_files, monkeypatch):
    monkeypatch.setitem(sys.modules, "mcp", None)  # import mcp now raises ImportError

    with pytest.raises(ConfigurationError, match=r'pip install "django-agentloop\[mcp\]"'):
        mcp_tools("files")


def test_without_the_mcp_package_a_stored_tool_gives_an_error_result_saying_so(
    http_files, monkeypatch
):
    (add,) = mcp_tools("files", only=["add"])
    rebuilt = load_tool(add.reference())  # needs no SDK: the schema is in the reference
    monkeypatch.setitem(sys.modules, "mcp", None)

    with pytest.raises(ToolError, match=r'pip install "django-agentloop\[mcp\]"'):
        rebuilt().execute(a=1, b=2)


@pytest.mark.parametrize(
    "reference", ["mcp:files", "mcp:/add", 'mcp:files/add?{"schema": 1', "mcp:files/add?[]"]
)
def test_a_malformed_reference_is_a_configuration_error_naming_it(reference):
    with pytest.raises(ConfigurationError, match="MCP tool reference"):
        load_tool(reference)


# -- failures become error results ----------------------------------------------------------
@pytest.mark.django_db
def test_a_tool_error_from_the_server_is_an_error_result(files, scripted, user):
    scripted.add([tool_call("read_file", {"path": "secret.txt"}), tool_call("explode")], "Sorry.")
    chat = Chat.objects.create(model="scripted:test", owner=user).with_mcp("files")

    assert chat.ask("Read secret.txt").content == "Sorry."

    assert results(chat) == [
        ("read_file", "Error executing tool read_file: No such file: secret.txt", True),
        ("explode", "Error executing tool explode", True),
    ]
    assert set(ToolCall.objects.values_list("state", flat=True)) == {ToolCallState.FAILED}


@pytest.mark.django_db
def test_a_server_that_is_down_gives_an_error_result_not_a_crashed_step(http_files, scripted, user):
    chat = Chat.objects.create(model="scripted:test", owner=user).with_mcp("files")
    scripted.add(tool_call("list_files"), "The file server is down.")
    refused = {"url": f"http://127.0.0.1:{free_port()}/mcp"}  # nothing listens there

    with configure(files=refused):
        answer = chat.ask("List my files")

    assert answer.content == "The file server is down."
    ((name, content, is_error),) = results(chat)
    assert (name, is_error) == ("list_files", True)
    assert content.startswith("MCP server 'files' is unavailable: ConnectError")


@pytest.mark.django_db
def test_a_stdio_server_that_exits_at_once_gives_an_error_result(http_files, scripted, user):
    chat = Chat.objects.create(model="scripted:test", owner=user).with_mcp("files", only=["add"])
    scripted.add(tool_call("add", {"a": 1, "b": 2}), "It failed.")

    with configure(files={"command": [sys.executable, "-c", "pass"], "timeout": 10}):
        chat.ask("1 + 2?")

    ((_, content, is_error),) = results(chat)
    assert is_error
    assert content.startswith("MCP server 'files' is unavailable:")


@pytest.mark.django_db
def test_a_call_that_takes_too_long_is_an_error_result_and_the_session_lives_on(
    http_server, scripted, user
):
    with configure(files={"url": http_server.url, "timeout": 0.5}):
        chat = Chat.objects.create(model="scripted:test", owner=user)
        chat.with_mcp("files", only=["slow", "add"])
        scripted.add(tool_call("slow", {"seconds": 5}), tool_call("add", {"a": 1, "b": 1}), "ok")

        chat.ask("Be slow, then add")

    assert results(chat) == [
        ("slow", "MCP server 'files' did not run 'slow' within 0.5 s.", True),
        ("add", "2", False),
    ]


def test_a_server_that_does_not_connect_in_time_fails_the_call_with_a_tool_error(http_files):
    (add,) = mcp_tools("files", only=["add"])
    silent = {"command": [sys.executable, "-c", "import time; time.sleep(60)"]}

    with (
        configure(files={**silent, "connect_timeout": 0.5}),
        pytest.raises(ToolError, match=r"^MCP server 'files' did not connect within 0\.5 s\.$"),
    ):
        add().execute(a=1, b=2)


@pytest.mark.django_db
def test_calls_on_tool_threads_share_the_session(stdio_files, scripted, user):
    chat = Chat.objects.create(model="scripted:test", owner=user)
    chat.with_mcp("files", only=["slow", "add", "server_process"])
    chat.with_tool_options(concurrency="threads")
    round_ = [
        tool_call("slow", {"seconds": 0.3}),
        tool_call("add", {"a": 20, "b": 22}),
        tool_call("slow", {"seconds": 0.1}),
        tool_call("server_process"),
    ]
    scripted.add(round_, "Done.")

    assert chat.ask("Go").content == "Done."

    assert sorted(content for _, content, _ in results(chat))[:3] == ["42", "slept", "slept"]
    assert [c["tool"] for c in calls(stdio_files)].count("slow") == 2
    assert not any(is_error for _, _, is_error in results(chat))
    in_round = next(content for name, content, _ in results(chat) if name == "server_process")
    assert load_tool(chat.tools[2])().execute() == in_round  # the same server: one session


@pytest.mark.django_db(transaction=True)
def test_a_cancel_stops_waiting_for_a_long_call(stdio_files, scripted, user):
    chat = Chat.objects.create(model="scripted:test", owner=user).with_mcp("files", only=["slow"])
    scripted.add(tool_call("slow", {"seconds": 120}))  # far past the 30 s timeout

    def cancel_once_it_runs() -> None:
        try:
            deadline = time.monotonic() + DEADLINE
            while not calls(stdio_files) and time.monotonic() < deadline:
                time.sleep(0.02)
            Chat.objects.get(pk=chat.pk).cancel()
        finally:
            connection.close()

    canceller = threading.Thread(target=cancel_once_it_runs)
    canceller.start()
    try:
        with pytest.raises(CancelledError):
            chat.ask("Sleep for two minutes")
    finally:
        canceller.join(timeout=60)

    assert results(chat) == [("slow", STOPPED_RESULT, True)]


def test_a_failure_is_logged_without_the_servers_url_or_headers(caplog):
    port = free_port()
    entry = {"url": f"http://127.0.0.1:{port}/mcp?key=s3cret", "headers": {"X-Key": "s3cret2"}}

    with configure(files=entry), pytest.raises(MCPServerError):
        mcp_tools("files")

    (record,) = [r for r in caplog.records if r.name == "agentloop.tools.mcp._connections"]
    assert record.getMessage().startswith("MCP server 'files' is unavailable: ConnectError")
    assert "s3cret" not in caplog.text
    assert str(port) not in caplog.text


def test_listing_the_tools_of_a_server_that_is_down_raises_mcp_server_error():
    with (
        configure(files={"url": f"http://127.0.0.1:{free_port()}/mcp"}),
        pytest.raises(MCPServerError, match=r"^MCP server 'files' is unavailable: ConnectError"),
    ):
        mcp_tools("files")


# -- approval -------------------------------------------------------------------------------
@pytest.mark.django_db
def test_a_tool_that_requires_approval_waits_then_runs_after_approve(http_files, scripted, user):
    chat = Chat.objects.create(model="scripted:test", owner=user)
    chat.with_mcp("files", only=["read_file", "delete-file"], requires_approval=["delete-file"])
    scripted.add(tool_call("delete-file", {"path": "notes.txt"}, id="d1"), "Deleted.")

    chat.ask("Delete my notes")

    assert chat.is_waiting()
    assert [call.call_id for call in chat.pending_approvals()] == ["d1"]
    assert calls(http_files) == []  # not run without a decision

    chat = Chat.objects.get(pk=chat.pk)  # another request, rebuilt from the row
    chat.approve("d1", by=user)
    answer = chat.complete()

    assert answer.content == "Deleted."
    assert results(chat) == [("delete-file", "Deleted notes.txt.", False)]
    assert [c["tool"] for c in calls(http_files)] == ["delete-file"]


def test_keys_a_server_schema_refuses_are_unexpected_and_others_are_left_to_the_server():
    closed = type(
        "Closed", (MCPTool,),
        {"input_schema": {"type": "object", "properties": {"path": {"type": "string"}},
                          "additionalProperties": False}},
    )  # fmt: skip
    open_ = type("Open", (MCPTool,), {"input_schema": {"properties": {"path": {}}}})

    assert closed.unexpected_keys({"path": "a", "force\n": True}) == ["force\n"]
    assert open_.unexpected_keys({"path": "a", "force": True}) == []


def test_requires_approval_true_holds_every_tool_of_the_server(http_files):
    tools = mcp_tools("files", only=["add", "read_file"], requires_approval=True)

    assert [tool.needs_approval({}) for tool in tools] == [True, True]
    assert all(load_mcp_tool(tool.reference()).needs_approval({}) for tool in tools)

"""The real AG-UI client, ``@ag-ui/client``'s ``HttpAgent`` (pinned in
frontends/agui-client/package-lock.json, installed with ``npm ci``), driven by node against
agentloop's AG-UI view in a live server (uvicorn, ASGI, the useChat site's settings and
model: tests/usechat_site/). frontends/agui-client/round-trip.mjs sends a message whose
run ends in an interrupt (a call waiting for approval), answers it through ``resume``, and
reloads (a new agent on the thread, no messages); the client's own verifier checks every
event it receives (an event out of order fails its run, and the script).

Skipped when node or npm is missing, except under ``CI=true``, where that fails the run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.test import Client
from django.urls import reverse
from django.utils.crypto import get_random_string

from agentloop.models import Chat, Message, ToolCall
from tests.browsers import Server, free_port
from tests.doc_blocks import ROOT, blocks_of
from tests.frontend_build import install_agui_client, node_missing, skip_or_fail
from tests.tools import transfer

SERVER_SETTINGS = {
    "BACKGROUND": "embedded",
    "PARTIAL_SAVE_INTERVAL": 0.1,
    "EVENTS_POLL_INTERVAL": 0.1,
}

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.subprocess,
    pytest.mark.usefixtures("no_run_left_behind"),
]


@pytest.fixture(scope="module")
def client_folder() -> Any:
    if reason := node_missing():
        skip_or_fail(reason, "the AG-UI client test")
    return install_agui_client()


@pytest.fixture(scope="module")
def site(client_folder, django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[Server]:
    """uvicorn (ASGI) serving the useChat test site, which includes agentloop's URLs."""
    port = free_port()
    command = [
        sys.executable, "-m", "uvicorn", "tests.asgi:application", "--host", "127.0.0.1",
        "--port", str(port), "--log-level", "warning",
    ]  # fmt: skip
    environment = {"DJANGO_SETTINGS_MODULE": "tests.usechat_site.settings"}
    with django_db_blocker.unblock():
        server = Server(
            command,
            port,
            tmp_path_factory.mktemp("agui") / "server.log",
            SERVER_SETTINGS,
            environment,
        )
    yield server
    server.stop()


def documented_steps() -> str:
    """docs/frontends.md's steps for the AG-UI client (its bash block naming round-trip.mjs)."""
    page = (ROOT / "docs" / "frontends.md").read_text()
    (steps,) = [
        b.code for b in blocks_of(page) if b.language == "bash" and "round-trip.mjs" in b.code
    ]
    return steps


def run_client(folder: Any, site: Server, chat: Chat, person: Any) -> dict[str, Any]:
    """round-trip.mjs's report, logged in as ``person`` (a session and a CSRF token, as a
    page of the site would have them), run as docs/frontends.md says (checked here)."""
    steps = documented_steps()
    assert steps.startswith("cd frontends/agui-client && npm ci\n")
    assert "AGENTLOOP_COOKIE=" in steps and "AGENTLOOP_CSRF=" in steps
    assert "node round-trip.mjs http://localhost:8000/agentloop/ag-ui 42" in steps
    assert reverse("agentloop:ag-ui") == "/agentloop/ag-ui"
    browser = Client()
    browser.force_login(person)
    session = browser.cookies[settings.SESSION_COOKIE_NAME].value
    token = get_random_string(32)
    cookie = f"{settings.SESSION_COOKIE_NAME}={session}; {settings.CSRF_COOKIE_NAME}={token}"
    result = subprocess.run(  # noqa: S603 - node with our own script
        ["node", "round-trip.mjs", site.url + reverse("agentloop:ag-ui"), str(chat.pk)],  # noqa: S607
        cwd=folder,
        env={
            "PATH": os.environ.get("PATH", ""),  # where node_missing() found node
            "AGENTLOOP_COOKIE": cookie,
            "AGENTLOOP_CSRF": token,
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"{result.stderr}\n--- server:\n{site.output()}"
    return json.loads(result.stdout.strip().splitlines()[-1])


def of_run(report: dict[str, Any], run: str) -> list[dict[str, Any]]:
    return [event for event in report["events"] if event["run"] == run]


def kinds(events: list[dict[str, Any]]) -> list[str]:
    """The event types, less the state's (their number depends on the polls)."""
    return [e["type"] for e in events if e["type"] not in ("STATE_SNAPSHOT", "STATE_DELTA")]


def test_httpagent_runs_a_chat_through_an_approval_and_a_reload(client_folder, site, person):
    chat = Chat.objects.create(owner=person, model="usechat:test").with_tools(transfer)

    report = run_client(client_folder, site, chat, person)

    call = ToolCall.objects.get(chat=chat)
    user_row, call_row, result_row, answer_row = Message.objects.filter(chat=chat).order_by("id")
    thread = str(chat.pk)

    # 1. The message: the call streams, the run ends in the approval's interrupt.
    first = of_run(report, "run-1")
    assert kinds(first) == [
        "RUN_STARTED", "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "CUSTOM",
        "RUN_FINISHED",
    ]  # fmt: skip
    assert first[0]["threadId"] == thread and first[0]["runId"] == "run-1"
    start = next(e for e in first if e["type"] == "TOOL_CALL_START")
    assert (start["toolCallName"], start["parentMessageId"]) == ("transfer", f"m{call_row.pk}")
    custom = next(e for e in first if e["type"] == "CUSTOM")
    assert custom["name"] == "agentloop.approval_requested"
    assert custom["value"]["arguments"] == {"amount": 5, "to": "bob"}
    [interrupt] = first[-1]["outcome"]["interrupts"]
    assert interrupt["id"] == str(call.pk) and interrupt["reason"] == "tool_approval"
    assert [e["snapshot"]["chat"] for e in first if e["type"] == "STATE_SNAPSHOT"] == [thread]

    # 2. The client refuses a run that leaves its interrupt unanswered: nothing was sent.
    assert "pending interrupt" in report["refused"]
    assert of_run(report, "run-unanswered") == []

    # 3. The answer (resume): the call runs with the person's approval, the answer streams.
    second = of_run(report, "run-2")
    assert kinds(second) == [
        "RUN_STARTED", "TOOL_CALL_RESULT", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END", "RUN_FINISHED",
    ]  # fmt: skip
    result = next(e for e in second if e["type"] == "TOOL_CALL_RESULT")
    assert (result["toolCallId"], result["content"]) == (call.call_id, "sent 5 to bob")
    assert second[-1]["outcome"] == {"type": "success"}
    assert (call.decision, call.decided_by_id) == ("approved", person.pk)
    text = "".join(e["delta"] for e in second if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert text == answer_row.content == "Done: sent 5 to bob."

    # What the agent holds: its own user message, then the run's messages by their ids.
    held = [(m["role"], m["id"]) for m in report["messages"]]
    assert held == [
        ("user", "client-1"),
        ("assistant", f"m{call_row.pk}"),
        ("tool", f"t{result_row.pk}"),
        ("assistant", f"m{answer_row.pk}"),
    ]

    # 4. A reload: the persisted chat as a snapshot, and the chat's state.
    third = of_run(report, "run-3")
    assert kinds(third) == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]
    assert [(m["role"], m["id"]) for m in report["reloadedMessages"]] == [
        ("user", f"u{user_row.pk}"),
        ("assistant", f"m{call_row.pk}"),
        ("tool", f"t{result_row.pk}"),
        ("assistant", f"m{answer_row.pk}"),
    ]
    assert report["reloadedMessages"][-1]["content"] == "Done: sent 5 to bob."
    assert report["reloadedState"] == {"chat": thread, "state": "idle"}

"""An MCP server's questions (elicitation) answered by a person (docs/mcp.md, "When a
server asks for input"): the test server's ``book_table`` (tests/mcp_server.py, a real
server process over stdio and streamable HTTP) asks how many people and in whose name; the
call is held open while the question waits on its ``ToolCall`` row, and the person's answer
(through the Python API or the views), a refusal, or the timeout goes back to the server.
The tool runs once whatever the answer."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse

from agentloop import data
from agentloop.exceptions import CancelledError, InvalidAnswerError, ToolCallNotWaitingError
from agentloop.models import Chat, ToolCall
from agentloop.testing import tool_call
from agentloop.tools.mcp import STOPPED_RESULT, close_connections
from tests.mcp_servers import DEADLINE, calls, configure, stdio_entry

pytestmark = [pytest.mark.subprocess, pytest.mark.django_db(transaction=True)]

QUESTION = "A table on friday: for how many people, in whose name?"


@pytest.fixture(autouse=True)
def _fresh_sessions() -> Iterator[None]:
    yield
    close_connections()


@pytest.fixture
def tables(http_server) -> Iterator[tuple[dict[str, Any], Path]]:
    """Server "tables" (the test server, allowed to ask) over streamable HTTP, and its log.

    The module's one HTTP server (each test empties its log): the flows of questions and
    answers are the same whatever carries them, so most tests run on this transport alone,
    and those that end in each of the answers the server can hear (content accepted, a
    cancel) run on stdio too (:func:`tables_on_each_transport`)."""
    http_server.log.unlink(missing_ok=True)
    yield {"url": http_server.url, "elicitation": True}, http_server.log


@pytest.fixture(params=["stdio", "http"])
def tables_on_each_transport(request, tmp_path) -> Iterator[tuple[dict[str, Any], Path]]:
    """Server "tables" over stdio (a process of its own) or HTTP, and its log."""
    if request.param == "stdio":
        log = tmp_path / "stdio-calls.log"
        yield stdio_entry(log, elicitation=True), log
    else:
        yield request.getfixturevalue("tables")


def wait_for(check: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class InThread:
    """``chat.ask(text)`` on a thread of its own (it waits for the person's answer)."""

    def __init__(self, chat: Chat, text: str) -> None:
        self.outcome: Any = None
        self.thread = threading.Thread(target=self._run, args=(chat.pk, text))
        self.thread.start()

    def _run(self, pk: int, text: str) -> None:
        try:
            self.outcome = Chat.objects.get(pk=pk).ask(text).content
        except Exception as exc:  # noqa: BLE001 - handed to the test
            self.outcome = exc
        finally:
            connection.close()

    def result(self) -> Any:
        self.thread.join(timeout=DEADLINE)
        assert not self.thread.is_alive(), "the chat's step did not end"
        return self.outcome


def question_of(chat: Chat) -> ToolCall:
    (call,) = wait_for(lambda: Chat.objects.get(pk=chat.pk).pending_questions(), "the question")
    return call


def result_of(chat: Chat) -> tuple[str, bool]:
    message = chat.messages.get(role="tool")
    return message.content, message.is_error


def booking_chat(user: Any, scripted: Any, entry: dict[str, Any]) -> Chat:
    with configure(tables=entry):
        chat = Chat.objects.create(model="scripted:test", owner=user)
        chat.with_mcp("tables", only=["book_table"])
    scripted.add(tool_call("book_table", {"day": "friday"}, id="call_1"), "All set.")
    return chat


def test_a_person_answers_through_the_python_api_and_the_server_gets_it(
    tables, scripted, user, owner
):
    entry, log = tables
    chat = booking_chat(user, scripted, entry)
    with configure(tables={**entry, "timeout": 2}):  # shorter than the person takes
        step = InThread(chat, "Book a table for Friday")
        asked = question_of(chat)
        assert (asked.question, asked.wait_reason, asked.state) == (
            QUESTION,
            "elicitation",
            "running",
        )
        assert asked.elicitation["schema"]["required"] == ["people", "name"]
        # A page loaded now shows the question (the history, from the database).
        history = owner.get(reverse("agentloop:usechat-messages", args=[chat.pk])).json()
        (shown,) = [
            part
            for message in history["messages"]
            for part in message["parts"]
            if part["type"] == "data-agentloop-question"
        ]
        assert shown["data"]["question"] == QUESTION
        assert shown["data"]["schema"] == asked.elicitation["schema"]
        time.sleep(2.5)  # the person's time doesn't count against the call's timeout

        with pytest.raises(InvalidAnswerError) as refused:
            chat.answer(asked, {"people": "many", "name": "Ada"}, by=user)
        message = str(refused.value)
        assert message == "Invalid answer to 'book_table': people: 'many' is not of type 'integer'"
        assert "\n" not in message
        assert [c.pk for c in chat.pending_questions()] == [asked.pk]  # still open

        chat.answer(asked.call_id, {"people": 3, "name": "Ada"}, by=user)
        assert step.result() == "All set."

    assert result_of(chat) == ("Booked a table on friday for 3, name Ada.", False)
    row = ToolCall.objects.get(pk=asked.pk)
    assert (row.state, row.wait_reason) == ("succeeded", "")
    response = row.elicitation["response"]
    assert (response["action"], response["content"], response["by"]) == (
        "accept",
        {"people": 3, "name": "Ada"},
        user.pk,
    )
    assert [c["tool"] for c in calls(log)] == ["book_table", "book_table answered"]  # once
    assert chat.pending_questions() == []


def test_a_person_answers_and_declines_through_the_views(tables, scripted, user, django_user_model):
    entry, log = tables
    chat = booking_chat(user, scripted, entry)
    mallory = django_user_model.objects.create_user("mallory", password="pw")
    with configure(tables=entry):
        step = InThread(chat, "Book a table for Friday")
        asked = question_of(chat)
        answer = reverse("agentloop:answer", args=[chat.pk, asked.pk])
        decline = reverse("agentloop:decline", args=[chat.pk, asked.pk])

        browser = Client(enforce_csrf_checks=True)
        browser.force_login(user)
        assert browser.get(answer).status_code == 405
        assert browser.post(answer, {"text": '{"people": 2}'}).status_code == 403  # no CSRF

        stranger = Client()
        stranger.force_login(mallory)
        assert stranger.post(answer, {"text": '{"people": 2, "name": "M"}'}).status_code == 404
        assert stranger.post(decline).status_code == 404

        owner = Client()
        owner.force_login(user)
        refused = owner.post(answer, {"text": '{"people": 2}'})
        assert refused.status_code == 400
        assert refused.content.decode() == (
            "Invalid answer to 'book_table': 'name' is a required property"
        )
        assert owner.post(decline, {"action": "shrug"}).status_code == 400
        assert chat.pending_questions() != []  # nothing was written

        assert owner.post(decline).status_code == 204
        assert step.result() == "All set."
        # Too late for another answer: the question is closed.
        assert owner.post(answer, {"text": '{"people": 2, "name": "Ada"}'}).status_code == 409

    assert result_of(chat) == ("No table booked on friday: the person chose decline.", False)
    assert ToolCall.objects.get(pk=asked.pk).elicitation["response"]["by"] == user.pk
    assert [c["tool"] for c in calls(log)] == ["book_table", "book_table answered"]


def test_an_answer_through_the_view_reaches_the_server(tables_on_each_transport, scripted, user):
    entry, log = tables_on_each_transport
    chat = booking_chat(user, scripted, entry)
    with configure(tables=entry):
        step = InThread(chat, "Book a table for Friday")
        asked = question_of(chat)
        owner = Client()
        owner.force_login(user)
        url = reverse("agentloop:answer", args=[chat.pk, asked.pk])
        assert owner.post(url, {"text": '{"people": 4, "name": "Grace"}'}).status_code == 204
        assert step.result() == "All set."
    assert result_of(chat) == ("Booked a table on friday for 4, name Grace.", False)
    assert [c["tool"] for c in calls(log)] == ["book_table", "book_table answered"]


def test_a_question_nobody_answers_in_time_is_cancelled(tables, scripted, user):
    entry, log = tables
    chat = booking_chat(user, scripted, entry)
    with configure(tables={**entry, "elicitation_timeout": 1}):
        step = InThread(chat, "Book a table for Friday")
        asked = question_of(chat)
        assert step.result() == "All set."

    assert result_of(chat) == ("No table booked on friday: the person chose cancel.", False)
    response = ToolCall.objects.get(pk=asked.pk).elicitation["response"]
    assert (response["action"], response["reason"]) == ("cancel", "no answer in time")
    with pytest.raises(ToolCallNotWaitingError):
        chat.decline(asked, by=user)
    assert [c["tool"] for c in calls(log)] == ["book_table", "book_table answered"]


def test_a_cancel_stops_the_wait_and_the_server_hears_cancel(
    tables_on_each_transport, scripted, user
):
    entry, log = tables_on_each_transport
    chat = booking_chat(user, scripted, entry)
    with configure(tables=entry):
        step = InThread(chat, "Book a table for Friday")
        asked = question_of(chat)
        assert Chat.objects.get(pk=chat.pk).cancel() is True
        assert isinstance(step.result(), CancelledError)

    assert result_of(chat) == (STOPPED_RESULT, True)
    response = ToolCall.objects.get(pk=asked.pk).elicitation["response"]
    assert (response["action"], response["reason"]) == ("cancel", "the chat was cancelled")
    wait_for(lambda: len(calls(log)) == 2, "the server to hear the cancel")
    assert (calls(log)[1]["tool"], calls(log)[1]["arguments"]) == (
        "book_table answered",
        {"action": "cancel"},
    )


def test_a_server_not_allowed_to_ask_gets_an_error_and_no_person_is_asked(tables, scripted, user):
    entry, _ = tables
    not_allowed = {**entry, "elicitation": False}
    chat = booking_chat(user, scripted, not_allowed)
    with configure(tables=not_allowed):
        assert chat.ask("Book a table for Friday").content == "All set."
    content, is_error = result_of(chat)
    assert is_error and "book_table" in content
    assert ToolCall.objects.get(chat=chat).elicitation is None


def test_the_admin_inbox_lists_the_servers_question_and_answers_or_declines_it(
    tables, scripted, user, admin_client
):
    entry, log = tables
    chat = booking_chat(user, scripted, entry)
    inbox = reverse("admin:agentloop_chat_inbox")
    with configure(tables=entry):
        step = InThread(chat, "Book a table for Friday")
        asked = question_of(chat)
        page = admin_client.get(f"{inbox}?kind=question").content.decode()
        assert f'data-call="{asked.pk}"' in page
        assert "A table on friday: for how many people, in whose name?" in page
        assert "&quot;required&quot;" in page  # the requested schema, escaped

        decide = reverse("admin:agentloop_chat_inbox_decide", args=[asked.pk])
        too_few = '{"people": 0, "name": "Ada"}'
        refused = admin_client.post(decide, {"decision": "answer", "text": too_few})
        assert refused.status_code == 400
        assert (
            "Invalid answer to &#x27;book_table&#x27;: people: 0 is less than the minimum of 1"
            in refused.content.decode()
        )
        assert admin_client.post(decide, {"decision": "decline"}).status_code == 302
        assert step.result() == "All set."

    assert result_of(chat) == ("No table booked on friday: the person chose decline.", False)
    assert f'data-call="{asked.pk}"' not in admin_client.get(inbox).content.decode()
    assert calls(log)[1]["arguments"] == {"action": "decline"}


FAST = {"EVENTS_POLL_INTERVAL": 0.02, "EVENTS_KEEPALIVE": 0.5, "PARTIAL_SAVE_INTERVAL": 0.0}


def read_parts(response: Any, on_part: Callable[[dict[str, Any]], None]) -> list[dict[str, Any]]:
    """The parts of a UI message stream up to ``[DONE]``, each handed to ``on_part``."""
    assert response.status_code == 200, response.content
    buffer, parts = b"", []
    for piece in response.streaming_content:
        buffer += piece
        while b"\n\n" in buffer:
            block, buffer = buffer.split(b"\n\n", 1)
            if block.startswith(b":"):
                continue  # a keep-alive comment
            data = block.removeprefix(b"data: ")
            if data == b"[DONE]":
                return parts
            parts.append(json.loads(data))
            on_part(parts[-1])
    raise AssertionError("the stream ended without [DONE]")


def test_usechat_streams_the_question_while_the_run_goes_on_and_the_page_answers_it(
    tables, scripted, user, owner, settings
):
    entry, log = tables
    settings.AGENTLOOP = {**settings.AGENTLOOP, **FAST, "MCP_SERVERS": {"tables": entry}}
    chat = booking_chat(user, scripted, entry)
    answered: list[int] = []

    def answer_the_question(part: dict[str, Any]) -> None:
        if part["type"] == "data-agentloop-question":
            url = reverse("agentloop:answer", args=[chat.pk, part["data"]["callId"]])
            content = '{"people": 2, "name": "Lin"}'
            answered.append(owner.post(url, {"text": content}).status_code)

    said = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "Book a table"}]}
    request = {"id": str(chat.pk), "messages": [said], "trigger": "submit-message"}
    sent = owner.post(
        reverse("agentloop:usechat"), json.dumps(request), content_type="application/json"
    )
    parts = read_parts(sent, answer_the_question)

    asked = ToolCall.objects.get(chat=chat)
    (question,) = [part for part in parts if part["type"] == "data-agentloop-question"]
    assert question["data"]["question"] == QUESTION
    assert question["data"]["toolCallId"] == "call_1"
    assert question["data"]["schema"]["required"] == ["people", "name"]
    assert question["id"] == f"question-{asked.pk}"
    assert answered == [204]
    outputs = [part for part in parts if part["type"] == "tool-output-available"]
    assert [part["output"] for part in outputs] == ["Booked a table on friday for 2, name Lin."]
    assert [c["tool"] for c in calls(log)] == ["book_table", "book_table answered"]


def test_erasing_a_person_erases_their_answers_to_servers_on_other_owners_chats(
    user, django_user_model
):
    other = django_user_model.objects.create_user("bob", password="pw")
    theirs = Chat.objects.create(model="scripted:test", owner=other)
    message = theirs.messages.create(role="assistant", content="")
    response = {"action": "accept", "content": {"name": "Ada Lovelace"}, "by": user.pk}
    asked = {"server": "tables", "message": QUESTION, "schema": {}, "response": response}
    call = ToolCall.objects.create(
        chat=theirs, message=message, call_id="c1", name="book_table", elicitation=asked
    )
    exported = data.export_owner(other)

    data.erase_owner(user)

    call.refresh_from_db()
    assert call.elicitation["response"] == {"action": "accept", "content": "[erased]", "by": None}
    assert call.elicitation["message"] == QUESTION  # the server's words are not the person's
    assert "Ada Lovelace" in json.dumps(exported, default=str)  # the owner's export has it


def test_ag_ui_streams_the_question_while_the_run_goes_on_and_resume_answers_it(
    tables, scripted, user, owner, settings
):
    """AG-UI (docs/frontends.md): the server's question is a ``CUSTOM`` event with its schema
    while the run goes on; the client's next run answers it through ``resume`` (a refused
    answer first: 400, the question still open)."""
    entry, log = tables
    settings.AGENTLOOP = {**settings.AGENTLOOP, **FAST, "MCP_SERVERS": {"tables": entry}}
    chat = booking_chat(user, scripted, entry)
    statuses: list[int] = []

    def run_input(**fields: Any) -> str:
        return json.dumps(
            {"threadId": str(chat.pk), "runId": "run-1", "messages": [], "tools": [],
             "context": [], "state": {}, "forwardedProps": {}, **fields}
        )  # fmt: skip

    def answer_the_question(event: dict[str, Any]) -> None:
        if event["type"] == "CUSTOM" and event["name"] == "agentloop.question":
            interrupt = event["value"]["interruptId"]
            for payload in ({"people": "two"}, {"people": 2, "name": "Lin"}):
                resume = [{"interruptId": interrupt, "status": "resolved", "payload": payload}]
                sent = owner.post(url, run_input(resume=resume), content_type="application/json")
                statuses.append(sent.status_code)
                sent.close()

    url = reverse("agentloop:ag-ui")
    said = {"id": "client-1", "role": "user", "content": "Book a table"}
    response = owner.post(url, run_input(messages=[said]), content_type="application/json")
    events = read_sse(response, answer_the_question)

    asked = ToolCall.objects.get(chat=chat)
    (question,) = [e for e in events if e["type"] == "CUSTOM"]
    assert question["value"]["question"] == QUESTION
    assert question["value"]["schema"]["required"] == ["people", "name"]
    assert question["value"]["toolCallId"] == "call_1"
    assert question["value"]["interruptId"] == str(asked.pk)
    assert statuses == [400, 200]
    results = [e["content"] for e in events if e["type"] == "TOOL_CALL_RESULT"]
    assert results == ["Booked a table on friday for 2, name Lin."]
    assert events[-1]["type"] == "RUN_FINISHED"
    assert events[-1]["outcome"] == {"type": "success"}
    assert [c["tool"] for c in calls(log)] == ["book_table", "book_table answered"]


def read_sse(response: Any, on_event: Callable[[dict[str, Any]], None]) -> list[dict[str, Any]]:
    """An AG-UI stream's events to its end, each handed to ``on_event``."""
    assert response.status_code == 200, response.content
    buffer, events = b"", []
    for piece in response.streaming_content:
        buffer += piece
        while b"\n\n" in buffer:
            block, buffer = buffer.split(b"\n\n", 1)
            if block.startswith(b":"):
                continue  # a keep-alive comment
            events.append(json.loads(block.removeprefix(b"data: ")))
            on_event(events[-1])
    return events

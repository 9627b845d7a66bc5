"""The AG-UI view (``agentloop:ag-ui``) without a client library: a ``RunAgentInput`` in, the
run out as AG-UI events; interrupts answered through ``resume`` (and tool messages) with
the chat's approve, deny and answer verbs; a replay of the persisted chat; the access rules
(owner or permitted staff, CSRF, 404). And the translation of live events into AG-UI events
(``agentloop.web._ag_ui``), without a database.

Runs go through ``complete_later()`` on the embedded runner; the stream is read through
Django's test client (sync), and once through ``AsyncClient``. tests/test_ag_ui_client.py
drives the same view with the real ``@ag-ui/client`` package.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient, Client
from django.urls import reverse

from agentloop.engine import CANCELLED_TOOL_RESULT
from agentloop.models import Chat, ChatState, Message, ToolCall
from agentloop.runners import wait_for_embedded_jobs
from agentloop.testing import stream, tool_call
from agentloop.tools import AskPerson
from agentloop.web._ag_ui import AgUiFollower, AgUiTranslator, Answer, parse_run_input
from tests.redis_urls import redis_url
from tests.tools import add, transfer

pytestmark = pytest.mark.django_db(transaction=True)

DEADLINE = 30.0
IN_CI = os.environ.get("CI") == "true"
REDIS_URL = redis_url(1 + os.getpid() % 14)
FAST = {"EVENTS_POLL_INTERVAL": 0.02, "EVENTS_KEEPALIVE": 0.5, "PARTIAL_SAVE_INTERVAL": 0.0}


@pytest.fixture(autouse=True)
def _fast(settings):
    settings.AGENTLOOP = {**settings.AGENTLOOP, **FAST}
    yield
    wait_for_embedded_jobs(DEADLINE)


def run_input(chat: Chat, *messages: dict[str, Any], run_id: str = "run-1", **fields: Any) -> str:
    return json.dumps(
        {
            "threadId": str(chat.pk),
            "runId": run_id,
            "messages": list(messages),
            "tools": [],
            "context": [],
            "state": {},
            "forwardedProps": {},
            **fields,
        }
    )


def user_says(text: str, id: str = "client-1") -> dict[str, Any]:  # noqa: A002
    return {"id": id, "role": "user", "content": text}


def post(client: Client, payload: str, **extra: Any):
    return client.post(
        reverse("agentloop:ag-ui"), payload, content_type="application/json", **extra
    )


def read_events(response) -> list[dict[str, Any]]:
    """The events of an AG-UI stream, to its end (which must be RUN_FINISHED or RUN_ERROR)."""
    assert response.status_code == 200, response.content
    buffer, events = b"", []
    deadline = time.monotonic() + DEADLINE
    for piece in response.streaming_content:
        buffer += piece
        while b"\n\n" in buffer:
            block, buffer = buffer.split(b"\n\n", 1)
            if block.startswith(b":"):
                continue  # a keep-alive comment
            assert block.startswith(b"data: "), block
            events.append(json.loads(block.removeprefix(b"data: ")))
        assert time.monotonic() < deadline, f"no end in time; so far {events}"
    assert buffer == b""
    assert events and events[-1]["type"] in ("RUN_FINISHED", "RUN_ERROR"), events
    return events


def without_state(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events less the state's (their number depends on the polls that saw a change)."""
    return [e for e in events if e["type"] not in ("STATE_SNAPSHOT", "STATE_DELTA")]


def states(events: list[dict[str, Any]]) -> list[str]:
    """The chat's states as a client following the STATE_* events holds them."""
    seen = []
    for event in events:
        if event["type"] == "STATE_SNAPSHOT":
            seen.append(event["snapshot"]["state"])
        elif event["type"] == "STATE_DELTA":
            assert event["delta"][0]["path"] == "/state"
            seen.append(event["delta"][0]["value"])
    return seen


def answer_pk(chat: Chat) -> int:
    return Message.objects.filter(chat=chat, role="assistant").latest("id").pk


# -- a message in, the answer out ----------------------------------------------------------------
def test_a_message_is_answered_as_ag_ui_events(owner, chat, scripted):
    scripted.add("Hello, Ada.")

    response = post(owner, run_input(chat, user_says("Hi")))
    events = read_events(response)

    assert response["Content-Type"] == "text/event-stream"
    assert response["Cache-Control"] == "no-cache"
    thread = str(chat.pk)
    message_id = f"m{answer_pk(chat)}"
    assert without_state(events) == [
        {"type": "RUN_STARTED", "threadId": thread, "runId": "run-1"},
        {"type": "TEXT_MESSAGE_START", "messageId": message_id, "role": "assistant"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": message_id, "delta": "Hello, Ada."},
        {"type": "TEXT_MESSAGE_END", "messageId": message_id},
        {
            "type": "RUN_FINISHED",
            "threadId": thread,
            "runId": "run-1",
            "outcome": {"type": "success"},
        },
    ]
    assert events[1]["type"] == "STATE_SNAPSHOT"
    assert events[1]["snapshot"]["chat"] == thread
    # The state when the stream began: the runner may have begun, or (under load) finished.
    assert events[1]["snapshot"]["state"] in ("queued", "running", "idle")
    assert states(events)[-1] == "idle"
    assert Chat.objects.get(pk=chat.pk).messages.get(role="user").content == "Hi"


def test_a_tool_call_and_its_result_are_tool_call_events(owner, chat, scripted):
    chat.with_tools(add)
    scripted.add(tool_call("add", {"a": 2, "b": 3}, id="c1"), "5.")

    events = without_state(read_events(post(owner, run_input(chat, user_says("2+3?")))))

    rows = list(Message.objects.filter(chat=chat).order_by("id"))
    call_row, result_row, answer_row = rows[1], rows[2], rows[3]
    assert [e["type"] for e in events] == [
        "RUN_STARTED",
        "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT",
        "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END",
        "RUN_FINISHED",
    ]  # fmt: skip
    assert events[1] == {
        "type": "TOOL_CALL_START",
        "toolCallId": "c1",
        "toolCallName": "add",
        "parentMessageId": f"m{call_row.pk}",
    }
    assert json.loads(events[2]["delta"]) == {"a": 2, "b": 3}
    assert events[4] == {
        "type": "TOOL_CALL_RESULT",
        "messageId": f"t{result_row.pk}",
        "toolCallId": "c1",
        "content": "5",
        "role": "tool",
    }
    assert events[6]["messageId"] == f"m{answer_row.pk}"


def test_the_async_stream_under_asgi(user, chat, scripted):
    scripted.add("Hello.")
    client = AsyncClient()
    client.force_login(user)

    async def main():
        response = await client.post(
            reverse("agentloop:ag-ui"),
            run_input(chat, user_says("Hi")),
            content_type="application/json",
        )
        assert response.is_async
        return b"".join([piece async for piece in response.streaming_content])

    content = async_to_sync(main)()

    assert b'"delta":"Hello."' in content
    assert content.endswith(b'"outcome":{"type":"success"}}\n\n')


def test_a_cancel_mid_answer_ends_the_run_cancelled_with_the_message_closed(owner, chat, scripted):
    scripted.add(stream(*[f"w{i} " for i in range(20)], delay=0.1))
    response = post(owner, run_input(chat, user_says("Count")))
    pieces, seen = iter(response.streaming_content), b""
    while b"TEXT_MESSAGE_CONTENT" not in seen:
        seen += next(pieces)
    Chat.objects.get(pk=chat.pk).cancel()
    rest = b"".join(pieces)

    events = [json.loads(b[6:]) for b in (seen + rest).split(b"\n\n") if b.startswith(b"data: ")]
    kinds = [e["type"] for e in events]
    assert events[-1]["outcome"] == {"type": "cancelled"}
    assert kinds.count("TEXT_MESSAGE_START") == kinds.count("TEXT_MESSAGE_END") >= 1
    assert kinds.index("TEXT_MESSAGE_END") < kinds.index("RUN_FINISHED")


def test_a_failed_run_ends_with_run_error_and_one_line(owner, chat, scripted):
    scripted.add(RuntimeError("boom\n  File secret.py, line 1"))

    events = read_events(post(owner, run_input(chat, user_says("Hi"))))

    assert events[-1]["type"] == "RUN_ERROR"
    assert events[-1]["code"] == "chat_failed"
    assert "\n" not in events[-1]["message"] and "secret.py" not in events[-1]["message"]


@pytest.fixture
def redis_events(settings):
    redis = pytest.importorskip("redis")
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1)
    try:
        client.flushdb()
    except redis.RedisError as exc:
        if IN_CI:
            pytest.fail(f"Redis does not answer at {REDIS_URL}: {exc}")
        pytest.skip(f"Redis does not answer at {REDIS_URL}")
    settings.AGENTLOOP = {**settings.AGENTLOOP, "REDIS_URL": REDIS_URL}
    yield
    client.flushdb()
    client.close()


def test_with_redis_text_and_tool_calls_stream_chunk_by_chunk(redis_events, owner, chat, scripted):
    chat.with_tools(add)
    words = [f"w{i} " for i in range(5)]
    scripted.add(tool_call("add", {"a": 2, "b": 3}, id="c1"), stream(*words, delay=0.05))

    events = without_state(read_events(post(owner, run_input(chat, user_says("Count")))))

    contents = [e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT"]
    assert contents == words  # one event per chunk
    assert [e["type"] for e in events if e["type"].startswith("TOOL_CALL")] == [
        "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT",
    ]  # fmt: skip
    assert events[-1]["outcome"] == {"type": "success"}


# -- interrupts: approvals and questions ---------------------------------------------------------
@pytest.fixture
def waiting(owner, chat, scripted, run_log):
    """A chat whose call "t1" (transfer) waits for approval; the events that said so."""
    chat.with_tools(transfer)
    scripted.add(tool_call("transfer", {"amount": 5, "to": "bob"}, id="t1"))
    return read_events(post(owner, run_input(chat, user_says("Pay Bob"))))


def test_a_call_waiting_for_approval_ends_the_run_with_an_interrupt(chat, waiting):
    call = ToolCall.objects.get(call_id="t1")

    assert waiting[-2] == {
        "type": "CUSTOM",
        "name": "agentloop.approval_requested",
        "value": {
            "interruptId": str(call.pk),
            "toolCallId": "t1",
            "toolName": "transfer",
            "arguments": {"amount": 5, "to": "bob"},
        },
    }
    finished = waiting[-1]
    assert finished["outcome"]["type"] == "interrupt"
    [interrupt] = finished["outcome"]["interrupts"]
    assert interrupt["id"] == str(call.pk)
    assert interrupt["reason"] == "tool_approval"
    assert interrupt["toolCallId"] == "t1"
    assert interrupt["responseSchema"]["required"] == ["approved"]
    assert states(waiting)[-1] == "waiting"
    assert Chat.objects.get(pk=chat.pk).state == ChatState.WAITING


def resume(waiting: list[dict[str, Any]], payload: Any, status: str = "resolved") -> list[dict]:
    [interrupt] = waiting[-1]["outcome"]["interrupts"]
    return [{"interruptId": interrupt["id"], "status": status, "payload": payload}]


def test_resume_approving_runs_the_call_and_streams_the_rest(
    owner, user, chat, scripted, waiting, run_log
):
    scripted.add("Sent.")

    events = read_events(
        post(owner, run_input(chat, run_id="run-2", resume=resume(waiting, {"approved": True})))
    )

    kinds = [e["type"] for e in without_state(events)]
    assert kinds == [
        "RUN_STARTED", "TOOL_CALL_RESULT",
        "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END", "RUN_FINISHED",
    ]  # fmt: skip
    assert without_state(events)[1]["content"] == "sent 5 to bob"
    assert events[-1]["runId"] == "run-2"
    assert events[-1]["outcome"] == {"type": "success"}
    call = ToolCall.objects.get(call_id="t1")
    assert (call.decision, call.decided_by_id) == ("approved", user.pk)
    assert run_log.read_text().split() == ["transfer"]


def test_resume_denying_runs_nothing_and_passes_the_reason(owner, chat, scripted, waiting, run_log):
    scripted.add("Not sent.")
    payload = {"approved": False, "reason": "not today"}

    events = read_events(post(owner, run_input(chat, resume=resume(waiting, payload))))

    assert events[-1]["outcome"] == {"type": "success"}
    call = ToolCall.objects.get(call_id="t1")
    assert (call.decision, call.decision_reason) == ("denied", "not today")
    assert not run_log.exists()


def test_a_dismissed_interrupt_is_a_denial(owner, chat, scripted, waiting, run_log):
    scripted.add("Not sent.")

    read_events(post(owner, run_input(chat, resume=resume(waiting, None, "cancelled"))))

    assert ToolCall.objects.get(call_id="t1").decision == "denied"
    assert not run_log.exists()


def test_a_tool_message_with_the_approval_decides_too(owner, chat, scripted, waiting, run_log):
    scripted.add("Sent.")
    answer = {"id": "tool-1", "role": "tool", "toolCallId": "t1", "content": '{"approved": true}'}

    read_events(post(owner, run_input(chat, user_says("Pay Bob"), answer)))

    assert ToolCall.objects.get(call_id="t1").decision == "approved"
    assert run_log.read_text().split() == ["transfer"]


def test_an_interrupt_answered_twice_is_409(owner, chat, scripted, waiting):
    scripted.add("Sent.")
    entries = resume(waiting, {"approved": True})
    read_events(post(owner, run_input(chat, resume=entries)))

    again = post(owner, run_input(chat, resume=entries))

    assert again.status_code == 409
    assert ToolCall.objects.filter(call_id="t1", decision="approved").count() == 1


def test_an_interrupt_of_another_chat_is_409_and_changes_nothing(
    owner, user, chat, scripted, waiting
):
    other = Chat.objects.create(model="scripted:test", owner=user).with_tools(transfer)
    scripted.add(tool_call("transfer", {"amount": 9, "to": "eve"}, id="t2"))
    other.ask("Pay Eve")
    theirs = ToolCall.objects.get(call_id="t2")
    entries = [{"interruptId": str(theirs.pk), "status": "resolved", "payload": {"approved": True}}]

    response = post(owner, run_input(chat, resume=entries))

    assert response.status_code == 409
    assert ToolCall.objects.get(pk=theirs.pk).decision == ""


def test_an_approval_without_a_decision_is_400_and_decides_nothing(owner, chat, waiting):
    response = post(owner, run_input(chat, resume=resume(waiting, {"ok": "sure"})))

    assert response.status_code == 400
    assert response.content.decode().count("\n") == 0
    assert ToolCall.objects.get(call_id="t1").state == "waiting"


def test_a_new_message_while_calls_wait_is_409(owner, chat, waiting):
    response = post(owner, run_input(chat, user_says("Never mind", id="client-2")))

    assert response.status_code == 409
    assert b"interrupts" in response.content


def test_a_question_is_an_interrupt_and_resume_answers_it(owner, user, chat, scripted):
    chat.with_tools(AskPerson)
    scripted.add(tool_call("ask_person", {"question": "Which city?"}, id="q1"), "Lisbon it is.")
    asked = read_events(post(owner, run_input(chat, user_says("Plan a trip"))))
    call = ToolCall.objects.get(call_id="q1")

    assert asked[-2]["type"] == "CUSTOM"
    assert asked[-2]["name"] == "agentloop.question"
    assert asked[-2]["value"]["question"] == "Which city?"
    [interrupt] = asked[-1]["outcome"]["interrupts"]
    assert (interrupt["id"], interrupt["reason"]) == (str(call.pk), "input_required")
    assert interrupt["message"] == "Which city?"

    entries = [{"interruptId": str(call.pk), "status": "resolved", "payload": {"answer": "Lisbon"}}]
    events = read_events(post(owner, run_input(chat, resume=entries)))

    assert without_state(events)[1]["content"] == "Lisbon"
    assert "Lisbon it is." in [e.get("delta") for e in events]
    call.refresh_from_db()
    assert (call.decision, call.decided_by_id) == ("answered", user.pk)


# -- replay: a client that reloads ---------------------------------------------------------------
def test_no_new_message_replays_the_persisted_chat_and_its_interrupt(owner, chat, waiting):
    call = ToolCall.objects.get(call_id="t1")
    user_row, answer_row = Message.objects.filter(chat=chat).order_by("id")

    events = read_events(post(owner, run_input(chat, run_id="reload")))

    snapshot = next(e for e in events if e["type"] == "MESSAGES_SNAPSHOT")
    [function] = [call.pop("function") for call in snapshot["messages"][1]["toolCalls"]]
    assert snapshot["messages"] == [
        {"id": f"u{user_row.pk}", "role": "user", "content": "Pay Bob"},
        {
            "id": f"m{answer_row.pk}",
            "role": "assistant",
            "toolCalls": [{"id": "t1", "type": "function"}],
        },
    ]
    assert function["name"] == "transfer"
    assert json.loads(function["arguments"]) == {"amount": 5, "to": "bob"}  # JSON text, any order
    assert [e["type"] for e in without_state(events)] == [
        "RUN_STARTED", "MESSAGES_SNAPSHOT", "CUSTOM", "RUN_FINISHED",
    ]  # fmt: skip
    assert events[-1]["outcome"]["interrupts"][0]["id"] == str(call.pk)
    assert Message.objects.filter(chat=chat).count() == 2  # nothing was added


def test_the_servers_own_user_message_sent_back_is_not_new(owner, chat, scripted):
    scripted.add("Hello.")
    read_events(post(owner, run_input(chat, user_says("Hi"))))
    snapshot = next(
        e for e in read_events(post(owner, run_input(chat))) if e["type"] == "MESSAGES_SNAPSHOT"
    )
    user_message = snapshot["messages"][0]

    events = read_events(post(owner, run_input(chat, user_message)))

    assert [e["type"] for e in without_state(events)] == [
        "RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED",
    ]  # fmt: skip
    assert Message.objects.filter(chat=chat, role="user").count() == 1


def test_a_replay_while_the_run_is_in_flight_follows_it_to_the_end(owner, chat, scripted):
    scripted.add(stream("one ", "two ", "three", delay=0.2))
    first = post(owner, run_input(chat, user_says("Count")))
    pieces = iter(first.streaming_content)
    seen = b""
    while b"TEXT_MESSAGE_CONTENT" not in seen:  # the answer is streaming: the client reloads
        seen += next(pieces)
    first._iterator.close()

    events = read_events(post(owner, run_input(chat, run_id="reload")))

    text = "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert text.endswith("three")
    assert events[-1]["outcome"] == {"type": "success"}


def test_a_cancelled_call_is_replayed_with_a_result_saying_so(owner, chat, scripted):
    chat.with_tools(transfer)
    scripted.add(tool_call("transfer", {"amount": 5, "to": "bob"}, id="t1"))
    read_events(post(owner, run_input(chat, user_says("Pay Bob"))))
    chat.cancel()

    snapshot = next(
        e for e in read_events(post(owner, run_input(chat))) if e["type"] == "MESSAGES_SNAPSHOT"
    )

    cancelled = snapshot["messages"][-1]
    assert cancelled["role"] == "tool" and cancelled["toolCallId"] == "t1"
    assert cancelled["content"] == CANCELLED_TOOL_RESULT


def test_a_run_whose_saved_answer_differs_ends_with_a_snapshot_from_the_database(chat, scripted):
    scripted.add("Final answer.")
    chat.ask("Hi")
    translator = AgUiTranslator(str(chat.pk), "r")
    translator.event({"type": "chunk", "data": {"text": "A draft that was retried"}})
    follower = AgUiFollower(chat, None, translator, floor=0, head=[])
    follower.state = {"state": "idle", "error": "", "stop_reason": "", "pending": []}

    frames = [json.loads(frame.removeprefix(b"data: ")) for frame in follower.finish()]

    assert [e["type"] for e in frames] == [
        "TEXT_MESSAGE_END", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END",
        "MESSAGES_SNAPSHOT", "RUN_FINISHED",
    ]  # fmt: skip
    assert [m["content"] for m in frames[-2]["messages"]] == ["Hi", "Final answer."]


# -- access and bad input ------------------------------------------------------------------------
def test_another_users_chat_is_404_and_nothing_is_written(chat, django_user_model):
    eve = django_user_model.objects.create_user("eve", password="pw")
    client = Client()
    client.force_login(eve)

    response = post(client, run_input(chat, user_says("Hi")))

    assert response.status_code == 404
    assert not Message.objects.filter(chat=chat).exists()


def test_csrf_is_checked(user, chat):
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)

    response = post(client, run_input(chat, user_says("Hi")))

    assert response.status_code == 403
    assert not Message.objects.filter(chat=chat).exists()


def test_login_is_required_and_get_is_refused(client, owner, chat):
    anonymous = post(client, run_input(chat, user_says("Hi")))
    get = owner.get(reverse("agentloop:ag-ui"))

    assert anonymous.status_code == 302
    assert get.status_code == 405
    assert not Message.objects.filter(chat=chat).exists()


BASE = {"threadId": "1", "runId": "r", "messages": []}


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ([], "must be a JSON object"),
        ({**BASE, "threadId": "x"}, "threadId must be the chat's id"),
        ({"threadId": "1", "messages": []}, "runId must be a string"),
        ({**BASE, "messages": {}}, "messages must be a list"),
        ({**BASE, "tools": {}}, "tools must be a list"),
        ({**BASE, "resume": [{"interruptId": "x", "status": "resolved"}]}, "interruptId"),
        ({**BASE, "resume": [{"interruptId": "1", "status": "maybe"}]}, "status must be"),
        ({**BASE, "messages": [{"id": "a", "role": "user", "content": " "}]}, "has no text"),
    ],
)
def test_bad_input_is_400_with_one_line(owner, body, problem):
    response = post(owner, json.dumps(body))

    assert response.status_code == 400
    text = response.content.decode()
    assert problem in text and "\n" not in text


def test_a_body_nested_too_deep_is_400_before_it_is_read(owner, chat):
    deep = "[" * 200 + "]" * 200
    payload = run_input(chat, user_says("Hi")).replace('"tools": []', f'"tools": {deep}')

    response = post(owner, payload)

    assert response.status_code == 400
    assert "nested too deeply" in response.content.decode()
    assert not Message.objects.filter(chat=chat).exists()


# -- the translation, without a database ---------------------------------------------------------
def test_parse_reads_resume_entries_and_trailing_tool_messages():
    resumed = parse_run_input(
        {
            "threadId": "7",
            "runId": "r",
            "messages": [{"id": "a", "role": "assistant", "content": ""}],
            "resume": [{"interruptId": "12", "status": "cancelled"}],
        }
    )
    tools = parse_run_input(
        {
            "threadId": "7",
            "runId": "r",
            "messages": [
                {"id": "u", "role": "user", "content": "Hi"},
                {"id": "a", "role": "assistant", "toolCalls": []},
                {
                    "id": "t",
                    "role": "tool",
                    "toolCallId": "q1",
                    "content": [{"type": "text", "text": "Lisbon"}],
                },
            ],
        }
    )

    assert (resumed.chat_pk, resumed.problem, resumed.answers) == (7, "", [Answer(12, True, None)])
    assert tools.tool_answers == [Answer("q1", False, "Lisbon")]
    assert tools.text == ""


def test_streamed_chunks_then_the_saved_answer_close_the_message():
    translator = AgUiTranslator("7", "r")

    out = translator.event({"type": "chunk", "data": {"text": "Hel"}})
    out += translator.event({"type": "chunk", "data": {"text": "lo"}})
    out += translator.event(
        {
            "type": "message",
            "data": {"id": 40, "role": "assistant", "content": "Hello", "tool_calls": []},
        }
    )
    out += translator.end("idle")

    streamed = out[0]["messageId"]
    assert out == [
        {"type": "TEXT_MESSAGE_START", "messageId": streamed, "role": "assistant"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": streamed, "delta": "Hel"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": streamed, "delta": "lo"},
        {"type": "TEXT_MESSAGE_END", "messageId": streamed},
        {"type": "RUN_FINISHED", "threadId": "7", "runId": "r", "outcome": {"type": "success"}},
    ]
    assert not translator.diverged


def test_a_saved_answer_longer_than_what_streamed_sends_the_rest_in_the_same_message():
    translator = AgUiTranslator("7", "r")

    out = translator.event({"type": "partial", "data": {"id": 41, "content": "Hello"}})
    out += translator.event(
        {"type": "message", "data": {"id": 41, "role": "assistant", "content": "Hello, Ada."}}
    )

    assert out == [
        {"type": "TEXT_MESSAGE_START", "messageId": "m41", "role": "assistant"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m41", "delta": "Hello"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m41", "delta": ", Ada."},
        {"type": "TEXT_MESSAGE_END", "messageId": "m41"},
    ]
    assert not translator.diverged


def test_a_saved_answer_unlike_what_streamed_is_a_new_message_and_asks_for_a_snapshot():
    translator = AgUiTranslator("7", "r")

    out = translator.event({"type": "partial", "data": {"id": 41, "content": "Draft"}})
    out += translator.event(
        {"type": "message", "data": {"id": 41, "role": "assistant", "content": "Final."}}
    )

    saved = out[3]["messageId"]
    assert saved != "m41"  # an id of its own: the client adds no text to "Draft"
    assert [(e["type"], e["messageId"]) for e in out] == [
        ("TEXT_MESSAGE_START", "m41"),
        ("TEXT_MESSAGE_CONTENT", "m41"),
        ("TEXT_MESSAGE_END", "m41"),
        ("TEXT_MESSAGE_START", saved),
        ("TEXT_MESSAGE_CONTENT", saved),
        ("TEXT_MESSAGE_END", saved),
    ]
    assert out[4]["delta"] == "Final."
    assert translator.diverged


def test_streamed_tool_call_pieces_and_a_retried_answer():
    translator = AgUiTranslator("7", "r")

    out = translator.event(
        {"type": "tool_call_delta", "data": {"index": 0, "id": "c1", "name": "add"}}
    )
    out += translator.event({"type": "tool_call_delta", "data": {"index": 0, "arguments": '{"a":'}})
    out += translator.event({"type": "partial", "data": {"id": 41, "content": "abc"}})
    retried = translator.event({"type": "partial", "data": {"id": 41, "content": "xyz"}})

    assert [e["type"] for e in out] == [
        "TOOL_CALL_START", "TOOL_CALL_ARGS", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT",
    ]  # fmt: skip
    assert out[1]["delta"] == '{"a":'
    # The retry closes what streamed (the text and the call), starts again, and asks for a
    # snapshot at the end (the client then holds what was saved).
    assert [e["type"] for e in retried] == [
        "TEXT_MESSAGE_END", "TOOL_CALL_END", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT",
    ]  # fmt: skip
    assert retried[-1]["delta"] == "xyz"
    assert translator.diverged


def test_pending_calls_become_custom_events_and_the_interrupt_outcome():
    translator = AgUiTranslator("7", "r")
    translator.know(
        {
            "id": 40,
            "tool_calls": [
                {"id": 5, "call_id": "c5", "name": "transfer", "arguments": {"amount": 1}}
            ],
        }
    )

    out = translator.pending([{"id": 5, "wait_reason": "approval", "question": ""}])
    out += translator.pending([{"id": 5, "wait_reason": "approval", "question": ""}])  # once
    out += translator.pending([{"id": 99, "wait_reason": "approval", "question": ""}])  # unknown
    out += translator.end("waiting")

    assert [e["type"] for e in out] == ["CUSTOM", "RUN_FINISHED"]
    assert out[0]["value"]["interruptId"] == "5"
    assert out[1]["outcome"]["interrupts"][0]["message"] == "Approve the call of transfer?"


def test_cancel_and_stop_outcomes():
    cancelled = AgUiTranslator("7", "r")
    cancelled.know(
        {"id": 40, "tool_calls": [{"id": 5, "call_id": "c5", "name": "t", "arguments": {}}]}
    )
    out = cancelled.cancel_calls([5]) + cancelled.end("idle")
    stopped = AgUiTranslator("7", "r").end("stopped", stop_reason="max_steps reached")

    assert out[0] == {
        "type": "TOOL_CALL_RESULT", "messageId": "c5", "toolCallId": "c5",
        "content": CANCELLED_TOOL_RESULT, "role": "tool",
    }  # fmt: skip
    assert out[-1]["outcome"] == {"type": "cancelled"}
    assert stopped[-1]["result"] == {"stopReason": "max_steps reached"}
    assert stopped[-1]["outcome"] == {"type": "success"}


def test_state_deltas_only_for_changes():
    translator = AgUiTranslator("7", "r")
    translator.start("queued")

    assert translator.state("queued") == []
    assert translator.state("running") == [
        {"type": "STATE_DELTA", "delta": [{"op": "replace", "path": "/state", "value": "running"}]}
    ]

"""The chat event stream (``agentloop:events``, ``agentloop.web._live``) without a browser
(docs/design.md §9).

Server-Sent Events: ``id:``/``event:``/``data:`` (JSON), resumable after ``Last-Event-ID``
or ``?after=``, keep-alive comments, owner or permitted staff only (others 404). The
sync stream (WSGI) is read through Django's test client, the async one (ASGI) through
``AsyncClient`` and through a real uvicorn server. The database backend always runs;
the Redis backend when Redis answers on 127.0.0.1:6379, and always under ``CI=true``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import Permission
from django.test import AsyncClient, Client
from django.urls import reverse

from agentloop import CancelledError
from agentloop import live_events as events
from agentloop.engine import CANCELLED_TOOL_RESULT
from agentloop.messages import TextDelta
from agentloop.models import Chat, ChatState, Message, ToolCall
from agentloop.runners import wait_for_embedded_jobs
from agentloop.testing import stream, tool_call
from agentloop.web import CUT_MARK, cut_to_fit, format_event, resume_point
from agentloop.web._live import KEEPALIVE
from tests.sse_reading import (
    DEADLINE,
    AsyncReader,
    Frame,
    Reader,
    events_url,
    is_state,
    messages_in,
    say,
    session_cookie,
    uvicorn_serving,
)
from tests.tools import add

pytestmark = pytest.mark.django_db

FAST = {"EVENTS_POLL_INTERVAL": 0.01, "EVENTS_KEEPALIVE": 30.0}


@pytest.fixture(autouse=True)
def _fast_polls(settings):
    settings.AGENTLOOP = {**settings.AGENTLOOP, **FAST}


@pytest.fixture
def chat(user):
    return Chat.objects.create(model="scripted:test", owner=user)


@pytest.fixture
def open_stream(owner, chat) -> Iterator[Any]:
    readers = []

    def open_(target=None, client=None, **headers) -> Reader:
        response = (client or owner).get(events_url(target or chat), **headers)
        assert response.status_code == 200, response
        reader = Reader(response)
        readers.append(reader)
        return reader

    yield open_
    for reader in readers:
        reader.close()


# -- access ------------------------------------------------------------------------------------
def test_an_anonymous_reader_is_sent_to_the_login_page(client, chat, settings):
    response = client.get(events_url(chat))

    assert response.status_code == 302
    assert response["Location"].startswith(settings.LOGIN_URL + "?next=")


def test_another_user_gets_404(django_user_model, chat):
    stranger = django_user_model.objects.create_user(username="eve")
    client = Client()
    client.force_login(stranger)

    assert client.get(events_url(chat)).status_code == 404


def test_staff_without_a_permission_gets_404(django_user_model, chat):
    staff = django_user_model.objects.create_user(username="sam", is_staff=True)
    client = Client()
    client.force_login(staff)

    assert client.get(events_url(chat)).status_code == 404


def test_staff_with_the_view_permission_reads_the_stream(django_user_model, chat, open_stream):
    staff = django_user_model.objects.create_user(username="sam", is_staff=True)
    staff.user_permissions.add(
        Permission.objects.get(codename="view_chat", content_type__app_label="agentloop")
    )
    client = Client()
    client.force_login(staff)
    say(chat, "user", "Hi")

    frames = open_stream(client=client).until(is_state)

    assert messages_in(frames) == [("user", "Hi")]


def test_a_missing_chat_is_404(owner):
    assert owner.get(reverse("agentloop:events", args=[999999])).status_code == 404


def test_the_stream_only_answers_get(owner, chat):
    assert owner.post(events_url(chat)).status_code == 405


# -- the wire format ---------------------------------------------------------------------------
def test_the_response_is_an_uncached_event_stream(open_stream):
    response = open_stream().response

    assert response["Content-Type"] == "text/event-stream"
    assert response["Cache-Control"] == "no-cache"
    assert response.streaming


def test_the_stream_opens_with_a_retry_delay(open_stream):
    assert open_stream().next_frame().retry == 2000


def test_each_saved_message_is_an_event_with_its_id_and_json_data(chat, open_stream):
    question = say(chat, "user", "What is 2 + 2?")
    answer = say(chat, "assistant", "4")

    frames = open_stream().until(is_state)

    sent = [f for f in frames if f.event == "message"]
    assert [f.id for f in sent] == [str(question.pk), str(answer.pk)]
    assert sent[1].data["role"] == "assistant"
    assert sent[1].data["content"] == "4"
    assert sent[1].data["status"] == "complete"
    assert sent[1].data["tool_calls"] == []


def test_an_assistant_message_carries_its_tool_calls(chat, open_stream):
    answer = say(chat, "assistant", "")
    call = ToolCall.objects.create(
        chat=chat, message=answer, call_id="c1", name="add", arguments={"a": 1, "b": 2}
    )

    frames = open_stream().until(is_state)

    [message] = [f for f in frames if f.event == "message"]
    assert message.data["tool_calls"] == [
        {"id": call.pk, "call_id": "c1", "name": "add", "arguments": {"a": 1, "b": 2}}
    ]


def test_the_first_state_event_follows_the_messages_and_has_no_id(chat, open_stream):
    say(chat, "user", "Hi")

    frames = open_stream().until(is_state)

    assert frames[-1].id is None
    chat.refresh_from_db()
    assert frames[-1].data == {
        "state": "idle",
        "cancel_requested": False,
        "error": "",
        "stop_reason": "",
        "waiting_for": "",
        "pending": [],
        "changed_at": chat.updated_at.isoformat(),
    }


def test_a_whole_run_between_two_polls_still_sends_a_state_event(chat, open_stream):
    """idle -> queued -> running -> idle faster than the poll: the page must still hear of
    it (it re-enables its Send button on a state event)."""
    from agentloop.django_store.leases import Lease

    stream = open_stream()
    first = stream.until(is_state)[-1].data
    lease = Lease.take(Chat, chat.pk)  # a run starts ...
    lease.release(state="idle")  # ... and ends before the reader polls again
    second = stream.until(is_state)[-1].data
    assert first["state"] == second["state"] == "idle"
    assert second["changed_at"] != first["changed_at"]


def test_format_event_writes_one_json_data_line():
    assert format_event("message", {"text": "a\nb"}, "7") == (
        b'id: 7\nevent: message\ndata: {"text":"a\\nb"}\n\n'
    )


# -- resuming ----------------------------------------------------------------------------------
def test_a_reader_resumes_after_the_last_event_id_header(chat, open_stream):
    first = say(chat, "user", "one")
    say(chat, "assistant", "two")
    say(chat, "user", "three")

    frames = open_stream(HTTP_LAST_EVENT_ID=str(first.pk)).until(is_state)

    assert messages_in(frames) == [("assistant", "two"), ("user", "three")]


def test_a_reader_resumes_after_the_after_parameter(owner, chat):
    say(chat, "user", "one")
    second = say(chat, "assistant", "two")
    say(chat, "user", "three")

    reader = Reader(owner.get(events_url(chat), {"after": second.pk}))
    try:
        frames = reader.until(is_state)
    finally:
        reader.close()

    assert messages_in(frames) == [("user", "three")]


def test_the_last_event_id_header_wins_over_the_after_parameter(owner, chat):
    first = say(chat, "user", "one")
    second = say(chat, "assistant", "two")

    reader = Reader(
        owner.get(events_url(chat), {"after": second.pk}, HTTP_LAST_EVENT_ID=str(first.pk))
    )
    try:
        frames = reader.until(is_state)
    finally:
        reader.close()

    assert messages_in(frames) == [("assistant", "two")]


def test_a_malformed_position_reads_from_the_start(chat, open_stream):
    say(chat, "user", "one")

    frames = open_stream(HTTP_LAST_EVENT_ID="1; DROP TABLE").until(is_state)

    assert messages_in(frames) == [("user", "one")]


def test_a_message_saved_while_reading_arrives_with_the_next_id(chat, open_stream):
    reader = open_stream()
    reader.until(is_state)

    late = say(chat, "assistant", "Later")
    frame = reader.until(lambda f: f.event == "message")[-1]

    assert (frame.id, frame.data["content"]) == (str(late.pk), "Later")


# -- keep-alive --------------------------------------------------------------------------------
def test_a_quiet_stream_sends_a_keep_alive_comment(chat, open_stream, settings):
    settings.AGENTLOOP = {**settings.AGENTLOOP, "EVENTS_KEEPALIVE": 0.05}
    reader = open_stream()
    reader.until(is_state)

    assert reader.next_frame().comment == "keep-alive"


def test_the_keep_alive_is_a_comment_line():
    assert KEEPALIVE == b": keep-alive\n\n"


# -- answers streaming, without Redis ----------------------------------------------------------
def test_an_answer_streaming_now_is_a_partial_event_that_grows(chat, open_stream):
    say(chat, "user", "Tell me")
    partial = say(chat, "assistant", "Once", status="partial")
    reader = open_stream()

    first = reader.until(lambda f: f.event == "partial")[-1]
    Message.objects.filter(pk=partial.pk).update(content="Once upon")
    second = reader.until(lambda f: f.event == "partial")[-1]

    assert first.id is None
    assert first.data == {"id": partial.pk, "content": "Once"}
    assert second.data == {"id": partial.pk, "content": "Once upon"}


def test_a_finished_streamed_answer_is_a_message_event_with_the_partials_id(chat, open_stream):
    partial = say(chat, "assistant", "Once", status="partial")
    reader = open_stream()
    reader.until(lambda f: f.event == "partial")

    Message.objects.filter(pk=partial.pk).update(content="Once upon a time.", status="complete")
    frame = reader.until(lambda f: f.event == "message")[-1]

    assert frame.id == str(partial.pk)
    assert frame.data["content"] == "Once upon a time."


def test_a_cancelled_answer_is_a_message_event_marked_cancelled(chat, open_stream):
    partial = say(chat, "assistant", "Once", status="partial")
    reader = open_stream()
    reader.until(lambda f: f.event == "partial")

    Message.objects.filter(pk=partial.pk).update(status="cancelled")
    frame = reader.until(lambda f: f.event == "message")[-1]

    assert (frame.id, frame.data["status"]) == (str(partial.pk), "cancelled")


def test_messages_after_a_streaming_answer_wait_for_it_so_none_is_skipped(chat, open_stream):
    partial = say(chat, "assistant", "Once", status="partial")
    say(chat, "user", "Hurry up")
    reader = open_stream()

    before = reader.until(is_state)
    Message.objects.filter(pk=partial.pk).update(content="Once more.", status="complete")
    after = reader.until(lambda f: f.event == "message" and f.data["role"] == "user")

    assert messages_in(before) == []
    assert messages_in(after) == [("assistant", "Once more."), ("user", "Hurry up")]


def test_an_abandoned_partial_is_passed_over(chat, open_stream):
    say(chat, "assistant", "Onc", status="partial")  # a crash mid-stream
    answer = say(chat, "assistant", "Once upon a time.")

    frames = open_stream().until(is_state)

    assert [f.id for f in frames if f.event in ("message", "partial")] == [str(answer.pk)]


# -- state -------------------------------------------------------------------------------------
def test_a_state_change_is_sent_once(chat, open_stream):
    reader = open_stream()
    reader.until(is_state)

    Chat.objects.filter(pk=chat.pk).update(state=ChatState.RUNNING)
    running = reader.until(is_state)[-1]
    Chat.objects.filter(pk=chat.pk).update(cancel_requested_at="2030-01-01T00:00:00Z")
    cancelling = reader.until(is_state)[-1]

    assert running.data["state"] == "running"
    assert cancelling.data["cancel_requested"] is True


def test_the_state_lists_the_calls_waiting_for_a_person(chat, open_stream):
    answer = say(chat, "assistant", "")
    approval = ToolCall.objects.create(
        chat=chat, message=answer, call_id="c1", name="delete_notes", arguments={},
        state="waiting", wait_reason="approval",
    )  # fmt: skip
    question = ToolCall.objects.create(
        chat=chat, message=answer, call_id="c2", name="ask_person",
        arguments={"question": "Which city?"}, state="waiting", wait_reason="question",
        question="Which city?",
    )  # fmt: skip
    Chat.objects.filter(pk=chat.pk).update(state=ChatState.WAITING)

    state = open_stream().until(is_state)[-1]

    assert state.data["state"] == "waiting"
    pending = [(p["id"], p["name"], p["wait_reason"], p["question"]) for p in state.data["pending"]]
    assert pending == [
        (approval.pk, "delete_notes", "approval", ""),
        (question.pk, "ask_person", "question", "Which city?"),
    ]


def test_a_page_sees_a_cancelled_waiting_chat_go_idle_with_its_calls_answered(chat, open_stream):
    answer = say(chat, "assistant", "")
    ToolCall.objects.create(
        chat=chat, message=answer, call_id="c1", name="delete_notes", arguments={},
        state="waiting", wait_reason="approval",
    )  # fmt: skip
    Chat.objects.filter(pk=chat.pk).update(state=ChatState.WAITING)
    reader = open_stream()
    assert reader.until(is_state)[-1].data["pending"] != []

    assert Chat.objects.get(pk=chat.pk).cancel() is True
    frames = reader.until(lambda f: is_state(f) and f.data["pending"] == [])

    assert (frames[-1].data["state"], frames[-1].data["cancel_requested"]) == ("idle", False)
    assert ("tool", CANCELLED_TOOL_RESULT) in messages_in(frames)


def test_a_failed_chat_sends_its_error(chat, open_stream):
    Chat.objects.filter(pk=chat.pk).update(state=ChatState.FAILED, error="AuthenticationError")

    state = open_stream().until(is_state)[-1]

    assert (state.data["state"], state.data["error"]) == ("failed", "AuthenticationError")


def test_the_stream_ends_when_the_chat_is_deleted(chat, open_stream):
    reader = open_stream()
    reader.until(is_state)

    Chat.objects.filter(pk=chat.pk).delete()

    with pytest.raises(StopIteration):
        reader.next_frame()


# -- the position a page starts from -----------------------------------------------------------
def test_resume_point_is_the_latest_message_without_redis(chat):
    say(chat, "user", "Hi")
    answer = say(chat, "assistant", "Hello")

    assert resume_point(chat) == str(answer.pk)


def test_resume_point_stops_before_an_answer_streaming_now(chat):
    question = say(chat, "user", "Hi")
    say(chat, "assistant", "Hel", status="partial")

    assert resume_point(chat) == str(question.pk)


def test_resume_point_of_an_empty_chat_is_zero(chat):
    assert resume_point(chat) == "0"


# -- a background run, end to end --------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_a_background_run_streams_its_answer_and_states(chat, open_stream, scripted, settings):
    settings.AGENTLOOP = {**settings.AGENTLOOP, "PARTIAL_SAVE_INTERVAL": 0.0}
    scripted.add(stream("Once ", "upon ", "a ", "time.", delay=0.02))
    reader = open_stream()
    reader.until(is_state)

    chat.ask_later("Tell me a story")
    chat.complete_later()
    frames = reader.until(is_state_idle_after_answer())
    wait_for_embedded_jobs(DEADLINE)

    assert messages_in(frames) == [("user", "Tell me a story"), ("assistant", "Once upon a time.")]
    partials = [f.data["content"] for f in frames if f.event == "partial"]
    assert partials and all("Once upon a time.".startswith(text) for text in partials)
    states = [f.data["state"] for f in frames if f.event == "state"]
    assert states[0] in ("queued", "running") and states[-1] == "idle"


def is_state_idle_after_answer():
    answered = []

    def condition(frame: Frame) -> bool:
        if frame.event == "message" and frame.data["role"] == "assistant":
            answered.append(frame)
        return bool(answered) and frame.event == "state" and frame.data["state"] == "idle"

    return condition


# -- the async stream (ASGI) -------------------------------------------------------------------


def read_async(user, chat, steps, headers=None) -> Any:
    """Open the stream with AsyncClient, run ``steps(reader)``, close it; returns its value."""
    client = AsyncClient()
    client.force_login(user)

    async def main():
        response = await client.get(events_url(chat), headers=headers)
        assert response.status_code == 200
        assert response.is_async  # an async iterator: no thread held while it waits
        reader = AsyncReader(response)
        try:
            return await steps(reader)
        finally:
            await reader.close()

    return async_to_sync(main)()


def test_the_async_stream_sends_messages_then_the_state(user, chat):
    say(chat, "user", "Hi")
    answer = say(chat, "assistant", "Hello")

    frames = read_async(user, chat, lambda reader: reader.until(is_state))

    assert frames[0].retry == 2000
    assert [(f.id, f.data["content"]) for f in frames if f.event == "message"][-1] == (
        str(answer.pk),
        "Hello",
    )


def test_the_async_stream_resumes_after_the_last_event_id(user, chat):
    first = say(chat, "user", "one")
    say(chat, "assistant", "two")

    frames = read_async(
        user, chat, lambda reader: reader.until(is_state), {"Last-Event-ID": str(first.pk)}
    )

    assert messages_in(frames) == [("assistant", "two")]


def test_the_async_stream_sends_new_messages_and_keep_alives(user, chat, settings):
    settings.AGENTLOOP = {**settings.AGENTLOOP, "EVENTS_KEEPALIVE": 0.05}

    async def steps(reader):
        await reader.until(is_state)
        keepalive = await reader.next_frame()
        from asgiref.sync import sync_to_async

        await sync_to_async(say)(chat, "assistant", "Later")
        message = (await reader.until(lambda f: f.event == "message"))[-1]
        return keepalive, message

    keepalive, message = read_async(user, chat, steps)

    assert keepalive.comment == "keep-alive"
    assert message.data["content"] == "Later"


def test_the_async_stream_refuses_another_user(django_user_model, chat):
    stranger = django_user_model.objects.create_user(username="eve")
    client = AsyncClient()
    client.force_login(stranger)

    async def main():
        return (await client.get(events_url(chat))).status_code

    assert async_to_sync(main)() == 404


# -- Redis -------------------------------------------------------------------------------------


def test_with_redis_saved_messages_are_events_with_stream_ids(redis_events, chat, open_stream):
    chat.ask_later("Hi")

    frames = open_stream().until(lambda f: f.event == "message")

    assert frames[-1].data["content"] == "Hi"
    assert frames[-1].id is not None and "-" in frames[-1].id  # a Redis stream id


def test_with_redis_chunks_are_events_and_a_reader_resumes_after_any_id(
    redis_events, chat, open_stream
):
    chat.ask_later("Tell me")
    for text in ("Once ", "upon ", "a time."):
        events.publish_chunk(chat, TextDelta(text=text))
    reader = open_stream()
    first = reader.until(lambda f: f.event == "chunk")[-1]
    reader.close()

    resumed = open_stream(HTTP_LAST_EVENT_ID=first.id)
    frames = resumed.until(lambda f: f.data == {"text": "a time."})

    assert first.data == {"text": "Once "}
    assert [f.data["text"] for f in frames if f.event == "chunk"] == ["upon ", "a time."]


def test_with_redis_a_run_sends_tool_calls_results_and_the_answer(
    redis_events, chat, open_stream, scripted
):
    scripted.add(tool_call("add", {"a": 2, "b": 3}, id="c1"), "2 + 3 = 5.")
    chat.with_tools(add)
    reader = open_stream()
    reader.until(is_state)

    chat.ask("What is 2 + 3?")
    frames = reader.until(lambda f: f.event == "message" and f.data["content"] == "2 + 3 = 5.")

    roles = [f.data["role"] for f in frames if f.event == "message"]
    assert roles == ["user", "assistant", "tool", "assistant"]
    [call] = [f for f in frames if f.event == "message" and f.data["role"] == "assistant"][0].data[
        "tool_calls"
    ]
    assert (call["name"], call["arguments"]) == ("add", {"a": 2, "b": 3})


def test_with_redis_a_cancelled_answer_is_sent_marked_cancelled(
    redis_events, chat, open_stream, scripted
):
    scripted.add(stream("Once ", "upon ", "a time.", delay=0.01))
    chat.ask_later("Tell me")

    def cancel_after_first_chunk(chunk):
        chat.cancel()

    with pytest.raises(CancelledError):
        chat.complete(stream=cancel_after_first_chunk)
    frames = open_stream().until(lambda f: f.event == "message" and f.data["role"] == "assistant")

    assert frames[-1].data["status"] == "cancelled"


def test_with_redis_resume_point_is_the_latest_message_event(redis_events, chat):
    chat.ask_later("Hi")
    events.publish_chunk(chat, TextDelta(text="Hel"))
    assert events.flush()  # published from a queue: wait until it is sent

    point = resume_point(chat)
    kept = redis_events.xrange(events.get_backend().stream(events.chat_key(chat)))

    assert point == kept[0][0].decode()  # the user message, not the chunk after it


def test_with_redis_the_async_stream_reads_chunks(redis_events, user, chat):
    events.publish_chunk(chat, TextDelta(text="Hello"))

    frames = read_async(user, chat, lambda reader: reader.until(lambda f: f.event == "chunk"))

    assert frames[-1].data == {"text": "Hello"}
    assert "-" in frames[-1].id


def test_with_redis_the_async_stream_waits_for_new_events(redis_events, user, chat):
    async def steps(reader):
        await reader.until(is_state)
        from asgiref.sync import sync_to_async

        await sync_to_async(events.publish_chunk)(chat, TextDelta(text="Late"))
        return (await reader.until(lambda f: f.event == "chunk"))[-1]

    assert read_async(user, chat, steps).data == {"text": "Late"}


# -- capped reads and events (docs/live-events.md "Large events") -------------------------------
def test_with_redis_one_read_takes_at_most_read_count_events(redis_events, chat):
    for number in range(events.READ_COUNT * 2 + 50):
        events.publish_chunk(chat, TextDelta(text=f"{number} "))
    assert events.flush()  # published by the process's publisher thread
    backend = events.get_backend()

    first = backend.read(events.chat_key(chat), None, 0.1)
    rest = backend.read(events.chat_key(chat), first[-1]["id"], 0.1)

    assert len(first) == len(rest) == events.READ_COUNT
    assert [e["data"]["text"] for e in first + rest] == [f"{n} " for n in range(200)]


def test_with_redis_a_reader_from_the_start_still_gets_every_event_in_order(
    redis_events, chat, open_stream
):
    total = events.READ_COUNT * 2 + 50
    for number in range(total):
        events.publish_chunk(chat, TextDelta(text=f"{number} "))

    frames = open_stream().until(lambda f: f.data == {"text": f"{total - 1} "})

    assert [f.data["text"] for f in frames if f.event == "chunk"] == [f"{n} " for n in range(total)]


LIMIT = 4096  # EVENTS_MAX_BYTES in the tests below (its smallest allowed value is 1024)


@pytest.mark.parametrize("backend", ["database", "redis"])
def test_an_event_larger_than_the_cap_is_sent_cut_with_a_marker(
    backend, request, chat, owner, settings
):
    if backend == "redis":
        request.getfixturevalue("redis_events")
    settings.AGENTLOOP = {**settings.AGENTLOOP, "EVENTS_MAX_BYTES": LIMIT}
    big = "word " * 200_000  # 1 MB
    chat.ask_later("Read me the file")
    answer = chat.messages.create(role="assistant", content=big, status="complete")
    if backend == "redis":
        events.publish_message(chat, answer)
    reader = Reader(owner.get(events_url(chat)))
    try:
        frame = reader.until(lambda f: f.event == "message" and f.data["role"] == "assistant")[-1]
        size = len(reader.last_block.split("data: ", 1)[1].encode())
    finally:
        reader.close()

    assert size <= LIMIT
    assert frame.data["truncated"] is True
    assert frame.data["content"].startswith("word word") and frame.data["content"].endswith(
        CUT_MARK
    )
    assert len(frame.data["content"]) > LIMIT // 2  # cut to fit, not emptied
    assert (frame.data["id"], frame.data["role"], frame.data["status"]) == (
        answer.pk, "assistant", "complete",
    )  # fmt: skip
    assert frame.id is not None  # still resumable: a reader moves past it
    assert chat.messages.get(pk=answer.pk).content == big  # the row keeps it all


def test_an_event_within_the_cap_is_sent_whole(chat, open_stream, settings):
    settings.AGENTLOOP = {**settings.AGENTLOOP, "EVENTS_MAX_BYTES": LIMIT}
    text = "x" * (LIMIT - 200)
    say(chat, "user", text)

    frame = open_stream().until(lambda f: f.event == "message")[-1]

    assert frame.data["content"] == text and "truncated" not in frame.data


def test_cut_to_fit_cuts_the_longest_texts_and_keeps_the_short_ones():
    data = {"id": 7, "role": "assistant", "content": "a" * 50_000, "thinking": "b" * 30_000,
            "tool_calls": [{"name": "search", "arguments": {"query": "c" * 20_000}}]}  # fmt: skip

    cut = cut_to_fit(data, 2048)

    assert len(json.dumps(cut, separators=(",", ":"))) <= 2048
    assert (cut["id"], cut["role"], cut["tool_calls"][0]["name"]) == (7, "assistant", "search")
    for text in (cut["content"], cut["thinking"], cut["tool_calls"][0]["arguments"]["query"]):
        assert text.endswith(CUT_MARK) and len(text) > 100


def test_an_event_that_cannot_fit_even_cut_sends_only_what_finds_the_row():
    data = {"id": 7, "role": "tool", "status": "complete", "content": "x" * 10_000,
            "numbers": list(range(5_000))}  # fmt: skip

    assert cut_to_fit(data, 1024) == {
        "id": 7, "role": "tool", "status": "complete", "truncated": True,
    }  # fmt: skip


def test_a_non_ascii_text_is_cut_by_its_bytes_on_the_wire():
    data = {"text": "日本語" * 20_000}  # six bytes each once escaped in JSON

    frame = format_event("chunk", data, "1-0", max_bytes=2048)

    body = frame.split(b"data: ", 1)[1].strip()
    assert len(body) <= 2048
    assert json.loads(body)["text"].startswith("日本語") and json.loads(body)["truncated"]


# -- a real ASGI server ------------------------------------------------------------------------


@pytest.fixture
def uvicorn_server(tmp_path) -> Iterator[str]:
    with uvicorn_serving(tmp_path, FAST) as url:
        yield url


@pytest.mark.subprocess
@pytest.mark.django_db(transaction=True)
def test_under_uvicorn_several_streams_get_a_message_saved_by_another_process(
    uvicorn_server, user, chat
):
    import httpx
    from httpx_sse import connect_sse

    cookies = session_cookie(user)
    url = uvicorn_server + events_url(chat)
    with httpx.Client(cookies=cookies, timeout=DEADLINE) as http:
        with connect_sse(http, "GET", url) as first, connect_sse(http, "GET", url) as second:
            assert first.response.status_code == 200, first.response.read()
            assert first.response.headers["content-type"] == "text/event-stream"
            readers = [first.iter_sse(), second.iter_sse()]
            for reader in readers:
                assert next(e for e in reader if e.event == "state").json()["state"] == "idle"
            message = say(chat, "assistant", "Hello from the test process")
            got = [next(e for e in reader if e.event == "message") for reader in readers]

    assert [(e.id, e.json()["content"]) for e in got] == [
        (str(message.pk), "Hello from the test process")
    ] * 2

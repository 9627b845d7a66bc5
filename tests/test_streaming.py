"""Iterated runs (docs/streaming.md): ``chat.stream()`` and ``chat.astream()``, in memory and
persisted. What they hand out and in which order, ``stream()`` with no message continuing
like ``complete()``, an error raised after the events before it, and leaving early: a cancel
recorded as ``cancel()`` records one, the chat usable at once.

The persisted async tests await from the test's thread with asgiref's ``async_to_sync``, so
the run's database phases use the test's connection (see tests/test_async.py).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from asgiref.sync import async_to_sync

import agentloop
from agentloop import CancelledError, ConfigurationError
from agentloop.exceptions import AuthenticationError
from agentloop.messages import MessageStatus, ThinkingDelta, ToolCallState
from agentloop.streaming import (
    AsyncEventStream,
    EventStream,
    FinalMessageEvent,
    TextDeltaEvent,
    ThinkingDeltaEvent,
    ToolCallDeltaEvent,
    ToolCallEvent,
    ToolResultEvent,
)
from agentloop.testing import ScriptedProvider, stream, tool_call
from tests import tools as test_tools
from tests.tools import add, record, transfer

pytestmark = pytest.mark.django_db

#: a long streamed answer: a break always lands while it streams.
WORDS = [f"word{i} " for i in range(200)]


@pytest.fixture(params=["memory", "persisted"])
def chat(request: pytest.FixtureRequest, scripted: ScriptedProvider) -> Any:
    """The in-memory chat and the persisted one, each with the add, record and transfer
    tools on the scripted model."""
    if request.param == "memory":
        return agentloop.chat("scripted:test", tools=[add, record, transfer])
    from agentloop.models import Chat  # the models load once Django is set up

    request.getfixturevalue("db")
    owner = request.getfixturevalue("user")
    persisted = Chat.objects.create(model="scripted:test", owner=owner)
    return persisted.with_tools(add, record, transfer)


def kinds(events: list[Any]) -> list[str]:
    return [type(event).__name__ for event in events]


def last(chat: Any) -> Any:
    """The chat's last message, whichever chat it is."""
    messages = chat.messages
    return messages[-1] if isinstance(messages, list) else messages.last()


def statuses(chat: Any) -> list[tuple[str, str, str]]:
    messages = chat.messages if isinstance(chat.messages, list) else chat.messages.all()
    return [(m.role, str(m.status), m.content) for m in messages]


def call_state(chat: Any, call_id: str) -> str:
    if isinstance(chat.messages, list):
        return next(
            str(call.state) for m in chat.messages for call in m.tool_calls if call.id == call_id
        )
    return str(chat.tool_calls.get(call_id=call_id).state)


# -- what a run hands out -----------------------------------------------------------------
def test_a_tool_round_streams_its_text_its_calls_their_results_then_the_answer(chat, scripted):
    scripted.add(
        stream("Let me ", "add.", tool_calls=[tool_call("add", {"a": 1, "b": 2}, id="c1")]),
        stream("It is ", "3."),
    )

    events = list(chat.stream("What is 1 + 2?"))

    assert kinds(events) == [
        "TextDeltaEvent",
        "TextDeltaEvent",
        "ToolCallDeltaEvent",
        "ToolCallDeltaEvent",
        "ToolCallEvent",
        "ToolResultEvent",
        "TextDeltaEvent",
        "TextDeltaEvent",
        "FinalMessageEvent",
    ]
    assert [e.text for e in events if isinstance(e, TextDeltaEvent)] == [
        "Let me ",
        "add.",
        "It is ",
        "3.",
    ]
    asked = events[4]
    assert (asked.call.id, asked.call.name, asked.call.arguments) == ("c1", "add", {"a": 1, "b": 2})
    assert asked.call.state == ToolCallState.PENDING  # as asked: the event is a snapshot
    assert events[5].message.content == "3"
    final = events[-1]
    assert final.message.content == "It is 3."
    assert final.message.pk if hasattr(final.message, "pk") else final.message.key
    assert statuses(chat)[-1] == ("assistant", "complete", "It is 3.")


def test_the_final_message_is_what_ask_returns_and_the_stream_keeps_it(chat, scripted):
    scripted.add(stream("Hel", "lo"), "Hello")
    events = chat.stream("Hi")
    assert events.result is None  # nothing has run yet: the run starts at the first next()
    assert statuses(chat) == []

    for _ in events:
        pass
    asked = chat.ask("Hi again")

    assert events.result.content == asked.content == "Hello"
    assert type(events.result) is type(asked)


def test_thinking_streams_apart_from_the_text(chat, scripted):
    scripted.add(stream(ThinkingDelta(text="Hmm, "), ThinkingDelta(text="easy."), "Four."))

    events = list(chat.stream("2 + 2?"))

    assert [e.text for e in events if isinstance(e, ThinkingDeltaEvent)] == ["Hmm, ", "easy."]
    assert [e.text for e in events if isinstance(e, TextDeltaEvent)] == ["Four."]


def test_stream_with_no_message_continues_like_complete(chat, scripted):
    scripted.add(tool_call("transfer", {"amount": 5, "to": "bob"}, id="t1"), stream("Sent."))
    first = list(chat.stream("Send bob 5"))
    assert kinds(first) == ["ToolCallEvent", "FinalMessageEvent"]  # waits for a person
    assert chat.is_waiting()

    chat.approve("t1")
    rest = list(chat.stream())

    assert kinds(rest) == ["ToolResultEvent", "TextDeltaEvent", "FinalMessageEvent"]
    assert rest[0].message.content == "sent 5 to bob"
    assert rest[-1].message.content == "Sent."
    assert chat.is_complete()


def test_attachments_need_a_message():
    chat = agentloop.chat("scripted:test")
    with pytest.raises(ConfigurationError, match="attachments with a message only"):
        chat.stream(attachments="data:text/plain;base64,aGk=")


def test_the_callback_and_the_chats_callbacks_still_run_alongside(chat, scripted):
    scripted.add(stream("a", "b"))
    added: list[str] = []
    chat.after_message(lambda message: added.append(message.role))

    events = list(chat.stream("Hi"))

    assert added == ["user", "assistant"]
    assert kinds(events)[-1] == "FinalMessageEvent"
    scripted.add(stream("c", "d"))
    pieces: list[str] = []
    chat.ask("Again", stream=lambda chunk: pieces.append(chunk.text))
    assert pieces == ["c", "d"]


# -- in the calling thread ----------------------------------------------------------------
def test_the_run_goes_on_in_the_calling_thread_between_events(chat, scripted):
    scripted.add(
        stream("Noting.", tool_calls=[tool_call("record", {"label": "x"}, id="r1")]),
        stream("Done."),
    )
    test_tools.RECORDED_THREADS.clear()
    seen_while_iterating = []

    for event in chat.stream("Record x"):
        # The loop's body may use the chat (and its database connection) between events.
        seen_while_iterating.append(len(statuses(chat)))
        if isinstance(event, ToolCallEvent):
            assert test_tools.RECORDED_THREADS == []  # asked, not run yet: the run waits

    assert test_tools.RECORDED_THREADS == [threading.current_thread().name]
    assert seen_while_iterating[-1] == 4  # user, answer, result, answer


def test_a_slow_consumer_holds_the_model_back_a_chunk_at_a_time(scripted):
    read: list[int] = []

    class Counting(ScriptedProvider):
        def request(self, request: Any, *, on_chunk: Any = None) -> Any:
            def each(chunk: Any) -> None:
                read.append(len(read))
                on_chunk(chunk)

            return super().request(request, on_chunk=each)

    agentloop.providers.register("counting", Counting(stream(*WORDS[:10])))
    chat = agentloop.chat("counting:test")
    try:
        events = chat.stream("Count")
        next(events)
        time.sleep(0.05)
        # The provider handed over the first chunk and waits: it never reads ahead.
        assert read == [0]
        assert len(list(events)) == 10  # nine more pieces, and the final message
    finally:
        agentloop.providers.unregister("counting")


# -- errors ---------------------------------------------------------------------------------
def test_an_error_of_the_run_is_raised_after_the_events_before_it(chat, scripted):
    scripted.add(
        tool_call("add", {"a": 2, "b": 2}, id="c1"),
        AuthenticationError("bad key"),
    )
    seen: list[Any] = []

    with pytest.raises(AuthenticationError, match="bad key"):
        for event in chat.stream("2 + 2?"):
            seen.append(event)

    assert kinds(seen) == ["ToolCallEvent", "ToolResultEvent"]
    assert seen[1].message.content == "4"
    scripted.add("Four.")
    assert chat.ask("Try again").content == "Four."  # the chat is usable


def test_a_tool_that_raises_is_a_result_not_an_error_of_the_stream(scripted):
    chat = agentloop.chat("scripted:test", tools=[test_tools.explode])
    scripted.add(tool_call("explode", id="e1"), "It failed.")

    events = list(chat.stream("Explode"))

    result = next(e for e in events if isinstance(e, ToolResultEvent))
    assert result.message.is_error
    assert "kaboom" in result.message.content
    assert events[-1].message.content == "It failed."


# -- leaving early ------------------------------------------------------------------------------
def test_breaking_out_mid_answer_cancels_the_run_keeping_the_text_so_far(chat, scripted):
    scripted.add(stream(*WORDS))
    cancelled: list[bool] = []
    conversation = getattr(chat, "conversation", chat)  # a Chat's callbacks are its engine's
    conversation.on("cancelled", lambda: cancelled.append(True))

    for event in chat.stream("Talk"):
        assert isinstance(event, TextDeltaEvent)
        if event.text == "word2 ":
            break

    role, status, content = statuses(chat)[-1]
    assert (role, status) == ("assistant", "cancelled")
    assert content.startswith("word0 word1 word2 ")
    assert len(content) < len("".join(WORDS))
    assert cancelled == [True]
    scripted.add("Sure.")
    assert chat.ask("Something else").content == "Sure."  # usable at once, no flag left


def test_breaking_out_before_a_call_runs_leaves_it_cancelled_never_run(chat, scripted):
    scripted.add(tool_call("record", {"label": "never"}, id="r1"))
    test_tools.RECORDED_THREADS.clear()

    with chat.stream("Record") as events:
        for event in events:
            if isinstance(event, ToolCallEvent):
                break

    assert test_tools.RECORDED_THREADS == []
    assert call_state(chat, "r1") == "cancelled"
    scripted.add("Moving on.")
    assert chat.ask("Never mind").content == "Moving on."
    assert call_state(chat, "r1") == "cancelled"


def test_closing_an_unstarted_or_finished_stream_does_nothing(chat, scripted):
    unstarted = chat.stream("Never sent")
    unstarted.close()
    assert statuses(chat) == []

    scripted.add("Done.")
    finished = chat.stream("Hi")
    assert kinds(list(finished)) == ["TextDeltaEvent", "FinalMessageEvent"]
    finished.close()
    assert statuses(chat)[-1] == ("assistant", "complete", "Done.")


def test_a_cancel_from_the_loop_body_ends_the_stream_with_cancelled_error(chat, scripted):
    scripted.add(stream(*WORDS))

    with pytest.raises(CancelledError):
        for event in chat.stream("Talk"):
            if event.text == "word1 ":
                chat.cancel()  # as a Stop button would: the run's error, raised here

    assert statuses(chat)[-1][:2] == ("assistant", "cancelled")


# -- async ----------------------------------------------------------------------------------
def collect(events: AsyncEventStream[Any], stop_at: str | None = None) -> list[Any]:
    """The events of an async stream, awaited from the test's thread (``stop_at``: leave
    the ``async with`` block at that text)."""

    async def main() -> list[Any]:
        seen = []
        async with events:
            async for event in events:
                seen.append(event)
                if stop_at is not None and getattr(event, "text", None) == stop_at:
                    break
        return seen

    return async_to_sync(main)()


def test_astream_hands_out_the_same_events_as_stream(chat, scripted):
    scripted.add(
        stream("Let me ", "add.", tool_calls=[tool_call("add", {"a": 1, "b": 2}, id="c1")]),
        stream("It is ", "3."),
    )

    events = chat.astream("What is 1 + 2?")
    seen = collect(events)

    assert kinds(seen) == [
        "TextDeltaEvent",
        "TextDeltaEvent",
        "ToolCallDeltaEvent",
        "ToolCallDeltaEvent",
        "ToolCallEvent",
        "ToolResultEvent",
        "TextDeltaEvent",
        "TextDeltaEvent",
        "FinalMessageEvent",
    ]
    assert isinstance(seen[2], ToolCallDeltaEvent)
    assert events.result is not None
    assert events.result.content == "It is 3."
    assert statuses(chat)[-1] == ("assistant", "complete", "It is 3.")


def test_astream_with_no_message_continues_like_acomplete(chat, scripted):
    scripted.add(stream("Hi ", "there."))
    chat.ask_later("Hello")

    seen = collect(chat.astream())

    assert kinds(seen) == ["TextDeltaEvent", "TextDeltaEvent", "FinalMessageEvent"]
    assert seen[-1].message.content == "Hi there."


def test_astream_raises_the_runs_error_after_the_events_before_it(chat, scripted):
    scripted.add(tool_call("add", {"a": 2, "b": 2}, id="c1"), AuthenticationError("bad key"))
    seen: list[Any] = []

    async def main() -> None:
        async for event in chat.astream("2 + 2?"):
            seen.append(event)

    with pytest.raises(AuthenticationError, match="bad key"):
        async_to_sync(main)()
    assert kinds(seen) == ["ToolCallEvent", "ToolResultEvent"]


def test_leaving_an_astream_early_cancels_the_run(chat, scripted):
    scripted.add(stream(*WORDS, delay=0.001))

    seen = collect(chat.astream("Talk"), stop_at="word2 ")

    assert kinds(seen) == ["TextDeltaEvent"] * 3
    role, status, content = statuses(chat)[-1]
    assert (role, status) == ("assistant", "cancelled")
    assert content.startswith("word0 word1 word2 ")
    scripted.add("Sure.")
    assert chat.ask("Something else").content == "Sure."


def test_a_break_out_of_async_for_closes_the_stream_soon_after(scripted):
    chat = agentloop.chat("scripted:test")
    scripted.add(stream(*WORDS, delay=0.001))

    async def main() -> None:
        async for event in chat.astream("Talk"):
            assert isinstance(event, TextDeltaEvent)
            break
        for _ in range(100):  # the event loop closes the dropped stream in a task
            if chat.messages[-1].status == MessageStatus.CANCELLED:
                return
            await asyncio.sleep(0.01)

    asyncio.run(main())
    assert chat.messages[-1].status == MessageStatus.CANCELLED


def test_astream_never_blocks_the_event_loop(scripted):
    chat = agentloop.chat("scripted:test")
    scripted.add(stream(*WORDS[:20], delay=0.01))  # a blocking provider: 0.2 s of chunks
    ticks: list[float] = []

    async def tick() -> None:
        while True:
            ticks.append(time.monotonic())
            await asyncio.sleep(0.005)

    async def main() -> int:
        ticker = asyncio.ensure_future(tick())
        count = 0
        async for _ in chat.astream("Talk"):
            count += 1
        ticker.cancel()
        return count

    assert asyncio.run(main()) == 21
    gaps = [later - earlier for earlier, later in zip(ticks, ticks[1:], strict=False)]
    assert len(ticks) > 15
    assert max(gaps) < 0.1  # the loop kept turning while the model streamed


def test_the_streams_are_what_the_verbs_return(chat):
    assert isinstance(chat.stream("x"), EventStream)
    assert isinstance(chat.astream("x"), AsyncEventStream)


def test_final_message_event_is_the_last_event_and_a_frozen_dataclass(scripted):
    chat = agentloop.chat("scripted:test")
    scripted.add("Hi.")  # a reply that doesn't stream: one piece
    events = list(chat.stream("Hello"))
    final = events[-1]
    assert isinstance(final, FinalMessageEvent)
    with pytest.raises(AttributeError):
        final.message = None  # type: ignore[misc]


# -- the run's other machinery, iterated ----------------------------------------------------
def test_concurrent_tools_run_on_their_pool_and_their_results_stream(chat, scripted):
    chat.with_tool_options(concurrency="threads")
    scripted.add(
        [
            tool_call("record", {"label": "a", "seconds": 0.05}, id="r1"),
            tool_call("record", {"label": "b", "seconds": 0.05}, id="r2"),
        ],
        stream("Both ", "done."),
    )

    events = list(chat.stream("Record a and b"))

    assert kinds(events).count("ToolCallEvent") == 2
    results = sorted(e.message.content for e in events if isinstance(e, ToolResultEvent))
    assert results == ["a", "b"]
    assert all(name.startswith("agentloop-tool") for name in test_tools.RECORDED_THREADS)
    assert events[-1].message.content == "Both done."


def test_an_error_in_the_loops_body_cancels_the_run_and_propagates(chat, scripted):
    scripted.add(stream(*WORDS))

    with pytest.raises(KeyError, match="mine"):
        for event in chat.stream("Talk"):
            if event.text == "word1 ":
                raise KeyError("mine")

    assert statuses(chat)[-1][:2] == ("assistant", "cancelled")
    scripted.add("Still here.")
    assert chat.ask("Hello?").content == "Still here."


def test_the_run_holds_the_chat_while_the_loops_body_runs(scripted):
    chat = agentloop.chat("scripted:test")
    scripted.add(stream("a", "b"))
    refused: list[BaseException] = []

    def ask_from_elsewhere() -> None:
        try:
            chat.ask("Me too")
        except agentloop.ChatBusyError as exc:
            refused.append(exc)

    for event in chat.stream("Hi"):
        if isinstance(event, TextDeltaEvent) and event.text == "a":
            other = threading.Thread(target=ask_from_elsewhere)
            other.start()
            other.join()

    assert len(refused) == 1  # another thread's verb: refused, as during any run
    assert [m.content for m in chat.messages] == ["Hi", "ab"]


def test_a_held_stream_goes_out_once_a_parallel_input_guardrail_passes(scripted):
    from tests import guardrail_checks

    chat = agentloop.chat("scripted:test").with_guardrails(guardrail_checks.slow_moderation)
    scripted.add(stream("Fine ", "answer."))
    guardrail_checks.RELEASE = None  # decides at once: the chunks are held until then
    try:
        events = list(chat.stream("A harmless question"))
    finally:
        guardrail_checks.forget()

    assert [e.text for e in events if isinstance(e, TextDeltaEvent)] == ["Fine ", "answer."]
    assert events[-1].message.content == "Fine answer."


def test_a_blocked_message_streams_nothing_and_raises(scripted):
    from tests import guardrail_checks

    chat = agentloop.chat("scripted:test").with_guardrails(guardrail_checks.slow_moderation)
    scripted.add(stream("Never ", "shown."))
    seen: list[Any] = []
    try:
        with pytest.raises(agentloop.GuardrailBlockedError):
            for event in chat.stream("Something forbidden"):
                seen.append(event)
    finally:
        guardrail_checks.forget()

    assert [e for e in seen if isinstance(e, TextDeltaEvent)] == []


def test_a_streaming_response_closed_early_cancels_the_run(chat, scripted):
    from django.core.signals import request_finished
    from django.db import close_old_connections
    from django.http import StreamingHttpResponse

    scripted.add(stream(*WORDS))
    events = chat.stream("Talk")

    def body() -> Any:
        with events:
            for event in events:
                if isinstance(event, TextDeltaEvent):
                    yield event.text.encode()

    response = StreamingHttpResponse(body(), content_type="text/plain")
    pieces = iter(response.streaming_content)
    assert next(pieces) == b"word0 "
    # What the server does when the browser goes away (without request_finished closing
    # the test's connection, as Django's test client keeps it).
    request_finished.disconnect(close_old_connections)
    try:
        response.close()
    finally:
        request_finished.connect(close_old_connections)

    assert statuses(chat)[-1][:2] == ("assistant", "cancelled")
    assert events.result is None

"""The in-memory chat (``agentloop.chat()``): every verb, tool handling, config, callbacks,
retries and cancellation, against the scripted provider."""

from __future__ import annotations

import threading

import pytest
from django.test import override_settings
from pydantic import BaseModel

import agentloop
from agentloop import CancelledError, ConfigurationError, PendingToolCallsError
from agentloop.engine import CANCELLED_TOOL_RESULT
from agentloop.exceptions import AuthenticationError, RateLimitError, ServerError
from agentloop.messages import Message, MessageStatus, TextDelta, ToolCallState
from agentloop.testing import stream, tool_call
from tests import tools as test_tools
from tests.helpers import roles
from tests.tools import CancelChat, Weather, add, explode, record, refuse


@pytest.fixture
def chat(scripted):
    """An in-memory chat on the scripted provider, with the add and weather tools."""
    return agentloop.chat("scripted:test", tools=[add, Weather])


def tool_results(chat) -> list[Message]:
    return [message for message in chat.messages if message.role == "tool"]


def call_states(chat) -> dict[str, ToolCallState]:
    return {call.id: call.state for message in chat.messages for call in message.tool_calls}


@agentloop.tool
def count(label: str) -> str:
    """Counts its runs."""
    COUNTED.append(label)
    return f"counted {label}"


COUNTED: list[str] = []


@pytest.fixture(autouse=True)
def _reset_recorders():
    COUNTED.clear()
    test_tools.RECORDED_THREADS.clear()
    yield
    COUNTED.clear()
    test_tools.RECORDED_THREADS.clear()


# -- ask_later ------------------------------------------------------------------------------
def test_ask_later_appends_a_user_message_without_calling_the_model(chat, scripted):
    returned = chat.ask_later("Hello?")
    assert returned is chat
    assert [(m.role, m.content) for m in chat.messages] == [("user", "Hello?")]
    assert scripted.requests == []


def test_ask_later_is_chainable(chat, scripted):
    chat.ask_later("one").ask_later("two")
    assert [m.content for m in chat.messages] == ["one", "two"]
    assert scripted.requests == []


def test_ask_later_refuses_while_tool_calls_are_unanswered(chat, scripted):
    scripted.add(tool_call("add", {"a": 1, "b": 2}, id="call_1"))
    chat.ask_later("1+2?").generate()
    with pytest.raises(PendingToolCallsError, match=r"add \(call_1\)"):
        chat.ask_later("never mind")
    assert roles(chat) == ["user", "assistant"]


# -- generate ---------------------------------------------------------------------------------
def test_generate_makes_exactly_one_model_call_and_returns_the_answer(chat, scripted):
    scripted.add("Hi there.", "unused")
    answer = chat.ask_later("Hello").generate()
    assert (answer.role, answer.content) == ("assistant", "Hi there.")
    assert len(scripted.requests) == 1
    assert scripted.remaining == 1


def test_generate_never_runs_tools(chat, scripted):
    scripted.add(tool_call("count", {"label": "x"}))
    chat.with_tools(count)
    answer = chat.ask_later("count").generate()
    assert [call.name for call in answer.tool_calls] == ["count"]
    assert COUNTED == []
    assert roles(chat) == ["user", "assistant"]


def test_generate_sends_the_transcript_and_tool_definitions(chat, scripted):
    scripted.add("ok")
    chat.ask_later("Hello").generate()
    request = scripted.requests[0]
    assert request.model == "test"
    assert [(m.role, m.content) for m in request.messages] == [("user", "Hello")]
    assert {definition.name for definition in request.tools} == {"add", "weather"}
    assert request.stream is False


# -- run_tools --------------------------------------------------------------------------------
def test_run_tools_runs_pending_calls_without_calling_the_model(chat, scripted):
    scripted.add(
        [tool_call("add", {"a": 1, "b": 2}, id="c1"), tool_call("weather", {"city": "Rome"})]
    )
    chat.ask_later("go").generate()
    results = chat.run_tools()
    assert [result.content for result in results] == [
        "3",
        '{"city": "Rome", "temperature_c": 21, "sky": "clear"}',
    ]
    assert [m.tool_call_id for m in tool_results(chat)][0] == "c1"
    assert len(scripted.requests) == 1
    assert set(call_states(chat).values()) == {ToolCallState.SUCCEEDED}


def test_run_tools_skips_calls_that_already_have_a_result(chat, scripted):
    chat.with_tools(count)
    scripted.add(
        [
            tool_call("count", {"label": "first"}, id="c1"),
            tool_call("count", {"label": "second"}, id="c2"),
        ]
    )
    answer = chat.ask_later("go").generate()
    first = answer.tool_calls[0]
    chat.store.tool_calls.save_tool_result(
        first,
        Message(role="tool", content="done elsewhere", tool_call_id="c1", tool_name="count"),
        ToolCallState.SUCCEEDED,
        None,
    )
    results = chat.run_tools()
    assert COUNTED == ["second"]
    assert [r.tool_call_id for r in results] == ["c2"]
    assert [(m.tool_call_id, m.content) for m in tool_results(chat)] == [
        ("c1", "done elsewhere"),
        ("c2", "counted second"),
    ]


def test_run_tools_with_nothing_pending_does_nothing(chat, scripted):
    scripted.add("plain answer")
    chat.ask_later("hi").generate()
    assert chat.run_tools() == []
    assert roles(chat) == ["user", "assistant"]


# -- step -------------------------------------------------------------------------------------
def test_step_calls_the_model_then_runs_tools_then_calls_the_model_then_stops(chat, scripted):
    scripted.add(tool_call("add", {"a": 2, "b": 2}), "It is 4.")
    chat.ask_later("2+2?")

    first = chat.step()
    assert (first.role, len(first.tool_calls)) == ("assistant", 1)
    second = chat.step()
    assert (second.role, second.content) == ("tool", "4")
    assert len(scripted.requests) == 1
    third = chat.step()
    assert (third.role, third.content) == ("assistant", "It is 4.")
    assert chat.step() is None
    assert len(scripted.requests) == 2
    assert roles(chat) == ["user", "assistant", "tool", "assistant"]


def test_step_on_an_empty_chat_returns_none_without_a_model_call(chat, scripted):
    assert chat.step() is None
    assert scripted.requests == []


# -- is_complete --------------------------------------------------------------------------------
def test_is_complete_with_no_messages(chat):
    assert chat.is_complete() is True


def test_is_complete_ignores_system_messages(scripted):
    chat = agentloop.chat("scripted:test", instructions="Be brief.")
    assert chat.is_complete() is True


def test_is_not_complete_after_a_user_message(chat):
    chat.ask_later("hi")
    assert chat.is_complete() is False


def test_is_complete_after_an_answer_without_tool_calls(chat, scripted):
    scripted.add("hello")
    chat.ask_later("hi").generate()
    assert chat.is_complete() is True


def test_is_not_complete_after_an_answer_that_asked_for_tools(chat, scripted):
    scripted.add(tool_call("add", {"a": 1, "b": 1}))
    chat.ask_later("1+1").generate()
    assert chat.is_complete() is False


def test_is_not_complete_after_a_tool_result(chat, scripted):
    scripted.add(tool_call("add", {"a": 1, "b": 1}))
    chat.ask_later("1+1").generate()
    chat.run_tools()
    assert roles(chat)[-1] == "tool"
    assert chat.is_complete() is False


def test_is_complete_ignores_a_partial_answer(chat):
    chat.ask_later("hi")
    chat.store.transcript.save_partial("Half an ans", None, "test")
    assert chat.messages[-1].status == MessageStatus.PARTIAL
    assert chat.is_complete() is False


def test_is_complete_ignores_a_cancelled_answer_after_a_finished_one(chat, scripted):
    scripted.add("done")
    chat.ask_later("hi").generate()
    chat.store.stopping.record_cancellation(
        None,
        partial=Message(role="assistant", content="cut sh"),
        partial_key=None,
        usage=None,
        unanswered=[],
    )
    assert chat.messages[-1].status == MessageStatus.CANCELLED
    assert chat.is_complete() is True


# -- complete and ask ---------------------------------------------------------------------------
def test_complete_loops_until_settled_and_returns_the_last_message(chat, scripted):
    scripted.add(
        tool_call("add", {"a": 1, "b": 2}),
        tool_call("weather", {"city": "Oslo"}),
        "3, and Oslo is clear.",
    )
    answer = chat.ask_later("go").complete()
    assert answer.content == "3, and Oslo is clear."
    assert roles(chat) == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    scripted.assert_complete()


def test_complete_on_a_settled_chat_returns_the_last_message_without_a_model_call(chat, scripted):
    scripted.add("answer")
    chat.ask("q")
    again = chat.complete()
    assert again.content == "answer"
    assert len(scripted.requests) == 1


def test_ask_adds_the_question_and_returns_the_final_answer(chat, scripted):
    scripted.add(tool_call("add", {"a": 20, "b": 22}), "42")
    answer = chat.ask("20+22?")
    assert (answer.role, answer.content) == ("assistant", "42")
    assert [m.content for m in chat.messages] == ["20+22?", "", "42", "42"]


def test_a_second_ask_sends_the_whole_history(chat, scripted):
    scripted.add("first", "second")
    chat.ask("one")
    chat.ask("two")
    assert [m.content for m in scripted.requests[1].messages] == ["one", "first", "two"]


# -- bad tool calls --------------------------------------------------------------------------
def test_unknown_tool_name_gets_an_error_result_naming_the_available_tools(chat, scripted):
    scripted.add(tool_call("teleport", {"to": "Mars"}), "Sorry.")
    answer = chat.ask("go to Mars")
    (result,) = tool_results(chat)
    assert result.is_error
    assert result.content == "Unknown tool 'teleport'. Available tools: add, weather."
    assert answer.content == "Sorry."
    assert scripted.requests[1].messages[-1].content == result.content


def test_invalid_arguments_get_an_error_result(chat, scripted):
    scripted.add(tool_call("add", {"a": "one"}), "Oops.")
    chat.ask("add")
    (result,) = tool_results(chat)
    assert result.is_error
    assert result.content.startswith("Invalid arguments for tool 'add'")
    assert list(call_states(chat).values()) == [ToolCallState.FAILED]


def test_tool_error_gets_an_error_result_with_its_message(chat, scripted):
    chat.with_tools(refuse)
    scripted.add(tool_call("refuse", {"reason": "policy"}), "Understood.")
    chat.ask("try")
    (result,) = tool_results(chat)
    assert (result.is_error, result.content) == (True, "refused: policy")


def test_exception_in_a_tool_gets_an_error_result_and_the_loop_continues(chat, scripted):
    chat.with_tools(explode)
    scripted.add(
        [tool_call("explode", id="boom"), tool_call("add", {"a": 1, "b": 1})],
        "One failed, one worked.",
    )
    answer = chat.ask("go")
    assert answer.content == "One failed, one worked."
    explode_result, add_result = tool_results(chat)
    assert explode_result.is_error
    assert explode_result.content == "Tool 'explode' failed: RuntimeError: kaboom"
    assert (add_result.is_error, add_result.content) == (False, "2")
    assert "Traceback" in chat.store.tool_errors["boom"]
    assert 'raise RuntimeError("kaboom")' in chat.store.tool_errors["boom"]


@agentloop.tool
def unserialisable() -> object:
    """Returns something JSON can't hold."""
    return {"handle": object()}


def test_a_result_that_cannot_be_serialised_gets_an_error_result(chat, scripted):
    chat.with_tools(unserialisable)
    scripted.add(tool_call("unserialisable", id="u1"), "ok")
    chat.ask("go")
    (result,) = tool_results(chat)
    assert result.is_error
    assert result.content.startswith("Tool 'unserialisable' failed:")
    assert "u1" in chat.store.tool_errors


def test_duplicate_tool_call_ids_in_one_answer_are_made_unique(chat, scripted):
    scripted.add(
        [
            tool_call("add", {"a": 1, "b": 1}, id="dup"),
            tool_call("add", {"a": 2, "b": 2}, id="dup"),
        ],
        "2 and 4",
    )
    chat.ask("both")
    calls = chat.messages[1].tool_calls
    assert calls[0].id == "dup"
    assert calls[1].id != "dup"
    assert calls[1].id.startswith("dup")
    assert [(m.tool_call_id, m.content) for m in tool_results(chat)] == [
        (calls[0].id, "2"),
        (calls[1].id, "4"),
    ]


def test_a_tool_call_id_reused_in_a_later_answer_is_made_unique(chat, scripted):
    scripted.add(
        tool_call("add", {"a": 1, "b": 1}, id="same"),
        tool_call("add", {"a": 2, "b": 2}, id="same"),
        "done",
    )
    chat.ask("twice")
    ids = [call.id for m in chat.messages for call in m.tool_calls]
    assert len(ids) == len(set(ids)) == 2
    assert [m.content for m in tool_results(chat)] == ["2", "4"]


# -- tool options -----------------------------------------------------------------------------
def test_calls_one_asks_for_one_call_and_runs_only_the_first(chat, scripted):
    chat.with_tools(count).with_tool_options(calls="one")
    scripted.add(
        [tool_call("count", {"label": "a"}, id="a"), tool_call("count", {"label": "b"}, id="b")],
        "done",
    )
    chat.ask("count twice")
    assert scripted.requests[0].parallel_tool_calls is False
    assert COUNTED == ["a"]
    results = {m.tool_call_id: m for m in tool_results(chat)}
    first, second = results["a"], results["b"]
    assert (first.is_error, first.content) == (False, "counted a")
    assert second.is_error
    assert "Only one tool call per answer" in second.content


def test_calls_many_leaves_parallel_tool_calls_to_the_provider(chat, scripted):
    scripted.add("ok")
    chat.ask("hi")
    assert scripted.requests[0].parallel_tool_calls is None


def test_tool_choice_is_sent_as_tool_choice(chat, scripted):
    chat.with_tool_options(choice="weather")
    scripted.add("ok")
    chat.ask("hi")
    assert scripted.requests[0].tool_choice == "weather"


def test_tool_choice_is_not_sent_without_tools(scripted):
    chat = agentloop.chat("scripted:test").with_tool_options(choice="required")
    scripted.add("ok")
    chat.ask("hi")
    assert (scripted.requests[0].tool_choice, scripted.requests[0].tools) == (None, [])


def test_invalid_tool_options_raise_configuration_error(chat):
    with pytest.raises(ConfigurationError):
        chat.with_tool_options(calls="two")
    with pytest.raises(ConfigurationError):
        chat.with_tool_options(concurrency=0)


def test_with_tools_refuses_what_is_not_a_tool(chat):
    with pytest.raises(ConfigurationError, match="not a tool"):
        chat.with_tools(len)


def test_concurrency_threads_runs_each_call_on_a_tool_thread_and_saves_every_result(chat, scripted):
    chat.with_tools(record).with_tool_options(concurrency="threads")
    labels = ["a", "b", "c"]
    scripted.add(
        [tool_call("record", {"label": label, "seconds": 0.01}) for label in labels], "done"
    )
    chat.ask("record")
    results = tool_results(chat)
    assert sorted(m.content for m in results) == labels
    calls = chat.messages[1].tool_calls
    assert {m.tool_call_id for m in results} == {call.id for call in calls}
    assert len(test_tools.RECORDED_THREADS) == 3
    assert all(name.startswith("agentloop-tool") for name in test_tools.RECORDED_THREADS)
    assert threading.current_thread().name not in test_tools.RECORDED_THREADS


def test_concurrency_pool_size_bounds_the_number_of_tool_threads(chat, scripted):
    chat.with_tools(record).with_tool_options(concurrency=2)
    labels = ["a", "b", "c", "d"]
    scripted.add(
        [tool_call("record", {"label": label, "seconds": 0.02}) for label in labels], "done"
    )
    chat.ask("record")
    assert sorted(m.content for m in tool_results(chat)) == labels
    assert len(test_tools.RECORDED_THREADS) == 4
    assert all(name.startswith("agentloop-tool") for name in test_tools.RECORDED_THREADS)
    assert len(set(test_tools.RECORDED_THREADS)) <= 2


def test_concurrency_threads_keeps_error_results_of_failing_tools(chat, scripted):
    chat.with_tools(record, explode).with_tool_options(concurrency="threads")
    scripted.add([tool_call("record", {"label": "fine"}), tool_call("explode")], "done")
    chat.ask("go")
    by_name = {m.tool_name: m for m in tool_results(chat)}
    assert (by_name["record"].is_error, by_name["record"].content) == (False, "fine")
    assert by_name["explode"].is_error


# -- configuration reaching the request ------------------------------------------------------
def test_with_instructions_replaces_the_system_message(scripted):
    chat = agentloop.chat("scripted:test", instructions="Be brief.")
    chat.with_instructions("Be thorough.")
    scripted.add("ok")
    chat.ask("hi")
    system = [m.content for m in scripted.requests[0].messages if m.role == "system"]
    assert system == ["Be thorough."]


def test_with_instructions_append_keeps_the_earlier_ones(scripted):
    chat = agentloop.chat("scripted:test", instructions="Be brief.")
    chat.with_instructions("Answer in French.", append=True)
    scripted.add("ok")
    chat.ask("hi")
    system = [m.content for m in scripted.requests[0].messages if m.role == "system"]
    assert system == ["Be brief.", "Answer in French."]


def test_sampling_and_transport_settings_reach_the_request(chat, scripted):
    (
        chat.with_temperature(0.3)
        .with_max_output_tokens(256)
        .with_provider_options(top_p=0.9)
        .with_provider_options(seed=7)
        .with_headers(**{"X-Trace": "abc"})
    )
    scripted.add("ok")
    chat.ask("hi")
    request = scripted.requests[0]
    assert request.temperature == 0.3
    assert request.max_output_tokens == 256
    assert request.provider_options == {"top_p": 0.9, "seed": 7}
    assert request.headers == {"X-Trace": "abc"}


def test_with_model_switches_the_model_sent(chat, scripted):
    chat.with_model("scripted:other-model")
    scripted.add("ok")
    chat.ask("hi")
    assert scripted.requests[0].model == "other-model"


def test_with_model_refuses_a_model_no_provider_can_serve(chat):
    with pytest.raises(ConfigurationError, match="provider:model"):
        chat.with_model("mystery-model")


class CityTemperature(BaseModel):
    city: str
    temperature: int


def test_with_schema_sends_the_schema_and_parses_the_answer(chat, scripted):
    chat.with_schema(CityTemperature)
    scripted.add('{"city": "Paris", "temperature": 21}')
    answer = chat.ask("Weather in Paris as JSON")
    assert scripted.requests[0].output_schema == CityTemperature.model_json_schema()
    assert answer.parsed == {"city": "Paris", "temperature": 21}


def test_with_schema_leaves_parsed_empty_when_the_answer_is_not_valid_json(chat, scripted):
    chat.with_schema(CityTemperature)
    scripted.add("It is 21 degrees in Paris.")
    answer = chat.ask("Weather in Paris as JSON")
    assert answer.content == "It is 21 degrees in Paris."
    assert answer.parsed is None


def test_with_schema_leaves_parsed_empty_when_the_json_does_not_fit_the_model(chat, scripted):
    chat.with_schema(CityTemperature)
    scripted.add('{"city": "Paris"}')
    assert chat.ask("Weather").parsed is None


def test_with_schema_accepts_a_json_schema_dict(chat, scripted):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    chat.with_schema(schema)
    scripted.add('{"n": 3}')
    answer = chat.ask("n?")
    assert scripted.requests[0].output_schema == schema
    assert answer.parsed == {"n": 3}


# -- streaming ---------------------------------------------------------------------------------
def test_stream_callback_receives_the_chunks_and_the_answer_is_their_join(chat, scripted):
    scripted.add(stream("Once ", "upon ", "a time."))
    chunks = []
    answer = chat.ask("Tell a story", stream=chunks.append)
    assert [chunk.text for chunk in chunks] == ["Once ", "upon ", "a time."]
    assert answer.content == "".join(chunk.text for chunk in chunks) == "Once upon a time."
    assert scripted.requests[0].stream is True


def test_a_non_streamed_reply_arrives_as_one_chunk_when_streaming(chat, scripted):
    scripted.add("Whole answer.")
    chunks = []
    answer = chat.ask("hi", stream=chunks.append)
    assert chunks == [TextDelta(text="Whole answer.")]
    assert answer.content == "Whole answer."


def test_streamed_tool_calls_are_run(chat, scripted):
    scripted.add(stream("Let me add. ", tool_calls=[tool_call("add", {"a": 5, "b": 6})]), "11")
    chunks = []
    answer = chat.ask("5+6", stream=chunks.append)
    assert answer.content == "11"
    assert [m.content for m in tool_results(chat)] == ["11"]
    assert {chunk.kind for chunk in chunks} == {"text", "tool_call"}


# -- callbacks ---------------------------------------------------------------------------------
def test_callbacks_fire_in_order_with_their_arguments(chat, scripted):
    events = []
    (
        chat.before_message(lambda: events.append(("before_message",)))
        .after_message(lambda m: events.append(("after_message", m.role, m.content)))
        .before_tool_call(lambda c: events.append(("before_tool_call", c.name, c.arguments)))
        .after_tool_result(lambda m: events.append(("after_tool_result", m.tool_call_id)))
    )
    scripted.add(tool_call("add", {"a": 1, "b": 2}, id="c1"), "3")
    chat.ask("1+2")
    assert events == [
        ("after_message", "user", "1+2"),
        ("before_message",),
        ("after_message", "assistant", ""),
        ("before_tool_call", "add", {"a": 1, "b": 2}),
        ("after_tool_result", "c1"),
        ("after_message", "tool", "3"),
        ("before_message",),
        ("after_message", "assistant", "3"),
    ]


def test_callbacks_are_additive(chat, scripted):
    seen = []
    chat.after_message(lambda m: seen.append("first")).after_message(
        lambda m: seen.append("second")
    )
    chat.ask_later("hi")
    assert seen == ["first", "second"]


def test_unknown_event_names_are_refused(chat):
    with pytest.raises(ConfigurationError, match="Unknown event"):
        chat.on("after_everything", lambda: None)


# -- retries --------------------------------------------------------------------------------------
def usage_statuses(chat) -> list[str]:
    return [record.status for _, record in chat.store.usage]


def test_a_transient_error_is_retried_and_both_attempts_are_recorded(chat, scripted):
    scripted.add(RateLimitError("slow down", status=429, retry_after=0), "Finally.")
    answer = chat.ask("hi")
    assert answer.content == "Finally."
    assert roles(chat) == ["user", "assistant"]
    assert usage_statuses(chat) == ["failed", "succeeded"]
    assert "RateLimitError: slow down" in chat.store.usage[0][1].error
    assert len(scripted.requests) == 2


def test_a_permanent_error_is_raised_at_once_with_one_failed_usage_record(chat, scripted):
    scripted.add(AuthenticationError("bad key", status=401), "never sent")
    with pytest.raises(AuthenticationError, match="bad key"):
        chat.ask("hi")
    assert usage_statuses(chat) == ["failed"]
    assert len(scripted.requests) == 1
    assert scripted.remaining == 1
    assert roles(chat) == ["user"]


def test_retries_stop_after_model_retries_and_raise_the_last_error(chat, scripted):
    scripted.add(ServerError("down", status=503), ServerError("still down", status=503), "late")
    with (
        override_settings(AGENTLOOP={"MODEL_RETRIES": 1, "RETRY_BACKOFF": 0}),
        pytest.raises(ServerError, match="still down"),
    ):
        chat.ask("hi")
    assert usage_statuses(chat) == ["failed", "failed"]
    assert scripted.remaining == 1


def test_no_retry_when_model_retries_is_zero(chat, scripted):
    scripted.add(RateLimitError("slow down", retry_after=0), "unused")
    with (
        override_settings(AGENTLOOP={"MODEL_RETRIES": 0}),
        pytest.raises(RateLimitError),
    ):
        chat.ask("hi")
    assert usage_statuses(chat) == ["failed"]


def test_a_successful_answer_records_its_token_usage(chat, scripted):
    scripted.add("four words are here")
    chat.ask("hi")
    ((_, record),) = chat.store.usage
    assert (record.provider, record.model, record.status) == ("scripted", "test", "succeeded")
    assert (record.usage.input_tokens, record.usage.output_tokens) == (10, 4)
    assert record.cost is None


# -- cancellation ----------------------------------------------------------------------------------
def test_cancel_from_another_thread_stops_a_streaming_answer(chat, scripted):
    words = [f"w{i} " for i in range(400)]
    scripted.add(stream(*words, delay=0.01), "Back again.")
    first_chunk = threading.Event()

    def cancel_once_streaming():
        first_chunk.wait(timeout=10)
        chat.cancel()

    canceller = threading.Thread(target=cancel_once_streaming)
    canceller.start()
    with pytest.raises(CancelledError):
        chat.ask("Talk for a while", stream=lambda chunk: first_chunk.set())
    canceller.join()

    partial = chat.messages[-1]
    assert (partial.role, partial.status) == ("assistant", MessageStatus.CANCELLED)
    assert partial.content
    assert "".join(words).startswith(partial.content)
    assert len(partial.content) < len("".join(words))
    assert usage_statuses(chat) == ["cancelled"]
    assert chat.store.stopping.cancel_requested_at() is None
    assert chat.is_complete() is False


def test_the_chat_works_again_right_after_a_cancel(chat, scripted):
    scripted.add(stream(*[f"w{i} " for i in range(400)], delay=0.01), "Back again.")
    first_chunk = threading.Event()
    canceller = threading.Thread(target=lambda: (first_chunk.wait(timeout=10), chat.cancel()))
    canceller.start()
    with pytest.raises(CancelledError):
        chat.ask("Talk", stream=lambda chunk: first_chunk.set())
    canceller.join()

    answer = chat.ask("Shorter please")
    assert answer.content == "Back again."
    sent = scripted.requests[1].messages
    assert [(m.role, m.content) for m in sent] == [("user", "Talk"), ("user", "Shorter please")]


def test_cancel_with_nothing_running_sets_nothing(chat, scripted):
    scripted.add("answer")
    chat.ask_later("hi")
    assert chat.cancel() is False
    assert chat.store.stopping.cancel_requested_at() is None
    assert chat.complete().content == "answer"


def test_cancel_before_the_model_call_stops_it_before_the_request(chat, scripted):
    scripted.add("unused")
    chat.ask_later("hi")
    chat.before_message(lambda: chat.cancel())
    with pytest.raises(CancelledError):
        chat.complete()
    assert scripted.requests == []
    assert chat.store.stopping.cancel_requested_at() is None
    assert scripted.remaining == 1


def cancel_round(chat, scripted):
    """A round of three calls where the first cancels the chat from inside the tool."""
    chat.with_tools(CancelChat, count)
    scripted.add(
        [
            tool_call("cancel_chat", id="c1"),
            tool_call("count", {"label": "second"}, id="c2"),
            tool_call("count", {"label": "third"}, id="c3"),
        ]
    )
    chat.ask_later("do three things")
    with pytest.raises(CancelledError):
        chat.complete()


def test_cancel_from_inside_a_tool_stops_before_the_next_tool(chat, scripted):
    cancel_round(chat, scripted)
    assert COUNTED == []
    assert [(m.tool_call_id, m.content) for m in tool_results(chat)] == [("c1", "cancel requested")]
    assert call_states(chat) == {
        "c1": ToolCallState.SUCCEEDED,
        "c2": ToolCallState.CANCELLED,
        "c3": ToolCallState.CANCELLED,
    }
    assert chat.store.stopping.cancel_requested_at() is None
    assert len(scripted.requests) == 1


def test_ask_later_after_a_cancelled_round_answers_the_cancelled_calls(chat, scripted):
    cancel_round(chat, scripted)
    after = []
    chat.after_message(after.append)
    chat.ask_later("never mind")
    assert roles(chat) == ["user", "assistant", "tool", "tool", "tool", "user"]
    cancelled = tool_results(chat)[1:]
    assert [(m.tool_call_id, m.content, m.is_error) for m in cancelled] == [
        ("c2", CANCELLED_TOOL_RESULT, True),
        ("c3", CANCELLED_TOOL_RESULT, True),
    ]
    assert [m.role for m in after] == ["tool", "tool", "user"]
    assert COUNTED == []


def test_the_next_answer_after_a_cancelled_round_sees_a_result_for_every_call(chat, scripted):
    cancel_round(chat, scripted)
    scripted.add("OK, stopped.")
    chat.ask("never mind")
    sent = scripted.requests[-1].messages
    calls = {call.id for m in sent for call in m.tool_calls}
    answered = {m.tool_call_id for m in sent if m.role == "tool"}
    assert calls == answered == {"c1", "c2", "c3"}


def test_step_after_a_cancel_in_a_tool_round_runs_the_remaining_calls(chat, scripted):
    cancel_round(chat, scripted)
    chat.step()
    assert COUNTED == ["second", "third"]
    assert [m.tool_call_id for m in tool_results(chat)] == ["c1", "c2", "c3"]
    assert set(call_states(chat).values()) == {ToolCallState.SUCCEEDED}
    assert len(scripted.requests) == 1

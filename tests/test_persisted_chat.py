"""The persisted Chat: every verb writes the rows docs/design.md §2 promises, and the row carries
the configuration so a fresh instance (any process) continues the conversation."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.test import override_settings
from pydantic import BaseModel

from agentloop import ConfigurationError, PendingToolCallsError, Tool
from agentloop.exceptions import BadRequestError, ChatBusyError, RateLimitError
from agentloop.messages import MessageStatus, TextDelta, TokenUsage, ToolCallState
from agentloop.models import Chat, Message, ToolCall, Usage
from agentloop.testing import reply, stream, tool_call
from tests.tools import Weather, add

pytestmark = pytest.mark.django_db


class CityFacts(BaseModel):
    """Structured output used by the schema test (importable by path)."""

    city: str
    population: int


def rows(chat):
    """(role, content) of every message row, in order."""
    return [(m.role, m.content) for m in chat.messages.all()]


def fresh(chat):
    return Chat.objects.get(pk=chat.pk)


# -- ask_later ---------------------------------------------------------------------------
def test_ask_later_writes_a_user_row_and_makes_no_model_call(chat, scripted):
    returned = chat.ask_later("Hello")

    assert returned is chat
    assert rows(chat) == [("user", "Hello")]
    assert scripted.requests == []
    assert Usage.objects.count() == 0


def test_ask_later_refuses_while_tool_calls_are_pending(chat, scripted):
    chat.with_tools(add)
    scripted.add(tool_call("add", {"a": 1, "b": 2}, id="call_1"))
    chat.ask_later("1 + 2?").generate()

    with pytest.raises(PendingToolCallsError, match="call_1"):
        chat.ask_later("Never mind")

    assert [m.role for m in chat.messages.all()] == ["user", "assistant"]


# -- generate ----------------------------------------------------------------------------
def test_generate_writes_the_answer_row_and_returns_it(chat, scripted):
    scripted.add("Hi there")
    chat.ask_later("Hello")

    answer = chat.generate()

    assert isinstance(answer, Message)
    assert answer.pk is not None
    assert (answer.role, answer.content, answer.status) == ("assistant", "Hi there", "complete")
    assert answer.model == "test"
    assert rows(chat) == [("user", "Hello"), ("assistant", "Hi there")]
    assert [m.role for m in scripted.requests[0].messages] == ["user"]


def test_generate_stores_tool_calls_with_ids_names_and_arguments(chat, scripted):
    chat.with_tools(add, Weather)
    scripted.add(
        reply(
            "Let me check.",
            tool_call("add", {"a": 1, "b": 2}, id="call_a"),
            tool_call("weather", {"city": "Paris"}, id="call_w"),
        )
    )
    chat.ask_later("Sum and weather?")

    answer = chat.generate()

    calls = list(answer.tool_calls.all())
    assert [(c.call_id, c.name, c.arguments) for c in calls] == [
        ("call_a", "add", {"a": 1, "b": 2}),
        ("call_w", "weather", {"city": "Paris"}),
    ]
    assert all(isinstance(c.arguments, dict) for c in calls)
    assert {c.state for c in calls} == {ToolCallState.PENDING}
    assert {c.chat_id for c in calls} == {chat.pk}


def test_generate_never_runs_tools(chat, scripted):
    chat.with_tools(add)
    scripted.add(tool_call("add", {"a": 1, "b": 2}))
    chat.ask_later("1 + 2?")

    chat.generate()

    assert [m.role for m in chat.messages.all()] == ["user", "assistant"]
    assert ToolCall.objects.get().state == ToolCallState.PENDING
    assert not chat.is_complete()


def test_generate_streams_chunks_and_stores_the_joined_text(chat, scripted):
    scripted.add(stream("Hel", "lo ", "world"))
    chat.ask_later("Greet me")
    chunks = []

    answer = chat.generate(stream=chunks.append)

    assert [c.text for c in chunks if isinstance(c, TextDelta)] == ["Hel", "lo ", "world"]
    assert answer.content == "Hello world"
    assert chat.messages.get(role="assistant").status == MessageStatus.COMPLETE


def test_generate_writes_one_succeeded_usage_row_charged_to_the_owner(chat, scripted, user):
    scripted.add(reply("Hi", usage=TokenUsage(input_tokens=12, output_tokens=3)))
    chat.ask_later("Hello")

    answer = chat.generate()

    usage = Usage.objects.get()
    assert (usage.status, usage.input_tokens, usage.output_tokens) == ("succeeded", 12, 3)
    assert (usage.chat_id, usage.message_id, usage.owner_id) == (chat.pk, answer.pk, user.pk)
    assert (usage.provider, usage.model) == ("scripted", "test")


@override_settings(AGENTLOOP={"MODEL_RETRIES": 2, "RETRY_BACKOFF": 0})
def test_each_retried_attempt_gets_its_own_usage_row(chat, scripted, user):
    scripted.add(RateLimitError("slow down"), RateLimitError("slow down"), "Finally")
    chat.ask_later("Hello")

    answer = chat.generate()

    assert answer.content == "Finally"
    attempts = list(Usage.objects.order_by("id"))
    assert [u.status for u in attempts] == ["failed", "failed", "succeeded"]
    assert attempts[0].error == "RateLimitError: slow down"
    assert [u.message_id for u in attempts] == [None, None, answer.pk]
    assert {u.owner_id for u in attempts} == {user.pk}
    assert rows(chat) == [("user", "Hello"), ("assistant", "Finally")]


def test_a_permanent_provider_error_records_a_failed_attempt_and_no_answer(chat, scripted):
    scripted.add(BadRequestError("bad request", status=400))
    chat.ask_later("Hello")

    with pytest.raises(BadRequestError):
        chat.generate()

    assert [u.status for u in Usage.objects.all()] == ["failed"]
    assert rows(chat) == [("user", "Hello")]


# -- run_tools ---------------------------------------------------------------------------
def test_run_tools_writes_one_result_row_per_call_linked_to_its_call(chat, scripted):
    chat.with_tools(add, Weather)
    scripted.add(
        [
            tool_call("add", {"a": 2, "b": 3}, id="call_a"),
            tool_call("weather", {"city": "Rome"}, id="call_w"),
        ]
    )
    chat.ask_later("Go").generate()

    results = chat.run_tools()

    assert all(isinstance(r, Message) for r in results)
    assert [(r.role, r.content) for r in results] == [
        ("tool", "5"),
        ("tool", '{"city": "Rome", "temperature_c": 21, "sky": "clear"}'),
    ]
    assert [r.tool_call.call_id for r in results] == ["call_a", "call_w"]
    assert [m.role for m in chat.messages.all()] == ["user", "assistant", "tool", "tool"]
    calls = ToolCall.objects.order_by("id")
    assert [c.state for c in calls] == [ToolCallState.SUCCEEDED] * 2
    assert all(c.started_at is not None and c.finished_at is not None for c in calls)
    assert [c.result.content for c in calls] == ["5", results[1].content]
    assert scripted.remaining == 0 and len(scripted.requests) == 1


def test_run_tools_records_failures_as_error_results(chat, scripted):
    chat.with_tools(add)
    scripted.add([tool_call("add", {"a": "x"}, id="bad"), tool_call("nope", {}, id="unknown")])
    chat.ask_later("Go").generate()

    results = chat.run_tools()

    assert [(r.tool_call.call_id, r.is_error) for r in results] == [
        ("bad", True),
        ("unknown", True),
    ]
    assert "Invalid arguments for tool 'add'" in results[0].content
    assert results[1].content == "Unknown tool 'nope'. Available tools: add."
    assert [c.state for c in ToolCall.objects.order_by("id")] == [ToolCallState.FAILED] * 2


def test_run_tools_skips_calls_that_already_have_a_result(chat, scripted):
    chat.with_tools(add)
    scripted.add(
        [tool_call("add", {"a": 1, "b": 1}, id="c1"), tool_call("add", {"a": 2, "b": 2}, id="c2")]
    )
    chat.ask_later("Go").generate()
    first = ToolCall.objects.get(call_id="c1")
    Message.objects.create(chat=chat, role="tool", content="answered elsewhere", tool_call=first)

    results = chat.run_tools()

    assert [(r.tool_call.call_id, r.content) for r in results] == [("c2", "4")]
    assert [m.content for m in chat.messages.filter(role="tool")] == ["answered elsewhere", "4"]


def test_run_tools_without_pending_calls_does_nothing(chat, scripted):
    scripted.add("Hi")
    chat.ask_later("Hello").generate()

    assert chat.run_tools() == []
    assert chat.messages.count() == 2


# -- step, complete, ask -----------------------------------------------------------------
def test_step_generates_then_runs_tools_then_generates_then_returns_none(chat, scripted):
    chat.with_tools(add)
    scripted.add(tool_call("add", {"a": 1, "b": 2}, id="c1"), "It is 3.")
    chat.ask_later("1 + 2?")

    first = chat.step()
    second = chat.step()
    third = chat.step()

    assert (first.role, second.role, third.role) == ("assistant", "tool", "assistant")
    assert second.tool_call.call_id == "c1"
    assert third.content == "It is 3."
    assert chat.step() is None
    assert len(scripted.requests) == 2


def test_complete_runs_the_whole_tool_conversation_and_returns_the_answer(chat, scripted):
    chat.with_tools(add, Weather)
    scripted.add(
        [
            tool_call("add", {"a": 1, "b": 2}, id="c1"),
            tool_call("weather", {"city": "Oslo"}, id="c2"),
        ],
        "3, and Oslo is clear.",
    )
    chat.ask_later("Sum and weather?")

    answer = chat.complete()

    assert isinstance(answer, Message)
    assert answer.content == "3, and Oslo is clear."
    messages = list(chat.messages.all())
    assert [m.role for m in messages] == ["user", "assistant", "tool", "tool", "assistant"]
    assert [m.tool_call.call_id for m in messages if m.role == "tool"] == ["c1", "c2"]
    assert [m.role for m in scripted.requests[1].messages] == ["user", "assistant", "tool", "tool"]
    assert Usage.objects.filter(status="succeeded").count() == 2
    scripted.assert_complete()


def test_complete_on_a_settled_chat_returns_the_last_answer_without_a_model_call(chat, scripted):
    scripted.add("Hi")
    answer = chat.ask("Hello")

    again = chat.complete()

    assert isinstance(again, Message)
    assert again.pk == answer.pk
    assert len(scripted.requests) == 1


def test_ask_adds_the_user_message_and_returns_the_answer_row(chat, scripted):
    scripted.add("Paris.")

    answer = chat.ask("Capital of France?")

    assert isinstance(answer, Message)
    assert answer.content == "Paris."
    assert rows(chat) == [("user", "Capital of France?"), ("assistant", "Paris.")]


# -- is_complete, is_waiting -------------------------------------------------------------
def test_is_complete_follows_the_transcript(chat, scripted):
    chat.with_tools(add)
    assert chat.is_complete()  # nothing yet
    chat.with_instructions("Be brief.")
    assert chat.is_complete()  # only a system message
    chat.ask_later("1 + 2?")
    assert not chat.is_complete()  # a user message waits for an answer
    scripted.add(tool_call("add", {"a": 1, "b": 2}), "3")
    chat.generate()
    assert not chat.is_complete()  # the answer asked for a tool
    chat.run_tools()
    assert not chat.is_complete()  # the tool result waits for the model
    chat.generate()
    assert chat.is_complete()


def test_is_waiting_when_a_pending_call_is_held_and_step_does_nothing(chat, scripted):
    chat.with_tools(add)
    scripted.add(tool_call("add", {"a": 1, "b": 2}))
    chat.ask_later("1 + 2?").generate()
    assert not chat.is_waiting()

    ToolCall.objects.update(state=ToolCallState.WAITING)

    assert chat.is_waiting()
    assert not chat.is_complete()
    assert chat.step() is None
    assert chat.messages.count() == 2


# -- configuration on the row ------------------------------------------------------------
def test_configuration_is_stored_on_the_row_and_a_fresh_instance_uses_it(chat, scripted):
    (
        chat.with_instructions("Be brief.")
        .with_tools(add, Weather)
        .with_tool_options(choice="auto", calls="one")
        .with_temperature(0.3)
        .with_max_output_tokens(200)
        .with_provider_options(seed=7)
        .with_headers(**{"X-Trace": "t1"})
        .with_limits(max_model_calls=5)
    )

    loaded = fresh(chat)
    assert loaded.tools == ["tests.tools.add", "tests.tools.Weather"]
    assert loaded.tool_options == {"choice": "auto", "calls": "one"}
    assert (loaded.temperature, loaded.max_output_tokens) == (0.3, 200)
    assert loaded.provider_options == {"seed": 7}
    assert loaded.headers == {"X-Trace": "t1"}
    assert loaded.limits == {"max_model_calls": 5}

    scripted.add("Short.")
    loaded.ask("Hi")
    request = scripted.requests[0]
    assert [(m.role, m.content) for m in request.messages] == [
        ("system", "Be brief."),
        ("user", "Hi"),
    ]
    assert [t.name for t in request.tools] == ["add", "weather"]
    assert (request.tool_choice, request.parallel_tool_calls) == ("auto", False)
    assert (request.temperature, request.max_output_tokens) == (0.3, 200)
    assert (request.provider_options, request.headers) == ({"seed": 7}, {"X-Trace": "t1"})


def test_with_model_is_stored_and_used_by_a_fresh_instance(chat, scripted):
    chat.with_model("scripted:bigger")
    scripted.add("Hi")

    answer = fresh(chat).ask("Hello")

    assert fresh(chat).model == "scripted:bigger"
    assert scripted.requests[0].model == "bigger"
    assert answer.model == "bigger"


def test_a_fresh_instance_runs_the_tools_another_instance_asked_for(chat, scripted):
    chat.with_tools(add)
    scripted.add(tool_call("add", {"a": 20, "b": 22}, id="c1"), "42")
    chat.ask_later("20 + 22?").generate()

    answer = fresh(chat).complete()

    assert answer.content == "42"
    assert rows(chat) == [
        ("user", "20 + 22?"),
        ("assistant", ""),
        ("tool", "42"),
        ("assistant", "42"),
    ]


def test_structured_output_is_parsed_by_a_fresh_instance_through_the_stored_schema(chat, scripted):
    chat.with_schema(CityFacts)
    assert chat.schema_path == "tests.test_persisted_chat.CityFacts"
    scripted.add('{"city": "Oslo", "population": 700000}')

    answer = fresh(chat).ask("Facts about Oslo")

    assert answer.parsed == {"city": "Oslo", "population": 700000}
    assert scripted.requests[0].output_schema == CityFacts.model_json_schema()


def test_an_unknown_tool_path_on_the_row_is_an_error_naming_it(chat, scripted):
    chat.ask_later("Hello")
    Chat.objects.filter(pk=chat.pk).update(tools=["tests.tools.add", "tests.tools.no_such_tool"])
    scripted.add("never sent")

    with pytest.raises(ConfigurationError, match="tests.tools.no_such_tool"):
        fresh(chat).step()

    assert scripted.requests == []
    assert rows(chat) == [("user", "Hello")]


def test_an_unimportable_module_path_is_an_error_naming_it(chat):
    Chat.objects.filter(pk=chat.pk).update(tools=["tests.no_such_module.tool"])

    with pytest.raises(ConfigurationError, match="tests.no_such_module.tool"):
        fresh(chat).with_tools(add)


def test_a_tool_defined_inside_a_function_is_refused_at_with_tools(chat):
    class Local(Tool):
        """Cannot be loaded by another process."""

        def execute(self) -> str:
            return "local"

    with pytest.raises(ConfigurationError, match="import path"):
        chat.with_tools(Local)

    assert fresh(chat).tools == []


def test_with_instructions_replaces_the_system_message(chat):
    chat.with_instructions("First.")
    chat.with_instructions("Second.")

    assert rows(chat) == [("system", "Second.")]


def test_with_instructions_append_adds_a_second_system_message(chat):
    chat.with_instructions("First.")
    chat.with_instructions("Also this.", append=True)

    assert rows(chat) == [("system", "First."), ("system", "Also this.")]


# -- partial rows, duplicate results -----------------------------------------------------
def test_a_partial_answer_row_is_not_counted_and_step_generates_again(chat, scripted):
    chat.ask_later("Tell me a story")
    partial = Message.objects.create(
        chat=chat, role="assistant", content="Once upon", status=MessageStatus.PARTIAL
    )
    assert not chat.is_complete()
    scripted.add("Once upon a time, the end.")

    answer = chat.step()

    assert answer.content == "Once upon a time, the end."
    assert [m.role for m in scripted.requests[0].messages] == ["user"]
    partial.refresh_from_db()
    assert (partial.status, partial.content) == (MessageStatus.PARTIAL, "Once upon")
    assert chat.is_complete()
    assert chat.step() is None


def test_a_second_writer_is_refused_while_a_round_runs_and_nothing_is_lost(chat, scripted):
    chat.with_tools(add)
    scripted.add(
        [tool_call("add", {"a": 1, "b": 2}, id="c1"), tool_call("add", {"a": 3, "b": 4}, id="c2")]
    )
    chat.ask_later("Go").generate()
    other_worker = fresh(chat)
    refused = []

    def try_to_answer_everything_first(call):
        # Another instance (another worker) tries to run the round while this one does.
        if call.call_id == "c1":
            with pytest.raises(ChatBusyError):
                other_worker.run_tools()
            refused.append(call.call_id)

    chat.before_tool_call(try_to_answer_everything_first)
    chat.run_tools()

    assert refused == ["c1"]

    results = list(chat.messages.filter(role="tool"))
    assert [(m.tool_call.call_id, m.content) for m in results] == [("c1", "3"), ("c2", "7")]
    assert [c.state for c in ToolCall.objects.order_by("id")] == [ToolCallState.SUCCEEDED] * 2


# -- usage totals ------------------------------------------------------------------------
@override_settings(AGENTLOOP={"MODEL_RETRIES": 1, "RETRY_BACKOFF": 0})
def test_usage_totals_for_an_owner(chat, scripted, user, django_user_model):
    other = django_user_model.objects.create_user(username="grace", password="pw")
    scripted.add(
        reply("a", usage=TokenUsage(input_tokens=10, output_tokens=2, cached_tokens=4)),
        RateLimitError("slow down"),
        reply("b", usage=TokenUsage(input_tokens=20, output_tokens=5, reasoning_tokens=1)),
        "other's",
    )
    chat.ask("one")
    chat.ask("two")
    Chat.objects.create(model="scripted:test", owner=other).ask("three")

    totals = Usage.objects.for_owner(user).totals()

    assert totals == {
        "input_tokens": 30,
        "output_tokens": 7,
        "cache_read_tokens": 4,
        "cache_write_tokens": 0,
        "reasoning_tokens": 1,
        "cost": Decimal(0),
        "attempts": 3,
        "failed": 1,
        "cancelled": 0,
    }
    assert Usage.objects.for_owner(other).totals()["attempts"] == 1


def test_trusted_builds_the_same_message_as_validation():
    """The store builds its own rows' messages without validation
    (django_store.transcript_rows.trusted): the result must equal, field for field, what
    pydantic would build and validate."""
    from agentloop.django_store.transcript_rows import trusted
    from agentloop.messages import Message, ToolCall

    call = {"id": "c1", "name": "add", "arguments": {"a": 1}, "key": 7}
    validated_call = ToolCall.model_validate(call)
    # Every field given, as the store's rows give them.
    built_call = trusted(ToolCall, dict(validated_call.__dict__))
    assert built_call == validated_call
    assert built_call.model_dump() == validated_call.model_dump()

    values = dict(Message.model_validate({"role": "assistant", "content": "hi"}).__dict__)
    values["tool_calls"] = [built_call]
    built = trusted(Message, values)
    assert built == Message.model_validate({**values, "tool_calls": [call]})
    assert built.model_dump_json() == Message.model_validate(built.model_dump()).model_dump_json()
    built.key = 9  # our rows' messages stay assignable, as validated ones are
    assert built.key == 9


def test_the_stores_messages_carry_every_field(chat, scripted):
    """Rows are built without validation: a field added to Message or ToolCall and left out
    of the row mapping would be missing (an AttributeError far away). Every one is there."""
    from agentloop.messages import Message, ToolCall

    chat.with_tools(add)
    scripted.add(tool_call("add", {"a": 1, "b": 2}), "3")
    chat.ask("1 + 2?")

    transcript = chat.conversation.store.transcript.load_transcript()
    assert [m.role for m in transcript] == ["user", "assistant", "tool", "assistant"]
    for message in transcript:
        assert set(message.__dict__) == set(Message.model_fields)
        for call in message.tool_calls:
            assert set(call.__dict__) == set(ToolCall.model_fields)


@pytest.mark.parametrize(
    ("first_byte", "between", "partial"), [(0.6, 0.0, False), (0.0, 0.3, True)]
)
def test_partial_saves_count_seconds_of_streaming(chat, settings, first_byte, between, partial):
    """``PARTIAL_SAVE_INTERVAL`` counts from the first chunk (docs/loop.md, "Partial answers"):
    a model slow to start that then streams at once leaves no partial row; one that streams
    slowly does."""
    # Function-local: only this test needs them.
    import time

    from django.db.models.signals import post_save

    from agentloop import providers
    from agentloop.testing import ScriptedProvider

    class SlowStart(ScriptedProvider):
        def request(self, request, *, on_chunk=None):
            time.sleep(first_byte)  # before the first byte
            return super().request(request, on_chunk=on_chunk)

    providers.register("slowstart", SlowStart(stream("a", "b", "c", delay=between)))
    settings.AGENTLOOP = {**settings.AGENTLOOP, "PARTIAL_SAVE_INTERVAL": 0.5}
    statuses: list[str] = []

    def saved(sender, instance, **kwargs):
        statuses.append(instance.status)

    chat.model = "slowstart:test"
    chat.save()
    post_save.connect(saved, sender=Message)  # partial rows are written with save()
    try:
        answer = chat.ask("Go", lambda chunk: None)
    finally:
        post_save.disconnect(saved, sender=Message)
        providers.unregister("slowstart")

    assert answer.content == "abc" and answer.status == MessageStatus.COMPLETE
    assert (MessageStatus.PARTIAL in statuses) is partial, statuses

"""Contract: the transcript (messages in order, partial answers, answers with their calls)."""

from __future__ import annotations

from datetime import UTC, datetime

from agentloop.messages import Message, MessageStatus, ToolCallState
from tests.store_contract.harness import Harness, answer, call, usage

__all__ = ["TestAnswers", "TestPartials", "TestTranscript"]


def shape(messages: list[Message]) -> list[tuple[str, str, str]]:
    """Role, content and status of each message, in order."""
    return [(m.role, m.content, str(m.status)) for m in messages]


class TestTranscript:
    """``append_message`` adds at the end and sets ``key`` on the message it was given;
    ``load_transcript`` reads every message back in order (and the cancel flag read after it
    at the start of a move is the one requested); ``turn_started_at`` says when a message was
    written; ``replace_instructions`` leaves one system message; ``native_message`` finds a
    record."""

    part = "transcript"

    def test_a_new_chat_has_no_messages_and_no_cancel(self, harness: Harness) -> None:
        assert harness.store.transcript.load_transcript() == []
        assert harness.store.stopping.cancel_requested_at() is None

    def test_messages_come_back_in_order_with_their_roles_and_keys(self, harness: Harness) -> None:
        sent = [
            Message(role="system", content="Be brief."),
            Message(role="user", content="Hi"),
        ]
        records = [harness.store.transcript.append_message(message) for message in sent]
        reply = answer(content="Hello")
        harness.store.transcript.save_answer(reply, usage())
        follow_up = Message(role="user", content="Bye")
        harness.store.transcript.append_message(follow_up)

        for store in (harness.store, harness.reopen()):
            transcript = store.transcript.load_transcript()
            assert shape(transcript) == [
                ("system", "Be brief.", "complete"),
                ("user", "Hi", "complete"),
                ("assistant", "Hello", "complete"),
                ("user", "Bye", "complete"),
            ]
            keys = [m.key for m in transcript]
            assert keys == [sent[0].key, sent[1].key, reply.key, follow_up.key]
            assert None not in keys and len(set(keys)) == 4
        for message, record in zip(sent, records, strict=True):
            back = harness.as_message(record)
            assert (back.role, back.content, back.key) == (
                message.role,
                message.content,
                message.key,
            )

    def test_a_move_reads_the_transcript_then_the_cancel_flag(self, harness: Harness) -> None:
        harness.store.transcript.append_message(Message(role="user", content="Hi"))
        assert harness.store.runs.claim() is True
        assert harness.other().stopping.request_cancel() is True

        transcript = harness.store.transcript.load_transcript()
        requested_at = harness.store.stopping.cancel_requested_at()

        assert shape(transcript) == [("user", "Hi", "complete")]
        assert isinstance(requested_at, datetime)
        assert requested_at == harness.store.stopping.cancel_requested_at()
        harness.store.runs.release("done")

    def test_turn_started_at_is_when_the_message_was_written(self, harness: Harness) -> None:
        before = datetime.now(UTC)
        harness.store.transcript.append_message(Message(role="user", content="Hi"))
        after = datetime.now(UTC)

        first = harness.reopen().transcript.load_transcript()[0]
        started = harness.reopen().transcript.turn_started_at(first)
        assert started is not None and before <= started <= after

    def test_replace_instructions_leaves_one_system_message_in_the_first_ones_place(
        self, harness: Harness
    ) -> None:
        store = harness.store
        store.transcript.append_message(Message(role="system", content="First."))
        store.transcript.append_message(Message(role="user", content="Hi"))
        store.transcript.append_message(Message(role="system", content="Second."))

        store.transcript.replace_instructions("Only this.")

        assert shape(harness.reopen().transcript.load_transcript()) == [
            ("system", "Only this.", "complete"),
            ("user", "Hi", "complete"),
        ]

    def test_replace_instructions_adds_one_when_there_is_none(self, harness: Harness) -> None:
        harness.store.transcript.replace_instructions("Be kind.")
        harness.store.transcript.replace_instructions("Be brief.")

        system = [m for m in harness.store.transcript.load_transcript() if m.role == "system"]
        assert [m.content for m in system] == ["Be brief."]

    def test_native_message_is_the_record_of_a_transcript_message(self, harness: Harness) -> None:
        harness.store.transcript.append_message(Message(role="user", content="Hi"))
        message = harness.store.transcript.load_transcript()[0]

        record = harness.as_message(harness.store.transcript.native_message(message))
        assert (record.key, record.role, record.content) == (message.key, "user", "Hi")


class TestPartials:
    """A streaming answer: ``save_partial`` inserts it marked partial (returning its key),
    then updates that same row; ``save_answer(partial_key=...)`` turns it into the finished
    answer in its place; ``fail_partial`` marks it failed, so it never looks still streaming."""

    part = "transcript"

    def test_save_partial_inserts_then_updates_the_same_message(self, harness: Harness) -> None:
        harness.store.transcript.append_message(Message(role="user", content="Hi"))

        key = harness.store.transcript.save_partial("Hel", None, "test")
        assert key is not None
        assert harness.store.transcript.save_partial("Hello", key, "test") == key

        transcript = harness.reopen().transcript.load_transcript()
        assert shape(transcript) == [("user", "Hi", "complete"), ("assistant", "Hello", "partial")]
        assert transcript[-1].key == key
        assert not transcript[-1].is_finished

    def test_the_answer_replaces_its_partial_in_place(self, harness: Harness) -> None:
        harness.store.transcript.append_message(Message(role="user", content="Hi"))
        key = harness.store.transcript.save_partial("Hel", None, "test")
        reply = answer(call("c1"), content="Hello there")

        harness.store.transcript.save_answer(reply, usage(), partial_key=key)

        transcript = harness.reopen().transcript.load_transcript()
        assert shape(transcript) == [
            ("user", "Hi", "complete"),
            ("assistant", "Hello there", "complete"),
        ]
        assert transcript[-1].key == key == reply.key
        assert [c.id for c in transcript[-1].tool_calls] == ["c1"]

    def test_fail_partial_marks_it_failed_and_keeps_its_text(self, harness: Harness) -> None:
        key = harness.store.transcript.save_partial("Half an ans", None, "test")

        harness.store.transcript.fail_partial(key)

        (message,) = harness.reopen().transcript.load_transcript()
        assert (message.content, message.status) == ("Half an ans", MessageStatus.FAILED)
        assert not message.is_finished


class TestAnswers:
    """``save_answer`` writes the answer with its tool calls (pending, in order, with keys
    set on the message and each call) and its usage row, in one go."""

    part = "transcript"

    def test_the_answers_calls_come_back_pending_with_their_keys(self, harness: Harness) -> None:
        harness.store.transcript.append_message(Message(role="user", content="Add"))
        reply = answer(call("c1", a=1, b=2), call("c2", "weather", city="Oslo"), content="On it")

        record = harness.store.transcript.save_answer(reply, usage("0.01", input_tokens=12))

        assert reply.key is not None and harness.as_message(record).key == reply.key
        stored = harness.reopen().transcript.load_transcript()[-1]
        assert (stored.role, stored.content, stored.key) == ("assistant", "On it", reply.key)
        assert [(c.id, c.name, c.arguments, c.state) for c in stored.tool_calls] == [
            ("c1", "add", {"a": 1, "b": 2}, ToolCallState.PENDING),
            ("c2", "weather", {"city": "Oslo"}, ToolCallState.PENDING),
        ]
        assert [c.key for c in stored.tool_calls] == [c.key for c in reply.tool_calls]
        assert None not in [c.key for c in reply.tool_calls]
        assert harness.store.transcript.last_input_tokens() == (reply.key, 12)

    def test_native_tool_call_is_the_record_of_a_call(self, harness: Harness) -> None:
        reply = answer(call("c1"))
        harness.store.transcript.save_answer(reply, usage())
        read = harness.store.transcript.load_transcript()[-1].tool_calls[0]

        record = harness.as_call(harness.store.tool_calls.native_tool_call(read))
        assert (record.key, record.id, record.name, record.state) == (
            read.key,
            "c1",
            "add",
            ToolCallState.PENDING,
        )

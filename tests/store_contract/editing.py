"""Contract: superseded rows (an edit, a regenerated answer) and forks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from agentloop.engine._transcript_reading import next_move
from agentloop.messages import Message, MessageStatus, ToolCallState
from tests.store_contract.harness import Harness, answer, call, usage
from tests.store_contract.tool_calls import held, result_for
from tests.tools import add

__all__ = ["TestFork", "TestSupersede"]

#: what the engine gives a copied call whose result was not copied (engine._loop's Editing).
NOT_RUN = "Not run: the conversation was forked before this call had a result."


def shape(messages: list[Message]) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in messages]


def two_turns(harness: Harness) -> tuple[Message, Message]:
    """Hi / Hello / Again / Hello again: the two user messages."""
    first, second = Message(role="user", content="Hi"), Message(role="user", content="Again")
    harness.store.transcript.append_message(first)
    harness.store.transcript.save_answer(answer(content="Hello"), usage("0.01"))
    harness.store.transcript.append_message(second)
    harness.store.transcript.save_answer(
        answer(content="Hello again"), usage("0.02", input_tokens=40)
    )
    return first, second


def supersede(harness: Harness, first: Message) -> object:
    """``supersede`` as a verb calls it: under the chat's claim."""
    assert harness.store.runs.claim() is True
    try:
        return harness.store.edits.supersede(first)
    finally:
        harness.store.runs.release("generate")


class TestSupersede:
    """``supersede(first)`` marks ``first`` and every later message but the instructions:
    they leave the transcript (for every reader) and stay in ``load_history`` marked, with
    their usage rows; their calls without a result are cancelled (a held one decided
    "superseded") and returned; ``superseded_calls`` names every call of those messages."""

    part = "edits"

    def test_superseded_messages_leave_the_transcript_and_stay_in_the_history(
        self, harness: Harness
    ) -> None:
        _, second = two_turns(harness)
        answer_key = harness.store.transcript.load_transcript()[-1].key

        marked = supersede(harness, second)

        assert marked.keys == [second.key, answer_key]  # type: ignore[attr-defined]
        for store in (harness.store, harness.reopen()):
            assert shape(store.transcript.load_transcript()) == [
                ("user", "Hi"),
                ("assistant", "Hello"),
            ]
            history = store.edits.load_history()
            assert [(m.content, m.superseded) for m in history] == [
                ("Hi", False),
                ("Hello", False),
                ("Again", True),
                ("Hello again", True),
            ]
            assert not any(m.is_finished for m in history if m.superseded)

    def test_the_instructions_are_never_superseded(self, harness: Harness) -> None:
        first = Message(role="user", content="Hi")
        harness.store.transcript.append_message(first)
        harness.store.transcript.append_message(Message(role="system", content="Be brief."))
        harness.store.transcript.save_answer(answer(content="Hello"), usage())

        supersede(harness, first)

        assert shape(harness.reopen().transcript.load_transcript()) == [("system", "Be brief.")]

    def test_a_new_message_after_superseded_ones_is_current(self, harness: Harness) -> None:
        _, second = two_turns(harness)
        supersede(harness, second)

        harness.store.transcript.append_message(Message(role="user", content="Again, edited"))

        assert shape(harness.reopen().transcript.load_transcript())[-1] == ("user", "Again, edited")
        assert len(harness.reopen().edits.load_history()) == 5

    def test_calls_without_a_result_are_cancelled_and_never_held_again(
        self, harness: Harness
    ) -> None:
        asked = Message(role="user", content="Go")
        harness.store.transcript.append_message(asked)
        harness.store.transcript.save_answer(answer(call("c1"), call("c2"), call("c3")), usage())
        c1, c2, c3 = harness.store.transcript.load_transcript()[-1].tool_calls
        held(harness, c1, "approval")
        assert harness.store.runs.claim() is True
        harness.store.tool_calls.save_tool_result(c3, result_for(c3), ToolCallState.SUCCEEDED, None)
        harness.store.runs.release("wait")

        marked = supersede(harness, asked)

        open_calls = marked.open_calls  # type: ignore[attr-defined]
        assert sorted(c.id for c in open_calls) == ["c1", "c2"]
        calls = {c.id: c for m in harness.reopen().edits.load_history() for c in m.tool_calls}
        assert (calls["c1"].state, calls["c1"].decision) == (ToolCallState.CANCELLED, "superseded")
        assert (calls["c2"].state, calls["c2"].decision) == (ToolCallState.CANCELLED, None)
        assert calls["c3"].state == ToolCallState.SUCCEEDED
        # Nothing waits any more: no cancel applies, nothing is held for a person.
        assert harness.other().stopping.request_cancel() is False
        assert harness.other().stopping.cancel_held("cancelled") is None

    def test_superseded_calls_name_every_call_of_the_superseded_messages(
        self, harness: Harness
    ) -> None:
        asked = Message(role="user", content="Go")
        harness.store.transcript.append_message(asked)
        harness.store.transcript.save_answer(answer(call("c1"), call("c2")), usage())
        assert harness.store.edits.superseded_calls() == []

        supersede(harness, asked)

        for store in (harness.store, harness.reopen()):
            calls = store.edits.superseded_calls()
            assert sorted(c.id for c in calls) == ["c1", "c2"]
            assert None not in [c.key for c in calls]

    def test_usage_rows_of_superseded_answers_stay_in_the_ledger(self, harness: Harness) -> None:
        since = datetime.now(UTC) - timedelta(minutes=1)
        _, second = two_turns(harness)

        supersede(harness, second)

        assert harness.reopen().costs.turn_cost(since) == Decimal("0.03")

    def test_a_superseded_answer_reports_no_input_tokens(self, harness: Harness) -> None:
        _, second = two_turns(harness)
        assert harness.store.transcript.last_input_tokens() is not None

        supersede(harness, second)

        assert harness.reopen().transcript.last_input_tokens() is None


class TestFork:
    """``fork(at, result)`` makes a new chat with the configuration, the tools and copies of
    the current, finished messages through ``at``, linked to its origin, with no usage rows;
    copied calls whose result was not copied are answered with ``result`` (cancelled); a
    summary covers the same copied rows. The origin is left as it was."""

    part = "forks"

    def test_a_fork_copies_the_messages_through_at_and_no_usage(self, harness: Harness) -> None:
        harness.store.config.update_config(temperature=0.3)
        harness.store.config.set_tools([add])
        two_turns(harness)
        hello = harness.store.transcript.load_transcript()[1]

        forked = harness.forked(harness.store.forks.fork(hello, NOT_RUN))

        assert shape(forked.transcript.load_transcript()) == [
            ("user", "Hi"),
            ("assistant", "Hello"),
        ]
        assert forked.config.get_config().temperature == 0.3
        assert forked.config.get_config().model == harness.store.config.get_config().model
        assert [tool.name for tool in forked.config.get_tools()] == ["add"]
        assert forked.costs.turn_cost(datetime.now(UTC) - timedelta(days=1)) == Decimal(0)
        assert harness.fork_origin(forked) == (True, hello.key)
        assert len(harness.reopen().transcript.load_transcript()) == 4  # the origin as it was
        keys = {m.key for m in forked.transcript.load_transcript()}
        assert keys.isdisjoint({m.key for m in harness.store.transcript.load_transcript()}) or (
            harness.name == "memory"  # each in-memory chat counts its own keys
        )

    def test_superseded_and_partial_messages_are_not_copied(self, harness: Harness) -> None:
        _, second = two_turns(harness)
        supersede(harness, second)
        harness.store.transcript.append_message(Message(role="user", content="Edited"))
        harness.store.transcript.save_partial("Half an ans", None, "test")
        edited = harness.store.transcript.load_transcript()[-2]

        forked = harness.forked(harness.store.forks.fork(edited, NOT_RUN))

        assert shape(forked.transcript.load_transcript()) == [
            ("user", "Hi"),
            ("assistant", "Hello"),
            ("user", "Edited"),
        ]
        assert all(not m.superseded for m in forked.edits.load_history())

    def test_a_copied_call_without_its_result_is_answered_as_not_run(
        self, harness: Harness
    ) -> None:
        harness.store.transcript.append_message(Message(role="user", content="Go"))
        harness.store.transcript.save_answer(answer(call("c1"), call("c2")), usage())
        c1, c2 = harness.store.transcript.load_transcript()[-1].tool_calls
        assert harness.store.runs.claim() is True
        harness.store.tool_calls.save_tool_result(
            c1, result_for(c1, "3"), ToolCallState.SUCCEEDED, None
        )
        harness.store.tool_calls.save_tool_result(
            c2, result_for(c2, "4"), ToolCallState.SUCCEEDED, None
        )
        harness.store.runs.release("generate")
        first_result = harness.store.transcript.load_transcript()[2]

        forked = harness.forked(harness.store.forks.fork(first_result, NOT_RUN))

        transcript = forked.transcript.load_transcript()
        assert [(m.role, m.content, m.tool_call_id, m.is_error) for m in transcript[2:]] == [
            ("tool", "3", "c1", False),
            ("tool", NOT_RUN, "c2", True),
        ]
        states = {c.id: c.state for c in transcript[1].tool_calls}
        assert states == {"c1": ToolCallState.SUCCEEDED, "c2": ToolCallState.CANCELLED}
        assert next_move(transcript) == "generate"  # nothing left for the fork to run

    def test_a_summary_in_a_fork_covers_the_copied_rows(self, harness: Harness) -> None:
        two_turns(harness)
        hello = harness.store.transcript.load_transcript()[1]
        summary = Message(
            role="summary", content="They greeted.", provider_data={"summarizes_through": hello.key}
        )
        harness.store.transcript.save_answer(summary, usage())
        latest = harness.store.transcript.load_transcript()[-1]

        forked = harness.forked(harness.store.forks.fork(latest, NOT_RUN))

        copies = forked.transcript.load_transcript()
        assert copies[-1].provider_data["summarizes_through"] == copies[1].key
        assert copies[-1].status == MessageStatus.COMPLETE

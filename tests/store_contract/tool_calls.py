"""Contract: tool calls (run at most once, one result each), holds and people's decisions,
and the writes that release the claim with the step's last row."""

from __future__ import annotations

import pytest

from agentloop.engine import ToolTransaction
from agentloop.exceptions import ChatBusyError, ConcurrentWriteError, DecisionConflictError
from agentloop.messages import Message, ToolCall, ToolCallState
from tests.store_contract.harness import Harness, answer, call, usage

__all__ = [
    "TestDecisions",
    "TestHandoffs",
    "TestReleasingWrites",
    "TestToolCalls",
    "TestToolTransactions",
]


def result_for(c: ToolCall, content: str = "3", *, is_error: bool = False) -> Message:
    """The tool message answering ``c``."""
    return Message(
        role="tool", content=content, tool_call_id=c.id, tool_name=c.name, is_error=is_error
    )


def round_of(harness: Harness, *calls: ToolCall) -> list[ToolCall]:
    """Save an answer asking for ``calls``; the calls as a verb reads them back."""
    harness.store.transcript.append_message(Message(role="user", content="Go"))
    harness.store.transcript.save_answer(answer(*calls), usage())
    return harness.store.transcript.load_transcript()[-1].tool_calls


def calls_read(harness: Harness) -> dict[str, ToolCall]:
    """The calls of the chat, by id, as a store opened now reads them."""
    return {c.id: c for m in harness.reopen().transcript.load_transcript() for c in m.tool_calls}


def tool_messages(harness: Harness) -> list[Message]:
    return [m for m in harness.reopen().transcript.load_transcript() if m.role == "tool"]


def held(harness: Harness, c: ToolCall, reason: str, question: str | None = None) -> ToolCall:
    """``c`` held for a person by a verb (under the claim); the call as a decision reads it."""
    assert harness.store.runs.claim() is True
    harness.store.tool_calls.mark_tool_waiting(c, reason, question)
    harness.store.runs.release("wait")
    return calls_read(harness)[c.id]


class TestToolCalls:
    """``mark_tool_running`` is a conditional write from the state the call was read in:
    a second mark from the same read is refused (no tool runs twice), one from a read
    that saw it running (after a crash) takes it again; ``save_tool_result`` writes the
    result and the call's final state once (``ConcurrentWriteError`` for a second), for a
    call in any state (a refusal never ran); ``mark_tool_waiting`` holds it for a person."""

    part = "tool_calls"

    def test_a_call_is_marked_running_once_from_one_read(self, harness: Harness) -> None:
        (first,) = round_of(harness, call("c1"))
        (second,) = harness.store.transcript.load_transcript()[-1].tool_calls  # a second reader
        assert harness.store.runs.claim() is True

        assert harness.store.tool_calls.mark_tool_running(first) is True
        assert harness.store.tool_calls.mark_tool_running(second) is False

        assert calls_read(harness)["c1"].state == ToolCallState.RUNNING
        harness.store.runs.release("tools")

    def test_a_call_read_running_after_a_crash_can_be_taken_again(self, harness: Harness) -> None:
        (c1,) = round_of(harness, call("c1"))
        assert harness.store.runs.claim() is True
        assert harness.store.tool_calls.mark_tool_running(c1) is True
        harness.store.runs.release(None, failure=KeyboardInterrupt())  # the process died

        assert harness.store.runs.claim() is True
        again = harness.store.transcript.load_transcript()[-1].tool_calls[0]
        assert again.state == ToolCallState.RUNNING
        assert harness.store.tool_calls.mark_tool_running(again) is True
        harness.store.runs.release("tools")

    def test_a_result_is_written_once_with_the_calls_final_state(self, harness: Harness) -> None:
        (c1,) = round_of(harness, call("c1"))
        assert harness.store.runs.claim() is True
        assert harness.store.tool_calls.mark_tool_running(c1) is True
        result = result_for(c1)

        record = harness.store.tool_calls.save_tool_result(
            c1, result, ToolCallState.SUCCEEDED, None
        )

        assert result.key is not None
        back = harness.as_message(record)
        assert (back.role, back.content, back.tool_call_id, back.key) == (
            "tool",
            "3",
            "c1",
            result.key,
        )
        with pytest.raises(ConcurrentWriteError):
            harness.store.tool_calls.save_tool_result(
                c1, result_for(c1, "4"), ToolCallState.SUCCEEDED, None
            )
        harness.store.runs.release("generate")

        (message,) = tool_messages(harness)
        assert (message.content, message.tool_call_id, message.tool_name) == ("3", "c1", "add")
        assert not message.is_error
        assert calls_read(harness)["c1"].state == ToolCallState.SUCCEEDED
        assert harness.call_error(c1) == ""

    def test_an_error_result_keeps_its_flag_and_error(self, harness: Harness) -> None:
        (c1,) = round_of(harness, call("c1"))
        assert harness.store.runs.claim() is True
        assert harness.store.tool_calls.mark_tool_running(c1) is True

        harness.store.tool_calls.save_tool_result(
            c1, result_for(c1, "Error: bad", is_error=True), ToolCallState.FAILED, "ValueError: bad"
        )
        harness.store.runs.release("generate")

        (message,) = tool_messages(harness)
        assert message.is_error and message.content == "Error: bad"
        assert calls_read(harness)["c1"].state == ToolCallState.FAILED
        assert harness.call_error(c1) == "ValueError: bad"

    @pytest.mark.parametrize("final", [ToolCallState.FAILED, ToolCallState.CANCELLED])
    def test_a_call_that_never_ran_can_get_its_result(
        self, harness: Harness, final: ToolCallState
    ) -> None:
        """A refusal (unknown tool, a limit) or the answer to a cancelled call."""
        c1, c2 = round_of(harness, call("c1"), call("c2"))
        assert harness.store.runs.claim() is True

        harness.store.tool_calls.save_tool_result(
            c1, result_for(c1, "no", is_error=True), final, None
        )
        harness.store.runs.release("tools")

        states = calls_read(harness)
        assert (states["c1"].state, states["c2"].state) == (final, ToolCallState.PENDING)
        assert [m.tool_call_id for m in tool_messages(harness)] == ["c1"]

    @pytest.mark.parametrize(
        ("reason", "question"), [("approval", None), ("question", "Which city?")]
    )
    def test_a_held_call_waits_for_its_reason(
        self, harness: Harness, reason: str, question: str | None
    ) -> None:
        (c1,) = round_of(harness, call("c1"))

        read = held(harness, c1, reason, question)

        assert (read.state, read.wait_reason, read.question) == (
            ToolCallState.WAITING,
            reason,
            question,
        )
        assert read.decision is None


class TestDecisions:
    """``record_decision`` only while the call still waits (else ``DecisionConflictError``,
    nothing written): an approval sets the call pending for exactly its arguments (edited
    ones replace them, the model's are kept); a denial or an answer writes the result."""

    part = "tool_calls"

    def test_an_approval_lets_the_call_run_for_exactly_its_arguments(
        self, harness: Harness
    ) -> None:
        (c1,) = round_of(harness, call("c1"))
        read = held(harness, c1, "approval")

        assert (
            harness.other().tool_calls.record_decision(
                read, "approved", by=None, reason="", result=None
            )
            is None
        )

        after = calls_read(harness)["c1"]
        assert (after.state, after.decision) == (ToolCallState.PENDING, "approved")
        assert after.decision_digest == read.arguments_digest()
        assert harness.original_arguments(after) is None
        assert tool_messages(harness) == []

    def test_an_approval_with_edited_arguments_keeps_the_models(self, harness: Harness) -> None:
        (c1,) = round_of(harness, call("c1", a=1, b=2))
        read = held(harness, c1, "approval")
        read.original_arguments, read.arguments = read.arguments, {"a": 10, "b": 20}

        harness.other().tool_calls.record_decision(
            read, "approved", by=None, reason="", result=None
        )

        after = calls_read(harness)["c1"]
        assert after.arguments == {"a": 10, "b": 20}
        assert after.decision_digest == after.arguments_digest()
        assert harness.original_arguments(after) == {"a": 1, "b": 2}

    @pytest.mark.parametrize(
        ("reason", "decision", "is_error", "state"),
        [
            ("approval", "denied", True, ToolCallState.FAILED),
            ("question", "answered", False, ToolCallState.SUCCEEDED),
        ],
    )
    def test_a_denial_or_an_answer_writes_the_result(
        self, harness: Harness, reason: str, decision: str, is_error: bool, state: ToolCallState
    ) -> None:
        (c1,) = round_of(harness, call("c1"))
        read = held(harness, c1, reason, "Why?" if reason == "question" else None)
        result = result_for(read, "Paris" if not is_error else "Denied.", is_error=is_error)

        record = harness.other().tool_calls.record_decision(
            read, decision, by=None, reason="r", result=result
        )

        back = harness.as_message(record)
        assert (back.role, back.tool_call_id, back.is_error) == ("tool", "c1", is_error)
        after = calls_read(harness)["c1"]
        assert (after.state, after.decision) == (state, decision)
        assert [m.content for m in tool_messages(harness)] == [result.content]

    @pytest.mark.parametrize("first", ["approved", "denied"])
    def test_a_second_decision_conflicts_and_writes_nothing(
        self, harness: Harness, first: str
    ) -> None:
        (c1,) = round_of(harness, call("c1"))
        read = held(harness, c1, "approval")
        first_result = result_for(read, "Denied.", is_error=True) if first == "denied" else None
        harness.other().tool_calls.record_decision(
            read, first, by=None, reason="", result=first_result
        )
        before = harness.reopen().transcript.load_transcript()

        for decision, result in (
            ("approved", None),
            ("denied", result_for(read, "No", is_error=True)),
        ):
            with pytest.raises(DecisionConflictError):
                harness.other().tool_calls.record_decision(
                    read, decision, by=None, reason="", result=result
                )

        assert harness.reopen().transcript.load_transcript() == before

    def test_a_call_that_does_not_wait_cannot_be_decided(self, harness: Harness) -> None:
        (c1,) = round_of(harness, call("c1"))

        with pytest.raises(DecisionConflictError):
            harness.other().tool_calls.record_decision(
                c1, "approved", by=None, reason="", result=None
            )

        assert calls_read(harness)["c1"].decision is None


class TestReleasingWrites:
    """``save_answer``/``save_tool_result`` with ``release`` (the next move) give the claim
    up in the same write: the next writer can take the chat at once, and the verb's own
    ``release`` afterwards is a no-op."""

    part = "tool_calls"

    @pytest.mark.parametrize("move", ["done", "tools"])
    def test_save_answer_with_release_frees_the_chat(self, harness: Harness, move: str) -> None:
        harness.store.transcript.append_message(Message(role="user", content="Hi"))
        assert harness.store.runs.claim() is True
        calls = [call("c1")] if move == "tools" else []

        harness.store.transcript.save_answer(answer(*calls, content="Hello"), usage(), release=move)

        try:
            taken = harness.rival(lambda store: (store.runs.claim(), store.runs.release("done"))[0])
        except ChatBusyError:
            pytest.fail("the answer's release= left the chat claimed")
        finally:
            harness.store.runs.release(move)  # the verb's end: a no-op when already released
        assert taken is True

    def test_save_tool_result_with_release_frees_the_chat(self, harness: Harness) -> None:
        (c1,) = round_of(harness, call("c1"))
        assert harness.store.runs.claim() is True
        assert harness.store.tool_calls.mark_tool_running(c1) is True

        harness.store.tool_calls.save_tool_result(
            c1, result_for(c1), ToolCallState.SUCCEEDED, None, release="generate"
        )

        try:
            taken = harness.rival(lambda store: (store.runs.claim(), store.runs.release("done"))[0])
        except ChatBusyError:
            pytest.fail("the result's release= left the chat claimed")
        finally:
            harness.store.runs.release("generate")
        assert taken is True
        assert calls_read(harness)["c1"].state == ToolCallState.SUCCEEDED


HANDOFF = {"from": "myapp.Triage", "to": "myapp.Billing", "inputs": {"customer": "Ada"}}


class TestHandoffs:
    """``record_handoff`` keeps on a call the handoff it made, read back with the transcript;
    ``atomic`` commits the writes made inside together or not at all, and a store that
    rolled back reads as it was (its configuration, instructions and calls)."""

    part = "handoffs"

    def test_a_handoff_is_kept_on_its_call(self, harness: Harness) -> None:
        (c1, c2) = round_of(harness, call("c1"), call("c2"))
        assert harness.store.runs.claim() is True

        harness.store.handoffs.record_handoff(c1, HANDOFF)
        harness.store.runs.release("tools")

        read = calls_read(harness)
        assert (read["c1"].handoff, read["c2"].handoff) == (HANDOFF, None)

    def test_writes_inside_atomic_that_fails_are_all_undone(self, harness: Harness) -> None:
        harness.store.transcript.replace_instructions("You are TRIAGE.")
        (c1,) = round_of(harness, call("c1"))
        assert harness.store.runs.claim() is True
        before = harness.store.config.get_config()

        with pytest.raises(RuntimeError), harness.store.atomic():
            harness.store.config.update_config(temperature=0.5, model="offline:billing")
            harness.store.transcript.replace_instructions("You are BILLING.")
            harness.store.handoffs.record_handoff(c1, HANDOFF)
            raise RuntimeError("halfway")

        for store in (harness.store, harness.reopen()):
            assert store.config.get_config() == before
            transcript = store.transcript.load_transcript()
            assert [m.content for m in transcript if m.role == "system"] == ["You are TRIAGE."]
            assert transcript[-1].tool_calls[0].handoff is None
        with harness.store.atomic():
            harness.store.handoffs.record_handoff(c1, HANDOFF)  # and one that goes through stays
        harness.store.runs.release("tools")
        assert calls_read(harness)["c1"].handoff == HANDOFF


class TestToolTransactions:
    """``store.transactions.run_in_transaction`` keeps what its work wrote only if the work
    ends well, and the savepoint drops only what was written inside it (a store without the
    part, the in-memory one, runs transactional tools as any other: tests/test_store_parts.py).
    """

    part = "transactions"

    def test_what_a_failed_run_wrote_is_not_kept(self, harness: Harness) -> None:
        (c1,) = round_of(harness, call("c1"))
        assert harness.store.runs.claim() is True
        assert harness.store.tool_calls.mark_tool_running(c1) is True

        def work(run: ToolTransaction) -> None:
            harness.store.tool_calls.save_tool_result(
                c1, result_for(c1), ToolCallState.SUCCEEDED, None
            )
            raise RuntimeError("the process failed before the commit")

        with pytest.raises(RuntimeError):
            harness.store.transactions.run_in_transaction(c1, work)
        harness.store.runs.release("tools")

        assert [m.tool_call_id for m in tool_messages(harness)] == []
        assert calls_read(harness)["c1"].state == ToolCallState.RUNNING

    def test_a_savepoint_drops_only_what_was_written_inside_it(self, harness: Harness) -> None:
        c1, c2 = round_of(harness, call("c1"), call("c2"))
        assert harness.store.runs.claim() is True

        def work(run: ToolTransaction) -> str:
            with pytest.raises(RuntimeError), run.savepoint():
                harness.store.tool_calls.save_tool_result(
                    c1, result_for(c1), ToolCallState.SUCCEEDED, None
                )
                raise RuntimeError("the tool failed")
            harness.store.tool_calls.save_tool_result(
                c2, result_for(c2), ToolCallState.SUCCEEDED, None
            )
            return "done"

        assert harness.store.transactions.run_in_transaction(c2, work) == (
            "done",
            "",
        )  # it committed
        harness.store.runs.release("generate")

        assert [m.tool_call_id for m in tool_messages(harness)] == ["c2"]

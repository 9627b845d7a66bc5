"""Contract: cancels (the flag, what a cancel cut short, calls held with no run) and halts."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest

from agentloop.exceptions import DecisionConflictError
from agentloop.messages import Message, MessageStatus, ToolCallState
from tests.store_contract.harness import Harness, answer, call, usage
from tests.store_contract.tool_calls import calls_read, held, result_for, round_of, tool_messages

__all__ = ["TestCancel", "TestCancelHeld", "TestHalt"]


class TestCancel:
    """``request_cancel`` sets the flag only while a run holds the chat (or a person holds
    a call), keeping the first request's time; ``cancel_requested_at`` reads it; a user
    message never inherits it; ``record_cancellation`` clears it (if still the one read),
    keeps the cut-short answer marked cancelled, counts the attempt, and cancels the calls
    left unanswered (a held one as the decision "cancelled"; a result written first stands)."""

    part = "stopping"

    def test_no_run_no_cancel(self, harness: Harness) -> None:
        harness.store.transcript.append_message(Message(role="user", content="Hi"))

        assert harness.other().stopping.request_cancel() is False
        assert harness.store.stopping.cancel_requested_at() is None

    def test_a_cancel_while_a_run_holds_the_chat_keeps_the_first_time(
        self, harness: Harness
    ) -> None:
        assert harness.store.runs.claim() is True
        assert harness.other().stopping.request_cancel() is True
        first = harness.store.stopping.cancel_requested_at()
        assert first is not None

        assert harness.other().stopping.request_cancel() is True
        assert harness.store.stopping.cancel_requested_at() == first
        harness.store.runs.release("wait")

    def test_a_call_held_for_a_person_can_be_cancelled_with_no_run(self, harness: Harness) -> None:
        (c1,) = round_of(harness, call("c1"))
        held(harness, c1, "approval")

        assert harness.other().stopping.request_cancel() is True
        assert harness.store.stopping.cancel_requested_at() is not None

    def test_a_user_message_never_inherits_a_cancel(self, harness: Harness) -> None:
        assert harness.store.runs.claim() is True
        assert harness.other().stopping.request_cancel() is True
        harness.store.runs.release("wait")  # the flag stays for the next run

        assert harness.store.runs.claim() is True
        harness.store.transcript.append_message(Message(role="user", content="Something else"))
        assert harness.store.stopping.cancel_requested_at() is None
        harness.store.runs.release("generate")

    def test_record_cancellation_settles_what_the_cancel_cut_short(self, harness: Harness) -> None:
        pending, waiting, answered = round_of(harness, call("c1"), call("c2"), call("c3"))
        assert harness.store.runs.claim() is True
        harness.store.tool_calls.mark_tool_waiting(waiting, "approval")
        harness.store.tool_calls.save_tool_result(
            answered, result_for(answered), ToolCallState.SUCCEEDED, None
        )
        key = harness.store.transcript.save_partial("Hal", None, "test")
        assert harness.other().stopping.request_cancel() is True
        since = harness.store.transcript.turn_started_at(
            harness.store.transcript.load_transcript()[0]
        )
        requested_at = harness.store.stopping.cancel_requested_at()

        harness.store.stopping.record_cancellation(
            requested_at,
            partial=Message(role="assistant", content="Half", model="test"),
            partial_key=key,
            usage=usage("0.5", status="cancelled"),
            unanswered=[pending, waiting, answered],
        )
        harness.store.runs.release(None)

        assert harness.store.stopping.cancel_requested_at() is None
        transcript = harness.reopen().transcript.load_transcript()
        cut = transcript[-1]
        assert (cut.key, cut.content, cut.status) == (key, "Half", MessageStatus.CANCELLED)
        states = calls_read(harness)
        assert states["c1"].state == ToolCallState.CANCELLED
        assert (states["c2"].state, states["c2"].decision) == (ToolCallState.CANCELLED, "cancelled")
        assert states["c3"].state == ToolCallState.SUCCEEDED
        assert since is not None and harness.store.costs.turn_cost(since) == Decimal("0.5")

    def test_a_cut_short_answer_with_no_partial_row_is_kept_cancelled(
        self, harness: Harness
    ) -> None:
        harness.store.transcript.append_message(Message(role="user", content="Hi"))
        assert harness.store.runs.claim() is True

        harness.store.stopping.record_cancellation(
            None,
            partial=Message(role="assistant", content="Hal", model="test"),
            partial_key=None,
            usage=None,
            unanswered=[],
        )
        harness.store.runs.release(None)

        last = harness.reopen().transcript.load_transcript()[-1]
        assert (last.role, last.content, last.status) == (
            "assistant",
            "Hal",
            MessageStatus.CANCELLED,
        )

    def test_an_earlier_attempts_partial_is_marked_cancelled_without_new_text(
        self, harness: Harness
    ) -> None:
        """A retried call cut short before streaming anything: ``partial`` None, the key of
        the partial row the failed attempt left (``model_calls._send``)."""
        harness.store.transcript.append_message(Message(role="user", content="Hi"))
        assert harness.store.runs.claim() is True
        key = harness.store.transcript.save_partial("Half", None, "test")

        harness.store.stopping.record_cancellation(
            None, partial=None, partial_key=key, usage=None, unanswered=[]
        )
        harness.store.runs.release(None)

        last = harness.reopen().transcript.load_transcript()[-1]
        assert (last.key, last.content, last.status) == (key, "Half", MessageStatus.CANCELLED)

    def test_a_cancel_requested_after_the_one_read_stays_for_the_next_run(
        self, harness: Harness
    ) -> None:
        assert harness.store.runs.claim() is True
        assert harness.other().stopping.request_cancel() is True
        flag = harness.store.stopping.cancel_requested_at()
        assert flag is not None

        harness.store.stopping.record_cancellation(
            flag - timedelta(seconds=1), partial=None, partial_key=None, usage=None, unanswered=[]
        )
        harness.store.runs.release(None)

        assert harness.reopen().stopping.cancel_requested_at() == flag


class TestCancelHeld:
    """``cancel_held`` with no run: each held-for-a-person or not-started call of the round
    gets the error result (in call order) and the state cancelled, a held one the decision
    "cancelled" too (a later decision conflicts); calls held for a subagent are left; the
    flag is cleared. None, with nothing done, while a run holds the chat or nothing is held."""

    part = "stopping"

    def test_held_calls_are_answered_as_cancelled(self, harness: Harness) -> None:
        c1, c2, c3 = round_of(harness, call("c1"), call("c2"), call("c3"))
        assert harness.store.runs.claim() is True
        harness.store.tool_calls.mark_tool_waiting(c1, "approval")
        harness.store.tool_calls.mark_tool_waiting(c3, "subagent")
        harness.store.runs.release("wait")
        read = calls_read(harness)["c1"]
        assert harness.other().stopping.request_cancel() is True

        records = harness.other().stopping.cancel_held("Cancelled.")

        assert records is not None
        assert [
            (m.role, m.content, m.tool_call_id, m.is_error)
            for m in map(harness.as_message, records)
        ] == [("tool", "Cancelled.", "c1", True), ("tool", "Cancelled.", "c2", True)]
        states = calls_read(harness)
        assert (states["c1"].state, states["c1"].decision) == (ToolCallState.CANCELLED, "cancelled")
        assert states["c2"].state == ToolCallState.CANCELLED
        assert (states["c3"].state, states["c3"].wait_reason) == (ToolCallState.WAITING, "subagent")
        assert harness.reopen().stopping.cancel_requested_at() is None
        with pytest.raises(DecisionConflictError):
            harness.other().tool_calls.record_decision(
                read, "approved", by=None, reason="", result=None
            )

    def test_nothing_is_done_while_a_run_holds_the_chat(self, harness: Harness) -> None:
        (c1,) = round_of(harness, call("c1"))
        held(harness, c1, "approval")
        assert harness.store.runs.claim() is True
        before = harness.reopen().transcript.load_transcript()

        assert harness.rival(lambda store: store.stopping.cancel_held("Cancelled.")) is None

        assert harness.reopen().transcript.load_transcript() == before
        harness.store.runs.release("wait")

    def test_nothing_is_done_when_no_call_is_held(self, harness: Harness) -> None:
        harness.store.transcript.append_message(Message(role="user", content="Hi"))
        harness.store.transcript.save_answer(answer(content="Hello"), usage())

        assert harness.other().stopping.cancel_held("Cancelled.") is None
        assert tool_messages(harness) == []


class TestHalt:
    """``request_halt`` only while a run holds the chat (False, nothing set, otherwise);
    ``halt_requested`` gives its reason, to the run too once it reads the chat (a
    checkpoint); ``record_stop`` and a new user message clear it."""

    part = "stopping"

    def test_no_run_no_halt(self, harness: Harness) -> None:
        assert harness.other().stopping.request_halt("enough") is False
        assert harness.store.stopping.halt_requested() == ""

    def test_a_halt_from_the_run_itself(self, harness: Harness) -> None:
        assert harness.store.runs.claim() is True

        assert harness.store.stopping.request_halt("enough") is True

        assert harness.store.stopping.halt_requested() == "enough"
        harness.store.stopping.record_stop("halted: enough")
        assert harness.store.stopping.halt_requested() == ""
        harness.store.runs.release("done")

    def test_a_halt_from_elsewhere_reaches_the_run_at_its_checkpoint(
        self, harness: Harness
    ) -> None:
        assert harness.store.runs.claim() is True

        assert harness.other().stopping.request_halt("from afar") is True

        harness.store.stopping.cancel_requested_at()  # the run's checkpoint
        assert harness.store.stopping.halt_requested() == "from afar"
        harness.store.stopping.record_stop("halted: from afar")
        assert harness.store.stopping.halt_requested() == ""
        harness.store.runs.release("done")
        assert harness.reopen().stopping.halt_requested() == ""

    def test_a_user_message_clears_a_pending_halt(self, harness: Harness) -> None:
        assert harness.store.runs.claim() is True
        assert harness.store.stopping.request_halt("enough") is True

        harness.store.transcript.append_message(Message(role="user", content="Go on"))

        assert harness.store.stopping.halt_requested() == ""
        harness.store.runs.release("generate")

"""Contract: the inbox of queued messages, usage and cost, tracing context, and the
waiting/thread hooks."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from agentloop.messages import Message
from tests.store_contract.harness import Harness, answer, usage

__all__ = ["TestHooks", "TestInbox", "TestTracing", "TestUsage"]


class TestInbox:
    """``queue_message`` keeps user messages sent while a run holds the chat; the next claim
    sees them (``has_queued``); ``take_queued`` gives them oldest first, once."""

    part = "inbox"

    def test_an_empty_inbox(self, harness: Harness) -> None:
        assert harness.store.inbox.has_queued() is False
        assert harness.store.inbox.take_queued() == []

    def test_messages_queued_meanwhile_are_taken_once_in_order(self, harness: Harness) -> None:
        assert harness.store.runs.claim() is True
        for text in ("first", "second", "third"):
            harness.other().inbox.queue_message(Message(role="user", content=text))
        harness.store.runs.release("done")

        assert harness.store.runs.claim() is True
        assert harness.store.inbox.has_queued() is True
        taken = harness.store.inbox.take_queued()
        assert [(m.role, m.content) for m in taken] == [
            ("user", "first"),
            ("user", "second"),
            ("user", "third"),
        ]
        assert harness.store.inbox.has_queued() is False
        assert harness.store.inbox.take_queued() == []
        harness.store.runs.release("done")

        assert harness.store.runs.claim() is True  # a later verb finds nothing left either
        assert harness.store.inbox.has_queued() is False
        assert harness.store.inbox.take_queued() == []
        harness.store.runs.release("done")


class TestUsage:
    """Every usage row (an answer's, a failed or cancelled attempt's) counts in
    ``turn_cost(since)`` (unknown costs as nothing); ``last_input_tokens`` is the latest
    assistant answer that reported its input tokens (not a failure's, not a summary's)."""

    part = "costs"

    def test_turn_cost_sums_the_rows_since(self, harness: Harness) -> None:
        since = datetime.now(UTC) - timedelta(seconds=1)
        harness.store.transcript.append_message(Message(role="user", content="Hi"))
        harness.store.transcript.record_usage(usage("0.5", status="failed"))
        harness.store.transcript.save_answer(answer(content="Hello"), usage("0.25"))
        harness.store.transcript.record_usage(usage(None, status="failed"))

        assert harness.store.costs.turn_cost(since) == Decimal("0.75")
        assert harness.reopen().costs.turn_cost(since) == Decimal("0.75")
        assert harness.store.costs.turn_cost(datetime.now(UTC) + timedelta(hours=1)) == Decimal(0)

    def test_a_chat_with_no_rows_costs_nothing(self, harness: Harness) -> None:
        assert harness.store.costs.turn_cost(datetime.now(UTC) - timedelta(days=1)) == Decimal(0)

    def test_last_input_tokens_follows_the_latest_reported_answer(self, harness: Harness) -> None:
        store = harness.store
        assert store.transcript.last_input_tokens() is None
        store.transcript.append_message(Message(role="user", content="Hi"))
        first = answer(content="one")
        store.transcript.save_answer(first, usage(input_tokens=100))
        assert store.transcript.last_input_tokens() == (first.key, 100)

        store.transcript.save_answer(answer(content="unreported"), usage(input_tokens=0))
        store.transcript.record_usage(usage(input_tokens=999, status="failed"))
        store.transcript.save_answer(
            Message(role="summary", content="sum"), usage(input_tokens=500)
        )
        assert store.transcript.last_input_tokens() == (first.key, 100)

        latest = answer(content="two")
        store.transcript.save_answer(latest, usage(input_tokens=150))
        assert store.transcript.last_input_tokens() == (latest.key, 150)


class TestTracing:
    """``trace_names`` names the chat (stable) and its agent ("" for none);
    ``set_trace_context`` replaces the turn's context and ``trace_context`` gives it back,
    to every later store of the chat."""

    part = "tracing"

    def test_trace_names_are_stable(self, harness: Harness) -> None:
        chat_id, agent = harness.store.tracing.trace_names()

        assert chat_id and isinstance(chat_id, str)
        assert agent == ""
        assert harness.store.tracing.trace_names() == (chat_id, agent)

    def test_the_trace_context_round_trips_and_is_replaced(self, harness: Harness) -> None:
        assert harness.store.tracing.trace_context() == {}
        first = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
        harness.store.tracing.set_trace_context(first)
        assert harness.store.tracing.trace_context() == first

        second = {"traceparent": "00-" + "3" * 32 + "-" + "4" * 16 + "-01", "tracestate": "k=v"}
        harness.store.tracing.set_trace_context(second)
        assert harness.store.tracing.trace_context() == second
        assert harness.reopen().tracing.trace_context() == second


class TestHooks:
    """``before_wait`` may give a connection back (the next statement takes one again);
    ``wrap_thread`` and ``run_phase`` run what they are given and return its value."""

    def test_the_store_works_after_before_wait(self, harness: Harness) -> None:
        harness.store.transcript.append_message(Message(role="user", content="Hi"))
        assert harness.store.runs.claim() is True

        harness.store.before_wait()

        harness.store.transcript.save_answer(answer(content="Hello"), usage())
        harness.store.runs.release("done")
        assert [m.content for m in harness.store.transcript.load_transcript()] == ["Hi", "Hello"]

    def test_wrap_thread_and_run_phase_return_the_functions_value(self, harness: Harness) -> None:
        got: list[int] = []
        wrapped = harness.store.wrap_thread(lambda: got.append(42) or 42)
        thread = threading.Thread(target=lambda: got.append(wrapped()))  # a tool's thread
        thread.start()
        thread.join(30)
        assert got == [42, 42]
        assert asyncio.run(harness.store.run_phase(lambda a, b: a + b, 2, 3)) == 5

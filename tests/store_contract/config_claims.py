"""Contract: configuration, and the claim (one writer at a time)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from agentloop.engine._chat_config import ChatConfig, Compaction, Limits, ToolOptions
from agentloop.exceptions import ChatBusyError
from agentloop.messages import Caching, Thinking
from tests.store_contract.harness import Harness
from tests.tools import Weather, add, refuse

__all__ = ["TestClaim", "TestConfig"]


class TestConfig:
    """``get_config``/``update_config`` keep every ``ChatConfig`` field the engine reads
    (model, limits, tool options...) as the models it gave; ``set_tools``/``get_tools``
    give back the same Tool classes; a persisted chat keeps both for a store opened later."""

    part = "config"

    def test_a_new_chat_has_the_default_config_but_its_model(self, harness: Harness) -> None:
        config = harness.store.config.get_config()
        assert config == ChatConfig(model="scripted:test")
        assert harness.store.config.get_tools() == []

    def test_update_config_round_trips_every_field_the_engine_reads(self, harness: Harness) -> None:
        changes = {
            "model": "scripted:other",
            "provider": "scripted",
            "temperature": 0.25,
            "max_output_tokens": 321,
            "limits": Limits(max_model_calls=3, max_tool_calls=7, max_cost=Decimal("0.5")),
            "tool_options": ToolOptions(choice="required", calls="one", concurrency=2),
            "provider_options": {"top_p": 0.9},
            "headers": {"X-Test": "yes"},
            "output_schema": {"type": "object", "properties": {"n": {"type": "integer"}}},
            "caching": Caching(ttl="1h", key="k"),
            "thinking": Thinking(effort="low"),
            "context_window": 4096,
            "compaction": Compaction(at=0.5, keep_recent=3),
            "fallbacks": ["scripted:backup"],
        }
        for field, value in changes.items():
            harness.store.config.update_config(**{field: value})

        for store in (harness.store, harness.reopen()):
            config = store.config.get_config()
            assert {field: getattr(config, field) for field in changes} == changes
            assert isinstance(config.limits, Limits) and isinstance(
                config.tool_options, ToolOptions
            )

    def test_update_config_changes_only_the_fields_given(self, harness: Harness) -> None:
        harness.store.config.update_config(temperature=0.5, limits=Limits(max_model_calls=2))
        harness.store.config.update_config(temperature=None)

        config = harness.reopen().config.get_config()
        assert config.temperature is None
        assert config.limits == Limits(max_model_calls=2)
        assert config.model == "scripted:test"

    def test_set_tools_keeps_the_tool_classes_in_order(self, harness: Harness) -> None:
        harness.store.config.set_tools([Weather, add])
        assert harness.store.config.get_tools() == [Weather, add]
        assert harness.reopen().config.get_tools() == [Weather, add]

        harness.store.config.set_tools([refuse])
        assert harness.store.config.get_tools() == [refuse]
        assert [tool.name for tool in harness.reopen().config.get_tools()] == [refuse.name]


class TestClaim:
    """One writer: ``claim`` takes the chat (True) or finds this store already holds it
    (False, a verb inside a verb: the outer one releases); another writer gets
    ``ChatBusyError`` until ``release``, whatever the next move or failure; ``release``
    without the claim is a no-op."""

    part = "runs"

    def test_a_second_writer_is_refused_while_the_claim_is_held(self, harness: Harness) -> None:
        assert harness.store.runs.claim() is True

        with pytest.raises(ChatBusyError):
            harness.rival(lambda store: store.runs.claim())

        harness.store.runs.release("done")
        assert (
            harness.rival(lambda store: (store.runs.claim(), store.runs.release("done"))[0]) is True
        )

    def test_a_claim_inside_a_claim_is_the_outer_verbs(self, harness: Harness) -> None:
        assert harness.store.runs.claim() is True
        assert harness.store.runs.claim() is False  # nested: it must not release

        with pytest.raises(ChatBusyError):
            harness.rival(lambda store: store.runs.claim())
        harness.store.runs.release("done")  # the outer verb's release frees it
        assert (
            harness.rival(lambda store: (store.runs.claim(), store.runs.release("done"))[0]) is True
        )
        assert harness.store.runs.claim() is True  # and a later verb takes it afresh
        harness.store.runs.release("done")

    @pytest.mark.parametrize("next_move", ["done", "wait", "tools", "generate", None])
    def test_release_with_each_next_move_frees_the_chat(
        self, harness: Harness, next_move: str | None
    ) -> None:
        assert harness.store.runs.claim() is True
        harness.store.runs.release(next_move)

        assert (
            harness.rival(lambda store: (store.runs.claim(), store.runs.release("done"))[0]) is True
        )
        assert harness.store.runs.claim() is True
        harness.store.runs.release("done")

    def test_release_without_the_claim_is_a_no_op(self, harness: Harness) -> None:
        harness.store.runs.release("done")
        harness.store.runs.release(None, failure=RuntimeError("never held"))

        assert harness.store.runs.claim() is True
        harness.store.runs.release("done")

    @pytest.mark.parametrize("next_move", ["wait", "tools", "generate"])
    def test_a_cancel_survives_a_release_that_goes_on(
        self, harness: Harness, next_move: str
    ) -> None:
        assert harness.store.runs.claim() is True
        assert harness.other().stopping.request_cancel() is True
        harness.store.runs.release(next_move)

        assert harness.store.stopping.cancel_requested_at() is not None

    def test_a_release_as_done_drops_a_cancel_that_came_as_the_turn_finished(
        self, harness: Harness
    ) -> None:
        assert harness.store.runs.claim() is True
        assert harness.other().stopping.request_cancel() is True
        harness.store.runs.release("done")

        assert harness.store.stopping.cancel_requested_at() is None
        assert harness.reopen().stopping.cancel_requested_at() is None

    def test_a_failure_frees_the_chat_keeps_the_cancel_flag_and_records_one_line(
        self, harness: Harness
    ) -> None:
        assert harness.store.runs.claim() is True
        assert harness.other().stopping.request_cancel() is True
        harness.store.runs.release(None, failure=RuntimeError("boom\n  at a second line"))

        # The chat no longer runs: free for the next writer, nothing left to cancel.
        assert harness.store.stopping.cancel_requested_at() is not None
        assert harness.other().stopping.request_cancel() is False
        error = harness.failure_error()
        assert error in (None, "RuntimeError: boom")  # None: a store with no chat state
        assert (
            harness.rival(lambda store: (store.runs.claim(), store.runs.release("done"))[0]) is True
        )

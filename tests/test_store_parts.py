"""A store's optional parts (issue 25): a store leaves out the message queue, the turn's cost,
the trace context, superseding messages or forking chats by setting the part's flag False,
and the engine does without it or refuses, clearly and before writing anything, what needs
it; a flag left on without its methods fails when the store class is defined."""

from __future__ import annotations

import threading

import pytest

from agentloop.engine import Conversation, MemoryStore
from agentloop.engine.store import OPTIONAL_PARTS, ChatStore
from agentloop.exceptions import ChatBusyError, ConfigurationError


class LeanStore(MemoryStore):
    """The in-memory store with every optional part left out (the base's methods back)."""

    queues_messages = False
    sums_costs = False
    keeps_trace_context = False
    queue_message = ChatStore.queue_message
    has_queued = ChatStore.has_queued
    take_queued = ChatStore.take_queued
    turn_cost = ChatStore.turn_cost
    trace_context = ChatStore.trace_context
    set_trace_context = ChatStore.set_trace_context
    supersedes_messages = False
    forks_chats = False
    supersede = ChatStore.supersede
    superseded_calls = ChatStore.superseded_calls
    load_history = ChatStore.load_history
    fork = ChatStore.fork


@pytest.fixture
def lean(scripted) -> Conversation:
    conversation: Conversation = Conversation(LeanStore())
    return conversation.with_model("scripted:test")


def test_a_chat_over_a_store_without_the_optional_parts_answers(lean, scripted):
    scripted.add("Hello.")

    answer = lean.ask("Hi")

    assert answer.content == "Hello."
    assert [m.role for m in lean.messages] == ["user", "assistant"]


def test_max_cost_is_refused_where_the_store_sums_no_costs(lean):
    with pytest.raises(ConfigurationError, match="sums_costs is False"):
        lean.with_limits(max_cost="0.50")

    assert lean.store.get_config().limits.max_cost is None
    lean.with_limits(max_model_calls=3)  # the other limits need no part
    assert lean.store.get_config().limits.max_model_calls == 3


def test_queueing_is_refused_where_the_store_keeps_no_queue(lean):
    with pytest.raises(ConfigurationError, match="queues_messages is False"):
        lean.ask_later("Later", if_busy="queue")
    with pytest.raises(ConfigurationError, match="queues_messages is False"):
        lean.ask_later("Later", if_busy="interrupt")

    assert lean.messages == []


def test_editing_and_forking_are_refused_where_the_store_leaves_them_out(lean, scripted):
    scripted.add("Hello.")
    lean.ask("Hi")
    (user, _) = lean.messages

    with pytest.raises(ConfigurationError, match="supersedes_messages is False"):
        lean.regenerate()
    with pytest.raises(ConfigurationError, match="supersedes_messages is False"):
        lean.edit_later(user, "Hi again")
    with pytest.raises(ConfigurationError, match="forks_chats is False"):
        lean.fork()

    assert [m.content for m in lean.messages] == ["Hi", "Hello."]  # nothing written
    assert lean.store.superseded_calls() == []


class _HeldElsewhere:
    """Another thread holds the chat's claim (runs a verb) while the block runs."""

    def __init__(self, store: ChatStore) -> None:
        self.store = store
        self.held = threading.Event()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._hold)

    def _hold(self) -> None:
        self.store.claim()
        self.held.set()
        self.done.wait(10)
        self.store.release(None)

    def __enter__(self) -> None:
        self.thread.start()
        self.held.wait(10)

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()


def test_the_projects_queue_default_falls_back_to_reject_on_such_a_store(lean, settings):
    settings.AGENTLOOP = {**getattr(settings, "AGENTLOOP", {}), "IF_BUSY": "queue"}
    full: Conversation = Conversation(MemoryStore()).with_model("scripted:test")

    with _HeldElsewhere(full.store):
        full.ask_later("While busy")  # the default applies: kept for the run that holds it
    with _HeldElsewhere(lean.store), pytest.raises(ChatBusyError):
        lean.ask_later("While busy")

    assert full.store.has_queued()
    assert lean.messages == []  # refused, not half-kept


def test_a_part_whose_flag_is_on_must_be_written():
    with pytest.raises(TypeError, match="queues_messages = True but doesn't define"):

        class Forgetful(MemoryStore):
            queue_message = ChatStore.queue_message


def test_each_optional_part_names_methods_the_interface_has():
    for flag, methods in OPTIONAL_PARTS.items():
        assert isinstance(getattr(ChatStore, flag), bool), flag
        for name in methods:
            assert callable(getattr(ChatStore, name)), name
            assert name not in ChatStore.__abstractmethods__, name

"""A store's optional parts (issue 25, issue 39): a store leaves out the message queue, the
turn's cost, the trace context, handoffs, superseding messages or forking chats by leaving
the part None (``store.inbox is None``...), and the engine does without it or refuses,
clearly and before writing anything, what needs it."""

from __future__ import annotations

import threading

import pytest

from agentloop.engine import Conversation, MemoryStore
from agentloop.engine.store import OPTIONAL_PARTS, ChatStore
from agentloop.exceptions import ChatBusyError, ConfigurationError


class LeanStore(MemoryStore):
    """The in-memory store with every optional part left out."""

    def __init__(self) -> None:
        super().__init__()
        self.inbox = self.costs = self.tracing = self.handoffs = None
        self.edits = self.forks = None


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
    with pytest.raises(ConfigurationError, match=r"store.costs is None"):
        lean.with_limits(max_cost="0.50")

    assert lean.store.config.get_config().limits.max_cost is None
    lean.with_limits(max_model_calls=3)  # the other limits need no part
    assert lean.store.config.get_config().limits.max_model_calls == 3


def test_queueing_is_refused_where_the_store_keeps_no_queue(lean):
    with pytest.raises(ConfigurationError, match=r"store.inbox is None"):
        lean.ask_later("Later", if_busy="queue")
    with pytest.raises(ConfigurationError, match=r"store.inbox is None"):
        lean.ask_later("Later", if_busy="interrupt")

    assert lean.messages == []


def test_editing_and_forking_are_refused_where_the_store_leaves_them_out(lean, scripted):
    scripted.add("Hello.")
    lean.ask("Hi")
    (user, _) = lean.messages

    with pytest.raises(ConfigurationError, match=r"store.edits is None"):
        lean.regenerate()
    with pytest.raises(ConfigurationError, match=r"store.edits is None"):
        lean.edit_later(user, "Hi again")
    with pytest.raises(ConfigurationError, match=r"store.forks is None"):
        lean.fork()

    assert [m.content for m in lean.messages] == ["Hi", "Hello."]  # nothing written
    assert not any(message.superseded for message in lean.store.messages)


class _HeldElsewhere:
    """Another thread holds the chat's claim (runs a verb) while the block runs."""

    def __init__(self, store: ChatStore) -> None:
        self.store = store
        self.held = threading.Event()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._hold)

    def _hold(self) -> None:
        self.store.runs.claim()
        self.held.set()
        self.done.wait(10)
        self.store.runs.release(None)

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

    assert full.store.inbox.has_queued()
    assert lean.messages == []  # refused, not half-kept


def test_each_optional_part_is_none_on_the_core_and_an_interface():
    for name, interface in OPTIONAL_PARTS.items():
        assert getattr(ChatStore, name) is None, name
        assert interface.__abstractmethods__, name  # an interface a store implements

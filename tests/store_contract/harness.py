"""The two stores behind one face, for the contract suite (tests/test_store_contract.py).

A :class:`Harness` holds one chat's store and the few things the suite needs that the
``ChatStore`` interface itself doesn't give: the chat seen by another writer (another
thread for the in-memory store, whose claim is per thread; another ``DjangoStore`` over the
same row, as another process would load it, for the Django store), a store reopened over
the same chat, and a store record read back as a ``Message``. Everything the tests assert
goes through the interface or these adapters, never through a store's attributes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from decimal import Decimal
from typing import Any, TypeVar

from agentloop.engine import ChatConfig, ChatStore, UsageRecord
from agentloop.engine.in_memory_store import MemoryStore
from agentloop.messages import Message, MessageStatus, TokenUsage, ToolCall

__all__ = [
    "DjangoHarness",
    "Harness",
    "MemoryHarness",
    "answer",
    "breaks",
    "call",
    "usage",
]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


def breaks(store: str, reason: str) -> Callable[[F], F]:
    """Mark a contract test that ``store`` ("memory" or "django") is known to break: the
    ``harness`` fixture makes it a strict xfail for that store only (it must keep failing
    there, and pass on the other)."""

    def mark(test: F) -> F:
        known = dict(getattr(test, "breaks", {}))
        known[store] = reason
        test.breaks = known  # type: ignore[attr-defined]
        return test

    return mark


class Harness:
    """One chat's store, and how the suite reaches that chat from elsewhere."""

    name: str
    store: ChatStore

    def rival(self, action: Callable[[ChatStore], T]) -> T:
        """``action`` run by a second writer of the same chat; its result (or its error)."""
        raise NotImplementedError

    def other(self) -> ChatStore:
        """The chat as another process (or thread) sees it, for requests that come from
        outside the run: a cancel, a halt, a queued message, a person's decision."""
        raise NotImplementedError

    def reopen(self) -> ChatStore:
        """A store over the same chat as a new process would open it."""
        raise NotImplementedError

    def as_message(self, record: Any) -> Message:
        """A store record (what ``append_message``, ``save_answer``... return) as a Message."""
        raise NotImplementedError

    def as_call(self, record: Any) -> ToolCall:
        """A store's tool-call record (``native_tool_call``'s) as a ToolCall."""
        raise NotImplementedError

    def call_error(self, call: ToolCall) -> str:
        """The error text kept with a call's final state ("" when none)."""
        raise NotImplementedError

    def original_arguments(self, call: ToolCall) -> dict[str, Any] | None:
        """The model's arguments kept when an approver edited them (None: not edited)."""
        raise NotImplementedError

    def failure_error(self) -> str | None:
        """The one-line error a release with ``failure`` recorded on the chat; None when the
        store keeps no chat state to record it on (the in-memory store)."""
        raise NotImplementedError

    def forked(self, record: Any) -> ChatStore:
        """The store of the chat ``fork()`` returned (its record, or the store itself), as a
        new process would open it."""
        raise NotImplementedError

    def fork_origin(self, store: ChatStore) -> tuple[bool, Any]:
        """Whether ``store``'s chat is linked to this harness's chat, and the key of the
        message it was forked at."""
        raise NotImplementedError


class MemoryHarness(Harness):
    """``MemoryStore``: the chat lives in the store object; its claim belongs to a thread."""

    name = "memory"

    def __init__(self) -> None:
        self.store = MemoryStore(ChatConfig(model="scripted:test"))

    def rival(self, action: Callable[[ChatStore], T]) -> T:
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["value"] = action(self.store)
            except BaseException as exc:  # noqa: BLE001 - handed back to the caller
                outcome["error"] = exc

        thread = threading.Thread(target=run, name="rival-writer")
        thread.start()
        thread.join(30)
        if "error" in outcome:
            raise outcome["error"]
        value: T = outcome["value"]
        return value

    def other(self) -> ChatStore:
        return self.store

    def reopen(self) -> ChatStore:
        return self.store  # in memory only: the same object is the chat

    def as_message(self, record: Any) -> Message:
        assert isinstance(record, Message), record
        return record

    def as_call(self, record: Any) -> ToolCall:
        assert isinstance(record, ToolCall), record
        return record

    def call_error(self, call: ToolCall) -> str:
        assert isinstance(self.store, MemoryStore)
        return self.store.tool_errors.get(call.id, "")

    def original_arguments(self, call: ToolCall) -> dict[str, Any] | None:
        assert isinstance(self.store, MemoryStore)
        for message in self.store.messages:
            for stored in message.tool_calls:
                if stored.key == call.key:
                    return stored.original_arguments
        raise KeyError(call.key)

    def failure_error(self) -> str | None:
        return None

    def forked(self, record: Any) -> ChatStore:
        assert isinstance(record, MemoryStore), record
        return record

    def fork_origin(self, store: ChatStore) -> tuple[bool, Any]:
        assert isinstance(store, MemoryStore) and store.forked_from is not None
        origin, at = store.forked_from
        return origin is self.store, at


class DjangoHarness(Harness):
    """``DjangoStore`` over an ``agentloop.models.Chat`` row; another writer is another
    store over the row read again (what another process does)."""

    name = "django"

    def __init__(self) -> None:
        from agentloop.models import Chat  # Django is set up by now

        self.chat = Chat.objects.create(model="scripted:test")
        self.store = self.chat.conversation.store

    def _fresh(self) -> ChatStore:
        from agentloop.django_store.database import DjangoStore
        from agentloop.models import Chat

        return DjangoStore(Chat.objects.get(pk=self.chat.pk))

    def rival(self, action: Callable[[ChatStore], T]) -> T:
        return action(self._fresh())

    def other(self) -> ChatStore:
        return self._fresh()

    def reopen(self) -> ChatStore:
        return self._fresh()

    def as_message(self, record: Any) -> Message:
        from agentloop.models import Message as MessageRow

        assert isinstance(record, MessageRow), record
        row = MessageRow.objects.select_related("tool_call").get(pk=record.pk)
        return Message(
            role=row.role,
            content=row.content,
            status=MessageStatus(row.status),
            is_error=row.is_error,
            tool_call_id=row.tool_call.call_id if row.tool_call_id else None,
            tool_name=row.tool_call.name if row.tool_call_id else None,
            model=row.model or None,
            created_at=row.created_at,
            key=row.pk,
        )

    def as_call(self, record: Any) -> ToolCall:
        from agentloop.models import ToolCall as ToolCallRow

        assert isinstance(record, ToolCallRow), record
        return ToolCall(
            id=record.call_id,
            name=record.name,
            arguments=record.arguments,
            state=record.state,
            wait_reason=record.wait_reason or None,
            question=record.question or None,
            decision=record.decision or None,
            key=record.pk,
        )

    def call_error(self, call: ToolCall) -> str:
        from agentloop.models import ToolCall as ToolCallRow

        error: str = ToolCallRow.objects.get(pk=call.key).error
        return error

    def original_arguments(self, call: ToolCall) -> dict[str, Any] | None:
        from agentloop.models import ToolCall as ToolCallRow

        kept: dict[str, Any] | None = ToolCallRow.objects.get(pk=call.key).original_arguments
        return kept

    def failure_error(self) -> str | None:
        from agentloop.models import Chat

        row = Chat.objects.get(pk=self.chat.pk)
        assert row.state == "failed", row.state
        error: str = row.error
        return error

    def forked(self, record: Any) -> ChatStore:
        from agentloop.django_store.database import DjangoStore
        from agentloop.models import Chat

        assert isinstance(record, Chat) and record.pk not in (None, self.chat.pk), record
        return DjangoStore(Chat.objects.get(pk=record.pk))

    def fork_origin(self, store: ChatStore) -> tuple[bool, Any]:
        from agentloop.django_store.database import DjangoStore

        assert isinstance(store, DjangoStore)
        return store.chat.forked_from_id == self.chat.pk, store.chat.forked_from_message_id


# -- building what the engine hands a store ----------------------------------------------------
def call(call_id: str, name: str = "add", **arguments: Any) -> ToolCall:
    """A tool call as the model asked for it (pending)."""
    return ToolCall(id=call_id, name=name, arguments=arguments or {"a": 1, "b": 2})


def answer(*calls: ToolCall, content: str = "") -> Message:
    """An assistant answer, as the engine saves it (``model_calls._answer``)."""
    return Message(role="assistant", content=content, tool_calls=list(calls), model="test")


def usage(
    cost: str | None = None,
    *,
    input_tokens: int = 0,
    status: Any = "succeeded",
) -> UsageRecord:
    """A usage row of one provider attempt."""
    return UsageRecord(
        provider="scripted",
        model="test",
        status=status,
        usage=TokenUsage(input_tokens=input_tokens, output_tokens=5),
        cost=None if cost is None else Decimal(cost),
    )

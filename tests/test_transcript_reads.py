"""A transcript read again on PostgreSQL skips the rows this process has, and never serves
one that changed (``agentloop.django_store.transcript_reads``)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction

from agentloop import providers
from agentloop.django_store.chat_row import transcript_read, transcript_select
from agentloop.django_store.transcript_rows import messages_from_rows
from agentloop.messages import Message as Msg
from agentloop.models import Chat, Message, ToolCall
from agentloop.testing import FunctionProvider

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="kept rows: PostgreSQL"),
]


def fresh(chat: Any) -> list[Msg]:
    """The transcript as the plain SELECT reads it."""
    return messages_from_rows(transcript_select(Chat, "default").rows([chat.pk]))


def read(chat: Any) -> tuple[list[Msg], int]:
    """The transcript as the next read builds it, and how many rows the server sent."""
    reading = transcript_read(Chat, "default", chat.pk)
    with connection.cursor() as cursor:
        cursor.execute(reading.sql, reading.params)
        fetched = cursor.fetchall()
    sent = sum(1 for row in fetched if row[0] is not None)
    return reading.messages(fetched), sent


def dumped(messages: list[Msg]) -> list[dict[str, Any]]:
    return [message.model_dump() for message in messages]


@pytest.fixture
def chat(user: Any) -> Any:
    chat = Chat.objects.create(model="scripted:test", owner=user)
    Message.objects.create(chat=chat, role="system", content="Be brief.")
    for index in range(5):
        Message.objects.create(chat=chat, role="user", content=f"question {index}")
        answer = Message.objects.create(chat=chat, role="assistant", content="")
        ToolCall.objects.create(chat=chat, message=answer, call_id=f"c{index}", name="lookup",
                                arguments={"key": index, "a": [1]}, state="succeeded")  # fmt: skip
        call = ToolCall.objects.get(call_id=f"c{index}")
        Message.objects.create(chat=chat, role="tool", content=f"value {index}", tool_call=call)
    return chat


def test_a_second_read_gets_only_the_rows_from_the_latest_answer_on(chat):
    first, sent = read(chat)
    assert sent == 16
    again, sent = read(chat)
    assert sent == 2  # the latest assistant message (its calls change) and its result
    assert dumped(again) == dumped(first) == dumped(fresh(chat))
    Message.objects.create(chat=chat, role="user", content="one more")
    appended, sent = read(chat)
    assert sent == 3
    assert dumped(appended) == dumped(fresh(chat))
    assert appended[-1].content == "one more"


def test_rows_changed_by_raw_sql_are_read_again(chat):
    read(chat)
    first = Message.objects.filter(chat=chat, role="user").order_by("id").first()
    with connection.cursor() as cursor:
        cursor.execute("UPDATE agentloop_message SET content = 'redacted' WHERE id = %s",
                       [first.pk])  # fmt: skip
    messages, sent = read(chat)
    assert sent == 16
    assert messages[1].content == "redacted"
    assert dumped(messages) == dumped(fresh(chat))


def test_an_old_calls_change_is_read_again(chat):
    read(chat)
    ToolCall.objects.filter(call_id="c0").update(state="failed")
    messages, _ = read(chat)
    assert messages[2].tool_calls[0].state == "failed"
    assert dumped(messages) == dumped(fresh(chat))


def test_deleted_and_superseded_rows_are_gone(chat):
    read(chat)
    rows = Message.objects.filter(chat=chat, role="user").order_by("id")
    first, second = rows[0], rows[1]
    Message.objects.filter(pk=first.pk).delete()
    messages, _ = read(chat)
    assert [m.key for m in messages] == [m.key for m in fresh(chat)]
    assert first.pk not in [m.key for m in messages]
    Message.objects.filter(pk=second.pk).update(superseded_at="2026-01-01T00:00:00Z")
    messages, _ = read(chat)
    assert second.pk not in [m.key for m in messages]
    assert dumped(messages) == dumped(fresh(chat))


def test_a_change_in_the_same_transaction_as_the_read_is_seen(chat):
    with transaction.atomic():
        read(chat)
        first = Message.objects.filter(chat=chat, role="user").order_by("id").first()
        Message.objects.filter(pk=first.pk).update(content="changed")
        messages, _ = read(chat)
        assert messages[1].content == "changed"
        Message.objects.filter(pk=first.pk).update(content="changed twice")
        messages, _ = read(chat)
        assert messages[1].content == "changed twice"


def test_a_row_committed_late_with_a_smaller_key_is_read(chat):
    with connection.cursor() as cursor:
        cursor.execute("SELECT nextval(pg_get_serial_sequence('agentloop_message', 'id'))")
        early = cursor.fetchone()[0]  # taken by a transaction that commits later
    Message.objects.create(chat=chat, role="user", content="after")
    answer = Message.objects.create(chat=chat, role="assistant", content="done")
    read(chat)
    read(chat)
    Message.objects.create(id=early, chat=chat, role="user", content="late")
    messages, _ = read(chat)
    assert "late" in [m.content for m in messages]
    assert dumped(messages) == dumped(fresh(chat))
    assert messages[-1].key == answer.pk


def test_two_chats_keep_their_own_rows(chat, user):
    other = Chat.objects.create(model="scripted:test", owner=user)
    Message.objects.create(chat=other, role="user", content="other chat")
    read(chat)
    read(other)
    assert [m.content for m in read(other)[0]] == ["other chat"]
    assert dumped(read(chat)[0]) == dumped(fresh(chat))


def test_what_a_verb_does_to_its_messages_does_not_reach_the_next_read(chat):
    first, _ = read(chat)
    before = dumped(fresh(chat))
    for message in first:
        message.content = "changed in memory"
        message.provider_data["x"] = 1
        message.attachments.append(None)  # type: ignore[arg-type]
        for call in message.tool_calls:
            call.state = "failed"  # type: ignore[assignment]
            call.arguments["a"].append(2)
        message.tool_calls.clear()
    again, sent = read(chat)
    assert sent == 2
    assert dumped(again) == before


def read_as(chat: Any, shared: bool) -> list[Msg]:
    """The transcript as a verb's read (``shared``) or another read builds it."""
    reading = transcript_read(Chat, "default", chat.pk)
    with connection.cursor() as cursor:
        cursor.execute(reading.sql, reading.params)
        fetched = cursor.fetchall()
    return reading.messages(fetched, shared=shared)


def test_a_verbs_read_hands_out_the_unchanged_copies_again(chat):
    first = read_as(chat, shared=True)
    again = read_as(chat, shared=True)
    # The 14 messages before the latest answer: the same copies; the last two read again.
    assert [a is b for a, b in zip(first, again, strict=True)] == [True] * 14 + [False] * 2
    again[1].content = "changed in memory"
    again[2].tool_calls[0].arguments["a"].append(2)  # a change deep inside counts too
    third = read_as(chat, shared=True)
    assert [a is b for a, b in zip(again, third, strict=True)] == (
        [True] + [False] * 2 + [True] * 11 + [False] * 2
    )
    assert dumped(third) == dumped(fresh(chat))


def test_a_read_outside_a_verb_hands_out_copies_of_its_own(chat):
    verbs = read_as(chat, shared=True)
    own = read_as(chat, shared=False)
    assert not {id(message) for message in verbs} & {id(message) for message in own}
    assert dumped(own) == dumped(verbs) == dumped(fresh(chat))
    # ... and what it hands out is never handed out again.
    Message.objects.create(chat=chat, role="user", content="one more")
    own = read_as(chat, shared=False)
    later = read_as(chat, shared=True)
    assert not {id(message) for message in own} & {id(message) for message in later}
    assert dumped(later) == dumped(fresh(chat))


def test_conversation_messages_are_the_callers_own(chat):
    first = chat.conversation.messages
    again = chat.conversation.messages
    assert not {id(message) for message in first} & {id(message) for message in again}
    first[1].content = "changed in memory"
    assert again[1].content == "question 0"


def test_what_a_provider_does_to_its_request_does_not_reach_the_next_step(user):
    seen: list[list[str]] = []

    def answer(request: Any) -> str:
        seen.append([message.content for message in request.messages])
        for message in request.messages:
            message.content = "changed by the provider"
            message.provider_data["x"] = 1
        return f"answer {len(seen)}"

    providers.register("meddling", FunctionProvider(answer))
    try:
        chat = Chat.objects.create(model="meddling:test", owner=user)
        for question in ("one", "two", "three"):
            chat.ask(question)
    finally:
        providers.unregister("meddling")
    assert seen == [["one"], ["one", "answer 1", "two"],
                    ["one", "answer 1", "two", "answer 2", "three"]]  # fmt: skip
    assert [m.content for m in chat.conversation.messages] == [
        "one", "answer 1", "two", "answer 2", "three", "answer 3"]  # fmt: skip


class Uncomparable:
    """A value that can't be compared (as a numpy array can't, in a condition)."""

    def __eq__(self, other: object) -> bool:
        raise ValueError("ambiguous")

    __hash__ = object.__hash__


def test_a_value_that_cant_be_compared_counts_as_a_change(chat):
    first = read_as(chat, shared=True)
    first[1].parsed = Uncomparable()
    again = read_as(chat, shared=True)
    assert again[1] is not first[1] and again[0] is first[0]
    assert dumped(again) == dumped(fresh(chat))

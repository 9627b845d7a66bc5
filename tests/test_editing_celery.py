"""Editing chats that real ``celery worker`` processes run (docs/editing.md): the replacement
is answered by a worker from the kept rows; a regenerated turn's calls get ids of their own;
a chat a worker holds refuses an edit; the subagent of a superseded call stops.

Workers, queues and the ``rules`` provider are the Celery tests' (tests/workers.py, the
``background`` fixture of tests/conftest.py).
"""

from __future__ import annotations

import pytest

from agentloop import ChatBusyError, DecisionConflictError
from agentloop.models import Chat, ChatState, ToolCall
from tests.editing_agents import Office
from tests.tools import charge_card_slowly, step_one
from tests.workers import new_chat, settled

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]


def current(chat: Chat) -> list[tuple[str, str]]:
    """The chat's current messages, instructions aside."""
    rows = chat.messages.current().exclude(role="system").order_by("id")
    return list(rows.values_list("role", "content"))


def first_user(chat: Chat):
    return chat.messages.current().filter(role="user").order_by("id").first()


def test_an_edit_is_answered_by_a_worker_from_the_kept_rows_only(background, user):
    background.start_worker("w1")
    chat = new_chat(user, step_one)
    chat.ask_later("plain question").complete_later()
    background.wait(lambda: settled(chat), "the first answer")

    Chat.objects.get(pk=chat.pk).edit_later(first_user(chat), "tools:step_one").complete_later()
    background.wait(lambda: settled(chat), "the edited turn to settle")

    assert current(chat) == [
        ("user", "tools:step_one"),
        ("assistant", ""),
        ("tool", "one done"),
        ("assistant", "done: one done"),
    ]
    assert chat.messages.superseded().count() == 2
    # The worker's requests held the edited message as the only user message (turn 1).
    assert [(call["rule"], call["turn"]) for call in background.model_calls()] == [
        ("plain", 1),
        ("tools:step_one", 1),
        ("tools:step_one", 1),
    ]


def test_a_turn_regenerated_in_a_worker_gives_its_calls_ids_of_their_own(background, user):
    """The rules model numbers its calls by turn (``call_1_0_0`` again): the new call gets
    an id of its own, the tool's idempotency key, and runs."""
    background.start_worker("w1")
    chat = new_chat(user, step_one)
    chat.ask_later("tools:step_one").complete_later()
    background.wait(lambda: settled(chat), "the first turn")

    Chat.objects.get(pk=chat.pk).regenerate_later().complete_later()
    background.wait(lambda: settled(chat), "the regenerated turn")

    ids = list(ToolCall.objects.filter(chat=chat).order_by("id").values_list("call_id", flat=True))
    assert ids[0] == "call_1_0_0" and ids[1].startswith("call_1_0_0_")
    assert background.runs() == ["step_one", "step_one"]
    assert current(chat)[-1] == ("assistant", "done: one done")


def test_a_chat_a_worker_is_running_refuses_an_edit_and_its_run_goes_on(background, user):
    background.start_worker("holder", flag=True)
    chat = new_chat(user, charge_card_slowly)
    chat.ask_later("tools:charge_card_slowly").complete_later()
    background.wait(lambda: "charge_card_slowly" in background.runs(), "the tool to start")

    with pytest.raises(ChatBusyError):
        Chat.objects.get(pk=chat.pk).regenerate()
    with pytest.raises(ChatBusyError):
        Chat.objects.get(pk=chat.pk).edit_later(first_user(chat), "Something else")
    (background.tmp / "never-created").touch()  # the tool may finish now
    background.wait(lambda: settled(chat), "the chat to settle")

    assert not chat.messages.superseded().exists()
    assert background.runs() == ["charge_card_slowly"]
    assert current(chat)[-1] == ("assistant", "done: charged 42")


def test_editing_a_chat_waiting_for_its_subagent_stops_the_subagent(background, user):
    background.start_worker("w1")
    office = Office.create(owner=user)
    office.ask_later("tools:clerk").complete_later()
    background.wait(
        lambda: (
            Chat.objects.filter(parent=office, state=ChatState.WAITING).exists()
            and Chat.objects.get(pk=office.pk).state == ChatState.WAITING
        ),
        "the clerk and the office to wait",
    )
    clerk = Chat.objects.get(parent=office)

    Chat.objects.get(pk=office.pk).edit_later(first_user(office), "plain question").complete_later()
    background.wait(lambda: settled(office), "the edited office chat to settle")

    clerk.refresh_from_db()
    assert clerk.state == ChatState.IDLE
    assert ToolCall.objects.get(chat=clerk).state == "cancelled"
    assert ToolCall.objects.get(chat=office, message__superseded_at__isnull=False).decision == (
        "superseded"
    )
    with pytest.raises(DecisionConflictError):
        clerk.submit_result("call_1_0_0", "paid on the 3rd")
    assert current(office) == [("user", "plain question"), ("assistant", "echo: plain question")]
    assert Chat.objects.filter(parent=office).count() == 1  # no new clerk

"""Agents follow the code: each verb applies the agent's configuration as the class has it
now (a deploy reaches existing chats), and ``Agent.find`` hands a chat over."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agentloop import ConfigurationError
from agentloop.models import Chat, ChatState
from agentloop.runners import run_step
from agentloop.testing import tool_call
from tests.agents import Calculator, Research, Writer


def system_of(request) -> str:
    return request.messages[0].content


@pytest.mark.django_db
def test_a_change_to_the_agent_class_reaches_an_existing_chat_at_its_next_verb(
    brains, user, monkeypatch
):
    chat = Writer.create(owner=user)
    brains.script("You are WRITER.", "Draft one.")
    chat.ask("Write a line")

    # A deploy: the class changed; the chat is loaded again, as another process would.
    monkeypatch.setattr(Writer, "instructions", "You are EDITOR.")
    monkeypatch.setattr(Writer, "model", "agents:large")
    brains.script("You are EDITOR.", "Edited.")
    again = Chat.objects.get(pk=chat.pk)
    assert again.ask("Tighten it").content == "Edited."

    first, second = (request for _, request in brains.seen)
    assert (system_of(first), first.model) == ("You are WRITER.", "small")
    assert (system_of(second), second.model) == ("You are EDITOR.", "large")
    again.refresh_from_db()
    assert again.model == "agents:large"
    assert list(again.messages.filter(role="system").values_list("content", flat=True)) == [
        "You are EDITOR."
    ]


@pytest.mark.django_db
def test_tools_removed_from_the_agent_are_removed_from_its_chats(brains, user, monkeypatch):
    chat = Calculator.create(owner=user)
    assert chat.tools == ["tests.tools.add"]
    monkeypatch.setattr(Calculator, "tools", [])
    brains.script("You are CALCULATOR.", "No tools now.")

    chat.ask("1 + 2?")

    chat.refresh_from_db()
    assert chat.tools == []
    assert brains.seen[0][1].tools == []


@pytest.mark.django_db
def test_an_unchanged_agent_costs_a_verb_no_query(brains, user):
    plain = Chat.objects.create(model="agents:small", owner=user)
    plain.with_instructions("You are WRITER.")
    made = Writer.create(owner=user)
    brains.script("You are WRITER.", "One.", "Two.")

    with CaptureQueriesContext(connection) as plain_queries:
        plain.ask("Hi")
    with CaptureQueriesContext(connection) as agent_queries:
        made.ask("Hi")

    assert len(agent_queries) == len(plain_queries), [q["sql"] for q in agent_queries]


@pytest.mark.django_db(transaction=True)
def test_a_class_changed_between_two_background_steps_applies_at_the_next(
    brains, user, monkeypatch
):
    chat = Calculator.create(owner=user)
    chat.ask_later("1 + 2?")
    Chat.objects.filter(pk=chat.pk).update(state=ChatState.QUEUED)
    brains.script("You are CALCULATOR.", tool_call("add", {"a": 1, "b": 2}))
    brains.script("You are ABACUS.", "It is 3.")

    assert run_step(chat.pk).action == "again"  # the model asks for add
    monkeypatch.setattr(Calculator, "instructions", "You are ABACUS.")  # a deploy
    assert run_step(chat.pk).action == "again"  # the tool round
    assert run_step(chat.pk).action == "done"  # the answer, under the new instructions

    assert [system_of(request) for _, request in brains.seen] == [
        "You are CALCULATOR.",
        "You are ABACUS.",
    ]
    brains.assert_complete()


# -- find: a handoff ------------------------------------------------------------------------------
@pytest.mark.django_db
def test_find_hands_a_chat_made_by_another_agent_over(brains, user):
    chat = Writer.create(owner=user)
    brains.script("You are WRITER.", "A draft on owls.")
    chat.ask("Write about owls")

    found = Research.find(chat.pk, topic="owls")

    assert found.pk == chat.pk
    assert (found.agent_path, found.agent_inputs) == ("tests.agents.Research", {"topic": "owls"})
    assert Chat.objects.get(pk=chat.pk).agent_path == "tests.agents.Research"
    brains.script("You are RESEARCH.", "Owls hunt at night.")
    assert found.ask("When do owls hunt?").content == "Owls hunt at night."
    assert system_of(brains.seen[-1][1]) == "You are RESEARCH. You research owls."

    back = Writer.find(chat.pk)  # and back again
    assert back.agent_path == "tests.agents.Writer"
    assert back.messages.get(role="system").content == "You are WRITER."


@pytest.mark.django_db
def test_a_handoff_missing_an_input_is_refused_and_changes_nothing(user):
    chat = Writer.create(owner=user)
    with pytest.raises(ConfigurationError, match=r"Research needs the input\(s\) topic"):
        Research.find(chat.pk)
    chat.refresh_from_db()
    assert chat.agent_path == "tests.agents.Writer"
    assert chat.messages.get(role="system").content == "You are WRITER."


@pytest.mark.django_db
def test_find_hands_over_a_chat_made_without_an_agent(brains, user):
    chat = Chat.objects.create(model="agents:small", owner=user)
    found = Writer.find(chat.pk)
    assert found.agent_path == "tests.agents.Writer"
    brains.script("You are WRITER.", "Hello.")
    assert found.ask("Hi").content == "Hello."


# -- in memory ------------------------------------------------------------------------------------
def test_an_in_memory_agent_chat_follows_its_class_too(brains, monkeypatch):
    chat = Writer.chat()
    brains.script("You are WRITER.", "One.")
    chat.ask("Hi")
    monkeypatch.setattr(Writer, "instructions", "You are EDITOR.")
    brains.script("You are EDITOR.", "Two.")
    assert chat.ask("Again").content == "Two."
    assert [m.content for m in chat.messages if m.role == "system"] == ["You are EDITOR."]

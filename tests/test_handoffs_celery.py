"""Handoffs on real ``celery worker`` processes: the worker's tool round makes the handoff and
its next job asks the new agent (the same code path as in process, tests/test_handoffs.py);
a handoff target the worker can't import fails the step with a clear error and loses nothing.

The workers answer "scripted:<agent>" models with the ``rules`` provider
(tests/handoff_agents.py ``WORKER_PROVIDERS``), which logs each request's model,
instructions and tools: which agent asked.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentloop.models import Chat, ChatState
from tests.handoff_agents import WORKER_PROVIDERS, Escalate, Triage
from tests.helpers import transcript
from tests.workers import Background, settled

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]

TRIAGE = (
    "triage",
    "You are TRIAGE for Ada.",
    ["lookup_order", "transfer_to_billing", "transfer_to_refunds"],
)
BILLING = ("billing", "You are BILLING for Ada.", ["invoice_total", "transfer_to_triage"])


def asked(background: Background) -> list[tuple[str, str, list[str]]]:
    """Each model call the workers made: its model, instructions and tools."""
    return [(call["model"], call["system"], call["tools"]) for call in background.model_calls()]


@pytest.fixture
def elsewhere(tmp_path) -> Iterator[tuple[Any, Path]]:
    """An agent in a module only this process can import (a deploy the worker lacks): the
    agent class and the folder it is in."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    name = f"audit_agents_{uuid.uuid4().hex[:8]}"
    (folder / f"{name}.py").write_text(
        textwrap.dedent(
            """
            from agentloop import Agent


            class Audit(Agent):
                \"\"\"Audits a customer's account.\"\"\"

                model = "scripted:audit"
                instructions = "You are AUDIT for {customer}."
                inputs = ["customer"]
            """
        )
    )
    sys.path.insert(0, str(folder))
    try:
        yield importlib.import_module(name).Audit, folder
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop(name, None)


def test_a_worker_hands_the_chat_over_and_its_next_job_asks_the_new_agent(background, user):
    worker = background.start_worker("w1", PROVIDERS=WORKER_PROVIDERS)
    chat = Triage.create(owner=user, customer="Ada")
    chat.ask_later("tools:transfer_to_billing").complete_later()

    background.wait(lambda: settled(chat), "the chat to settle")

    assert asked(background) == [TRIAGE, BILLING]
    assert chat.agent_path == "tests.handoff_agents.Billing"
    assert transcript(chat, "role", "content")[-2:] == [
        ("tool", "Handed off from Triage to Billing: Billing goes on."),
        ("assistant", "done: Handed off from Triage to Billing: Billing goes on."),
    ]
    assert chat.tool_calls.get().handoff == {
        "from": "tests.handoff_agents.Triage",
        "to": "tests.handoff_agents.Billing",
        "inputs": {"customer": "Ada"},
    }
    background.wait(lambda: len(worker.outcomes()) == 3, "the third job to report")
    assert worker.outcomes() == ["again", "again", "done"]  # model, the round, the new agent


def test_a_tool_calling_find_in_a_worker_hands_the_chat_over_for_the_next_job(background, user):
    background.start_worker("w1", PROVIDERS=WORKER_PROVIDERS)
    chat = Chat.objects.create(model="scripted:test", owner=user).with_tools(Escalate)
    chat.ask_later("tools:escalate").complete_later()

    background.wait(lambda: settled(chat), "the chat to settle")

    assert asked(background) == [("test", "", ["escalate"]), BILLING]
    assert chat.agent_path == "tests.handoff_agents.Billing"
    assert chat.tool_calls.get().handoff["to"] == "tests.handoff_agents.Billing"


def test_a_handoff_target_the_worker_cannot_import_fails_clearly_and_loses_nothing(
    background, user, elsewhere
):
    audit, folder = elsewhere
    path = f"{audit.__module__}.Audit"
    first = background.start_worker("old-deploy", PROVIDERS=WORKER_PROVIDERS)
    chat = Triage.create(owner=user, customer="Ada").with_handoffs(audit)
    chat.ask_later("tools:transfer_to_audit").complete_later()

    background.wait(lambda: Chat.objects.get(pk=chat.pk).state == ChatState.FAILED, "the failure")

    chat.refresh_from_db()
    assert chat.error.startswith(
        f"ConfigurationError: The chat's handoff to {path!r} can't be offered"
    )
    assert "\n" not in chat.error
    assert transcript(chat, "role") == [("system",), ("user",)]  # nothing lost, nothing half done
    assert asked(background) == []
    first.kill()

    background.start_worker("new-deploy", PROVIDERS=WORKER_PROVIDERS, pythonpath=folder)
    Chat.objects.get(pk=chat.pk).complete_later()  # after the deploy: carry on
    background.wait(lambda: settled(chat), "the chat to settle")

    assert [call[:2] for call in asked(background)] == [
        ("triage", "You are TRIAGE for Ada."),
        ("audit", "You are AUDIT for Ada."),
    ]
    assert (chat.agent_path, chat.error) == (path, "")


def test_a_chat_handed_to_an_agent_the_worker_cannot_import_goes_on_as_it_was_configured(
    background, user, elsewhere, scripted
):
    audit, _ = elsewhere  # (``scripted`` serves "scripted:audit" here: find() checks it)
    background.start_worker("w1", PROVIDERS=WORKER_PROVIDERS)
    chat = audit.find(Triage.create(owner=user, customer="Ada").pk)  # handed over here
    chat.ask_later("hello").complete_later()

    background.wait(lambda: settled(chat), "the chat to settle")

    assert asked(background) == [("audit", "You are AUDIT for Ada.", [])]
    assert transcript(chat, "role", "content")[-1] == ("assistant", "echo: hello")
    logs = background.logs()
    assert f"keeps its configuration: agent {audit.__module__}.Audit" in logs

"""A job whose lease went from under it mid-step (issue 41, defect 14): freed by hand
(``manage.py agentloop unlock``, ``free_chat``), it says so and sends nothing, since the
unlock sent the chat's next job; only a claim the database itself lost (the row as it was
before the claim) makes the job send the chat's next step."""

from __future__ import annotations

import logging
import threading
from typing import Any, ClassVar

import pytest
from django.db import connections

from agentloop.messages import ToolCallState
from agentloop.models import Chat, ChatState
from agentloop.runners import Job, Runner, StepOutcome, run_job, run_step
from agentloop.runners.sweeper import free_chat
from tests.helpers import wait_until
from tests.tools import wait_for_flag

pytestmark = pytest.mark.django_db(transaction=True)


class KeptJobs(Runner):
    """Keeps the jobs it is sent (a project's own runner, named by import path)."""

    sent: ClassVar[list[Job]] = []

    def send(self, job: Job) -> None:
        type(self).sent.append(job)


@pytest.fixture
def kept(settings) -> type[KeptJobs]:
    KeptJobs.sent = []
    settings.AGENTLOOP = {**settings.AGENTLOOP, "RUNNER": f"{__name__}.KeptJobs"}
    return KeptJobs


@pytest.fixture
def flag(tmp_path, monkeypatch):
    """The file ``wait_for_flag`` holds for: the tool returns once the test creates it."""
    path = tmp_path / "flag"
    monkeypatch.setenv("AGENTLOOP_TEST_FLAG", str(path))
    return path


def tool_round_running(user: Any) -> tuple[Chat, threading.Thread, list[StepOutcome]]:
    """A chat whose tool round runs in a job on another thread, held inside the tool."""
    chat = Chat.objects.create(model="rules:test", owner=user).with_tools(wait_for_flag)
    chat.ask_later("tools:wait_for_flag")
    Chat.objects.filter(pk=chat.pk).update(state=ChatState.QUEUED)  # as complete_later()
    assert run_step(chat.pk).action == "again"  # the model asks for the tool
    outcomes: list[StepOutcome] = []

    def work() -> None:
        try:
            outcomes.append(run_job(Job(chat.pk)))
        finally:
            connections.close_all()  # this thread's own: the test database is dropped after

    job = threading.Thread(target=work)
    job.start()
    wait_until(
        lambda: chat.tool_calls.filter(state=ToolCallState.RUNNING).exists(),
        "the tool to start",
        30,
    )
    return chat, job, outcomes


def test_after_an_unlock_the_old_job_says_its_lease_was_taken_and_sends_no_extra_job(
    kept, flag, user, caplog
):
    chat, job, outcomes = tool_round_running(user)

    assert free_chat(chat.pk) is not None  # an operator unlocks it: its next job is sent
    assert kept.sent == [Job(chat.pk, "agentloop.Chat")]
    with caplog.at_level(logging.WARNING, logger="agentloop"):
        flag.touch()  # the old job's tool returns; its result's write finds the lease gone
        job.join(30)

    assert [outcome.action for outcome in outcomes] == ["lost"]
    assert kept.sent == [Job(chat.pk, "agentloop.Chat")]  # no second job
    said = [record.getMessage() for record in caplog.records]
    assert not any("lost this job's claim" in line for line in said), said
    assert any(f"Chat {chat.pk}: lease lost mid-step" in line for line in said), said
    chat.refresh_from_db()
    assert (chat.state, chat.lease_token) == (ChatState.QUEUED, "")


def test_a_claim_the_database_lost_still_sends_the_chats_next_step(kept, flag, user, caplog):
    before = Chat.objects.create(model="rules:test", owner=user)
    chat, job, outcomes = tool_round_running(user)
    claimed = Chat.objects.get(pk=chat.pk)
    # A crash lost the claim's commit: the row is as it was before the claim.
    Chat.objects.filter(pk=chat.pk).update(
        lease_token="", lease_expires_at=None, state=ChatState.QUEUED, updated_at=before.created_at
    )
    assert claimed.updated_at > before.created_at
    with caplog.at_level(logging.WARNING, logger="agentloop"):
        flag.touch()
        job.join(30)

    assert [outcome.action for outcome in outcomes] == ["again"]
    assert kept.sent == [Job(chat.pk, "agentloop.Chat")]  # its next step, sent by the job
    said = [record.getMessage() for record in caplog.records]
    assert any(f"Chat {chat.pk}: the database lost this job's claim" in x for x in said), said

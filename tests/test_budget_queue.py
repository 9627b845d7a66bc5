"""The chats-in-flight quota's line (issue 41, defect 11), in one process: a background chat
that finds every place taken queues (its place in line kept), places go in the order the
chats came, a run that ends gives its place back and names the next chat in line, and the
sweeper sends a chat whose turn came should nobody have. tests/test_budgets_celery.py runs
the same on real workers."""

from __future__ import annotations

from decimal import Decimal
from typing import ClassVar

import pytest

from agentloop import BudgetExceededError
from agentloop.budgets import counters, slots
from agentloop.budgets.subjects import owner_subject
from agentloop.engine.rate_limiting import CallEstimate
from agentloop.models import BudgetSlot, Chat, ChatState
from agentloop.runners import Job, Runner, run_step
from agentloop.runners.sweeper import resume_stalled

pytestmark = pytest.mark.django_db

ESTIMATE = CallEstimate("priced", "test", 5, 5, Decimal("0.01"))


@pytest.fixture
def quota(settings):
    settings.AGENTLOOP = {**settings.AGENTLOOP, "BUDGETS": {"chats_in_flight": 1}}


def queued(user) -> Chat:
    return Chat.objects.create(model="priced:test", owner=user, state=ChatState.QUEUED)


def ask_place(chat: Chat, *, wait: bool = True) -> bool:
    """A model call of ``chat`` (a background step's when ``wait``): True when it may go."""
    try:
        counters.reserve([owner_subject(chat)], ESTIMATE, chat, "default", wait=wait)
    except BudgetExceededError as exc:
        assert exc.limit == "chats_in_flight"
        return False
    return True


def line(user) -> list[int]:
    rows = BudgetSlot.objects.filter(waiting_since__isnull=False).order_by("pk")
    return [int(key) for key in rows.values_list("chat_key", flat=True)]


def end_run(chat: Chat) -> None:
    Chat.objects.filter(pk=chat.pk).update(state=ChatState.IDLE)


def subject(user) -> str:
    return f"auth.user:{user.pk}"


def test_chats_past_the_quota_wait_in_line_and_go_in_the_order_they_came(quota, user):
    first, second, third = queued(user), queued(user), queued(user)
    assert ask_place(first)
    assert not ask_place(second)
    assert not ask_place(third)
    assert line(user) == [second.pk, third.pk]
    assert ask_place(first)  # a holder's next call in the same run keeps its place

    end_run(first)
    slots.leave([subject(user)], first, "default")
    assert slots.due([subject(user)], "default") == [("agentloop.chat", str(second.pk))]
    assert not ask_place(third)  # the freed place is the second's: no overtaking
    assert ask_place(second)
    assert line(user) == [third.pk]

    end_run(second)
    slots.leave([subject(user)], second, "default")
    assert slots.due([subject(user)], "default") == [("agentloop.chat", str(third.pk))]
    assert ask_place(third)
    assert not BudgetSlot.objects.filter(waiting_since__isnull=False).exists()


def test_a_new_chat_queues_behind_those_in_line_even_with_a_place_free(quota, user):
    first, second, late = queued(user), queued(user), queued(user)
    assert ask_place(first) and not ask_place(second)
    end_run(first)  # its place is free, but the second chat came first

    assert not ask_place(late)
    assert line(user) == [second.pk, late.pk]
    assert ask_place(second)


def test_a_verb_in_process_takes_no_place_in_line(quota, user):
    first, second = queued(user), queued(user)
    assert ask_place(first)

    assert not ask_place(second, wait=False)
    assert line(user) == []


def test_a_chat_that_left_the_line_gives_way_to_the_next(quota, user):
    first, cancelled, third = queued(user), queued(user), queued(user)
    assert ask_place(first) and not ask_place(cancelled) and not ask_place(third)
    end_run(cancelled)  # cancelled while in line: it runs no more
    end_run(first)
    slots.leave([subject(user)], first, "default")

    assert slots.due([subject(user)], "default") == [("agentloop.chat", str(third.pk))]
    assert ask_place(third)


class KeptJobs(Runner):
    """Keeps the jobs it is sent (a project's own runner, named by import path)."""

    name = "kept"
    sent: ClassVar[list[Job]] = []

    def send(self, job: Job) -> None:
        type(self).sent.append(job)


@pytest.mark.django_db(transaction=True)  # the sweeper's jobs go once its writes commit
def test_the_sweeper_sends_the_chat_whose_turn_came(quota, user, settings):
    """The chat that freed the place died before sending the next chat's job."""
    first, second = queued(user), queued(user)
    assert ask_place(first) and not ask_place(second)
    end_run(first)  # no leave(): its process died
    settings.AGENTLOOP = {**settings.AGENTLOOP, "RUNNER": f"{__name__}.KeptJobs"}
    KeptJobs.sent = []

    resume_stalled()

    assert [(job.chat_id, job.model_label) for job in KeptJobs.sent] == [
        (str(second.pk), "agentloop.chat")
    ]


@pytest.mark.django_db(transaction=True)
def test_a_background_step_past_the_quota_queues_and_a_cancel_takes_it_out(quota, user, settings):
    settings.AGENTLOOP = {**settings.AGENTLOOP, "RUNNER": f"{__name__}.KeptJobs"}
    first = queued(user)
    assert ask_place(first)
    second = Chat.objects.create(model="priced:test", owner=user)
    second.ask_later("Hi")
    second.complete_later()
    KeptJobs.sent = []

    assert run_step(second.pk).action == "waiting"  # no job follows: it waits in line

    row = Chat.objects.get(pk=second.pk)
    assert (row.state, row.lease_token, row.stop_reason) == (ChatState.QUEUED, "", "")
    assert row.waiting_for == (
        f"budget: 1 chat in flight reached for owner {user.pk} (waiting for a place)"
    )
    assert [m.role for m in row.messages.all()] == ["user"]
    assert KeptJobs.sent == [] and line(user) == [second.pk]

    assert row.cancel()  # it has no job to see the cancel: one is sent
    assert [job.chat_id for job in KeptJobs.sent] == [second.pk]
    assert run_step(second.pk).action == "cancelled"
    row.refresh_from_db()
    assert (row.state, row.waiting_for) == (ChatState.IDLE, "")

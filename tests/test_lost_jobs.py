"""A job that could not be sent (issue 41, defect 12) marks its chat for the sweeper's next run
whether or not the chat is held at that moment: the sweeper takes it once no one holds it,
not ``STALE_QUEUED_SECONDS`` later. (The broker's side, a restart that loses every job, is
in the fault suite: tests/faults/test_broker.py.)"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from agentloop.django_store.leases import claim_row
from agentloop.models import Chat, ChatState
from agentloop.runners import Job, Runner
from agentloop.runners.enqueueing import send
from agentloop.runners.sweeper import stalled_chats

pytestmark = pytest.mark.django_db(transaction=True)


class BrokerDown(Runner):
    """A broker that is down."""

    def send(self, job: Job) -> None:
        raise ConnectionError("broker down")


def test_a_job_unsent_while_its_chat_is_held_is_swept_once_the_holder_is_gone(user, settings):
    chat = Chat.objects.create(owner=user, model="scripted:m", state=ChatState.QUEUED)
    # A process holds it, and it stays queued (an in-process verb's claim, a request's).
    claimed = claim_row(Chat, chat.pk, state=None)
    assert claimed is not None
    lease = claimed[0]
    assert Chat.objects.get(pk=chat.pk).state == ChatState.QUEUED
    settings.AGENTLOOP = {**settings.AGENTLOOP, "RUNNER": f"{__name__}.BrokerDown"}

    send(Job(chat.pk))  # its next job can't be sent: no exception reaches the caller

    assert list(stalled_chats().values_list("pk", flat=True)) == []  # held: not the sweeper's
    lease.forget()
    past = timezone.now() - timedelta(seconds=60)
    Chat.objects.filter(pk=chat.pk).update(lease_expires_at=past)  # the holder died
    assert list(stalled_chats().values_list("pk", flat=True)) == [chat.pk]

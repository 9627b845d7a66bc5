"""Runners: the seam (``agentloop.runners``), chosen by name or by import path."""

from __future__ import annotations

import threading
import time
from typing import Any, ClassVar

import pytest
from django.test import override_settings

from agentloop.exceptions import ConfigurationError
from agentloop.models import Chat, ChatState
from agentloop.runners import Job, Runner, runner, runner_name
from agentloop.runners.enqueueing import send

pytestmark = pytest.mark.django_db(transaction=True)


class RecordingRunner(Runner):
    """Keeps the jobs it is sent (a project's own runner, named by import path)."""

    name = "recording"
    sent: ClassVar[list[Job]] = []
    arrived: ClassVar[threading.Event] = threading.Event()

    def send(self, job: Job) -> None:
        type(self).sent.append(job)
        type(self).arrived.set()


class UndeferredRunner(RecordingRunner):
    """A queue that can't delay a job."""

    @property
    def can_defer(self) -> bool:
        return False


@pytest.fixture
def recording() -> Any:
    RecordingRunner.sent = []
    RecordingRunner.arrived = threading.Event()
    return RecordingRunner


def test_a_runner_named_by_import_path_gets_the_jobs_of_complete_later(recording, user):
    with override_settings(AGENTLOOP={"RUNNER": f"{__name__}.RecordingRunner"}):
        assert runner_name() == f"{__name__}.RecordingRunner"
        assert isinstance(runner(), RecordingRunner)
        chat = Chat.objects.create(owner=user, model="scripted:m")
        chat.ask_later("hi").complete_later()

    assert recording.sent == [Job(chat.pk, "agentloop.Chat")]
    assert Chat.objects.get(pk=chat.pk).state == ChatState.QUEUED


def test_a_delayed_job_for_a_runner_that_cannot_defer_is_sent_when_its_delay_ends(recording):
    with override_settings(AGENTLOOP={"RUNNER": f"{__name__}.UndeferredRunner"}):
        started = time.monotonic()
        send(Job(7, countdown=0.3, attempt=2))
        assert recording.sent == []  # not at once: the runner would run it early
        assert recording.arrived.wait(5)
        waited = time.monotonic() - started

    assert recording.sent == [Job(7, countdown=None, attempt=2)]
    assert waited >= 0.3


def test_a_runner_path_that_is_no_runner_is_a_clear_error():
    with override_settings(AGENTLOOP={"RUNNER": "agentloop.tools.Tool"}):
        with pytest.raises(ConfigurationError, match="is not a runner"):
            runner()


def test_a_job_the_runner_cannot_take_marks_its_chat_for_the_sweeper(user):
    chat = Chat.objects.create(owner=user, model="scripted:m", state=ChatState.QUEUED)
    before = Chat.objects.get(pk=chat.pk).updated_at
    with override_settings(AGENTLOOP={"RUNNER": f"{__name__}.BrokenRunner"}):
        send(Job(chat.pk))  # no exception reaches the caller

    assert Chat.objects.get(pk=chat.pk).updated_at < before  # dated back: the next sweep


class BrokenRunner(Runner):
    """A broker that is down."""

    def send(self, job: Job) -> None:
        raise ConnectionError("broker down")


def test_the_store_sends_no_job_itself_its_owner_does(recording, user):
    from agentloop.django_store.database import DjangoStore
    from agentloop.messages import Message

    with override_settings(AGENTLOOP={"RUNNER": f"{__name__}.RecordingRunner"}):
        bare = Chat.objects.create(owner=user, model="scripted:m")
        DjangoStore(bare).inbox.queue_message(Message(role="user", content="one"))
        assert Chat.objects.get(pk=bare.pk).state == ChatState.QUEUED
        assert recording.sent == []  # no owner gave the store a way to send

        owned = Chat.objects.create(owner=user, model="scripted:m")
        owned.conversation.store.inbox.queue_message(Message(role="user", content="two"))

    assert recording.sent == [Job(owned.pk, "agentloop.Chat")]

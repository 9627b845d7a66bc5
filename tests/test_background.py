"""Background steps in the embedded runner (no broker), leases and recovery (docs/design.md §3).

The embedded runner runs the very job Celery runs (``agentloop.runners.run_step`` and its
follow-up) on a thread pool of this process, so these tests drive the background loop on
the real database without a broker; tests/test_celery_worker.py does it with real workers.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from agentloop import signals
from agentloop.django_store.leases import Lease, beat, heartbeats
from agentloop.exceptions import (
    AuthenticationError,
    RateLimitError,
)
from agentloop.messages import MessageStatus
from agentloop.models import Chat, ChatState
from agentloop.runners import StepOutcome, run_step, wait_for_embedded_jobs
from agentloop.testing import FunctionProvider, stream, tool_call
from tests.helpers import transcript
from tests.tools import add, transfer

pytestmark = pytest.mark.django_db(transaction=True)

JOB_DEADLINE = 30.0  # seconds to wait for the thread pool to run out of work


def embedded(**agentloop):
    """The tests' AGENTLOOP settings, in embedded mode, with ``agentloop`` on top."""
    return override_settings(
        AGENTLOOP={**settings.AGENTLOOP, "BACKGROUND": "embedded", **agentloop}
    )


@pytest.fixture(autouse=True)
def _embedded_mode():
    with embedded():
        yield
    # A job still running would hold a connection while the database is flushed.
    assert wait_for_embedded_jobs(JOB_DEADLINE), "background jobs still running after the test"


def settle() -> None:
    assert wait_for_embedded_jobs(JOB_DEADLINE), "background jobs did not finish"


def expire(lease: Lease) -> None:
    """Let the lease run out (as it would when its worker died)."""
    Chat.objects.filter(pk=lease.chat_pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )


def eventually(condition, what: str) -> None:
    """Poll ``condition`` until it holds (fails at the deadline)."""
    deadline = time.monotonic() + JOB_DEADLINE
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


# -- the loop on the thread pool -----------------------------------------------------------
def test_complete_later_runs_a_tool_conversation_to_the_end(chat, scripted):
    scripted.add(tool_call("add", {"a": 2, "b": 3}), "It is 5.")
    chat.with_tools(add).ask_later("2 + 3?")

    chat.complete_later()
    settle()

    chat.refresh_from_db()
    assert chat.state == ChatState.IDLE
    assert chat.lease_token == ""
    assert [(m.role, m.content) for m in chat.messages.order_by("id")] == [
        ("user", "2 + 3?"),
        ("assistant", ""),
        ("tool", "5"),
        ("assistant", "It is 5."),
    ]
    scripted.assert_complete()


def test_complete_later_enqueues_only_when_the_transaction_commits(chat, scripted):
    scripted.add("Hello.")
    with transaction.atomic():
        chat.ask_later("Hi").complete_later()
        assert wait_for_embedded_jobs(0)  # nothing was sent yet
        assert chat.state == ChatState.QUEUED

    settle()
    assert chat.messages.order_by("id").last().content == "Hello."


def test_a_chat_held_for_approval_is_left_waiting_and_goes_on_once_approved(chat, scripted):
    scripted.add(tool_call("transfer", {"amount": 5, "to": "bob"}), "Sent.")
    chat.with_tools(transfer).ask_later("Pay bob 5")

    chat.complete_later()
    settle()

    chat.refresh_from_db()
    assert chat.state == ChatState.WAITING
    (call,) = chat.pending_approvals()
    assert chat.messages.filter(role="tool").count() == 0

    chat.approve(call.pk)  # a chat a worker left waiting is enqueued again
    settle()

    chat.refresh_from_db()
    assert chat.state == ChatState.IDLE
    assert [m.content for m in chat.messages.filter(role__in=["tool", "assistant"])][-2:] == [
        "sent 5 to bob",
        "Sent.",
    ]


def test_a_chat_stopped_by_a_limit_is_marked_stopped_with_the_reason(chat, scripted):
    scripted.add(tool_call("add", {"a": 1, "b": 1}))
    chat.with_tools(add).with_limits(max_model_calls=1).ask_later("1 + 1?")

    chat.complete_later()
    settle()

    chat.refresh_from_db()
    assert chat.state == ChatState.STOPPED
    assert "max_model_calls" in chat.stop_reason
    assert transcript(chat, "role", "status") == [
        ("user", "complete"),
        ("assistant", "complete"),
        ("tool", "complete"),
    ]


def test_a_permanent_provider_error_marks_the_chat_failed_with_the_error(chat, scripted):
    scripted.add(AuthenticationError("invalid API key", status=401))
    chat.ask_later("Hi")

    chat.complete_later()
    settle()

    chat.refresh_from_db()
    assert chat.state == ChatState.FAILED
    assert "AuthenticationError: invalid API key" in chat.error
    assert chat.usage_records.get().status == "failed"


def test_complete_later_resumes_a_failed_chat(chat, scripted):
    scripted.add(AuthenticationError("invalid API key", status=401), "Hello.")
    chat.ask_later("Hi").complete_later()
    settle()

    chat.complete_later()
    settle()

    chat.refresh_from_db()
    assert (chat.state, chat.error) == (ChatState.IDLE, "")
    assert chat.messages.order_by("id").last().content == "Hello."


def test_a_transient_provider_error_is_retried_by_the_job(chat, scripted):
    scripted.add(RateLimitError("slow down", status=429, retry_after=0), "Hello.")
    chat.ask_later("Hi")

    with embedded(MODEL_RETRIES=0):  # so the retry is the job's, not the model call's
        chat.complete_later()
        settle()

    chat.refresh_from_db()
    assert chat.state == ChatState.IDLE
    assert chat.messages.order_by("id").last().content == "Hello."
    assert list(chat.usage_records.order_by("id").values_list("status", flat=True)) == [
        "failed",
        "succeeded",
    ]


def test_a_job_gives_up_after_step_retries_and_marks_the_chat_failed(chat, scripted):
    scripted.add(*[RateLimitError("slow down", status=429, retry_after=0) for _ in range(3)])
    chat.ask_later("Hi")

    with embedded(MODEL_RETRIES=0, STEP_RETRIES=2):
        chat.complete_later()
        settle()

    chat.refresh_from_db()
    assert chat.state == ChatState.FAILED
    assert chat.error.startswith("Gave up after 3 attempts: RateLimitError: slow down")
    assert chat.usage_records.filter(status="failed").count() == 3
    scripted.assert_complete()


def test_a_cancel_while_a_job_streams_stops_it_and_keeps_the_partial(chat, user):
    started = threading.Event()

    def answer(request):
        started.set()
        return stream(*[f"w{i} " for i in range(500)], delay=0.01)

    from agentloop import providers

    providers.register("slowstream", FunctionProvider(answer))
    try:
        chat.with_model("slowstream:test").ask_later("Tell me a long story")
        chat.complete_later()
        assert started.wait(JOB_DEADLINE)

        Chat.objects.get(pk=chat.pk).cancel()  # another instance, as a view would
        settle()
    finally:
        providers.unregister("slowstream")

    chat.refresh_from_db()
    assert chat.state == ChatState.IDLE
    assert chat.cancel_requested_at is None
    (answer_row,) = chat.messages.filter(role="assistant")
    assert answer_row.status == MessageStatus.CANCELLED
    assert answer_row.content.startswith("w0 ")
    assert list(chat.usage_records.values_list("status", flat=True)) == ["cancelled"]


def test_a_chat_cancelled_in_the_background_completes_the_next_question(chat, scripted):
    scripted.add("First.")
    chat.ask_later("Hi")
    with transaction.atomic():  # the job is sent at commit: after the cancel
        chat.complete_later()
        assert chat.cancel() is True  # queued: the job's first checkpoint stops it
    settle()
    chat.refresh_from_db()
    assert chat.state == ChatState.IDLE
    assert transcript(chat, "role", "status") == [("user", "complete")]

    chat.ask_later("Hi again").complete_later()
    settle()

    assert chat.messages.order_by("id").last().content == "First."


def test_a_cancel_that_comes_as_the_last_answer_is_saved_does_not_stop_the_next_question(
    chat, scripted
):
    """As with complete(): a Stop pressed just as the run ends has nothing left to stop."""
    scripted.add("First answer.", "Second answer.")
    chat.ask_later("Hi")

    def stop_pressed_too_late(sender, chat, message, **kwargs):
        if message.role == "assistant":
            Chat.objects.get(pk=chat.pk).cancel()

    signals.message_added.connect(stop_pressed_too_late)
    try:
        chat.complete_later()
        settle()
    finally:
        signals.message_added.disconnect(stop_pressed_too_late)
    chat.refresh_from_db()
    assert (chat.state, chat.cancel_requested_at) == (ChatState.IDLE, None)

    chat.ask_later("And then?").complete_later()
    settle()

    assert chat.messages.order_by("id").last().content == "Second answer."


def test_a_step_of_a_deleted_chat_reports_missing(chat):
    pk = chat.pk
    chat.delete()

    assert run_step(pk) == StepOutcome("missing")


def test_the_heartbeat_renews_the_lease_while_it_runs(chat):
    lease = Lease.take(Chat, chat.pk, seconds=0.6)  # renewed every 0.2 s
    expire(lease)

    heartbeats.start(lease)
    try:
        eventually(
            lambda: Chat.objects.filter(pk=chat.pk, lease_expires_at__gt=timezone.now()).exists(),
            "the heartbeat to renew the lease",
        )
    finally:
        heartbeats.stop(lease)
    assert not lease.lost.is_set()


def test_the_heartbeat_notices_a_lost_lease(chat):
    lease = Lease.take(Chat, chat.pk)
    expire(lease)
    Lease.take(Chat, chat.pk)

    beat(lease)

    assert lease.lost.is_set()


@pytest.mark.django_db(transaction=True)
def test_a_message_added_while_a_worker_holds_the_chat_is_refused_not_stranded(scripted):
    """A user message saved while a worker's model call runs would sort before the answer
    and never be answered: ask_later refuses it instead (ChatBusyError), losing nothing."""
    from agentloop.django_store.leases import Lease
    from agentloop.exceptions import ChatBusyError

    chat = Chat.objects.create(model="scripted:test")
    chat.ask_later("first")
    lease = Lease.take(Chat, chat.pk)
    assert lease is not None
    visitor = Chat.objects.get(pk=chat.pk)
    with pytest.raises(ChatBusyError):
        visitor.ask_later("second")
    assert list(chat.messages.values_list("content", flat=True)) == ["first"]
    lease.release(state="idle")
    visitor.ask_later("second")  # free again: accepted
    assert list(chat.messages.values_list("content", flat=True)) == ["first", "second"]

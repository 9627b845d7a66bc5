"""Set-based control: ``Chat.objects.filter(...).cancel()``, ``.halt(reason)``,
``.complete_later()``, ``.resume()``, ``.with_model(...)``: one conditional UPDATE per batch of
chats, never over a running step, the per-chat verb's follow-up for the chats changed, and
the counts. (Real workers: tests/test_bulk_control_celery.py.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from agentloop.engine._loop import CANCELLED_TOOL_RESULT
from agentloop.exceptions import UnknownProviderError
from agentloop.models import Chat, ChatState, Message, ToolCall
from agentloop.models.bulk import BulkResult
from agentloop.process import cancel_notices, redis_client
from agentloop.runners import wait_for_embedded_jobs
from agentloop.testing import tool_call
from tests.helpers import wait_until
from tests.redis_server import RedisServer, private_redis
from tests.tools import transfer

pytestmark = pytest.mark.django_db(transaction=True)


def make(count: int, **fields) -> list[Chat]:
    return [Chat.objects.create(model="scripted:test", **fields) for _ in range(count)]


def held(chat: Chat) -> Chat:
    """Leased by a run of another process, as a worker's claim leaves it."""
    expires = timezone.now() + timedelta(seconds=60)
    Chat.objects.filter(pk=chat.pk).update(
        state=ChatState.RUNNING, lease_token="other-run", lease_expires_at=expires
    )
    return chat


def column(chats: list[Chat], name: str) -> list:
    by_pk = dict(Chat.objects.filter(pk__in=[c.pk for c in chats]).values_list("pk", name))
    return [by_pk[chat.pk] for chat in chats]


# -- halt -----------------------------------------------------------------------------------------
def test_halt_asks_only_the_chats_a_run_is_on_for_and_counts_them():
    idle = make(2)
    queued = make(2, state=ChatState.QUEUED)
    running = [held(chat) for chat in make(2)]

    result = Chat.objects.all().halt("provider   outage\n")

    assert (result.matched, result.changed, result.skipped) == (6, 4, 2)
    assert column(idle, "halt_reason") == ["", ""]
    assert column(queued + running, "halt_reason") == ["provider outage"] * 4
    # Nothing else of a run's changes: its state and its lease are the run's.
    assert column(running, "lease_token") == ["other-run", "other-run"]
    assert column(running, "state") == ["running", "running"]


def test_a_queued_chat_halted_in_bulk_stops_before_its_model_call(scripted):
    (chat,) = make(1)
    chat.ask_later("Hi")
    scripted.add("never sent")
    with transaction.atomic():  # queued, its job not yet sent
        chat.complete_later()
        assert Chat.objects.filter(pk=chat.pk).halt("outage").changed == 1
    wait_for_embedded_jobs()

    chat.refresh_from_db()
    assert (chat.state, chat.stop_reason) == ("stopped", "halted: outage")
    assert scripted.requests == []
    assert not chat.messages.filter(status="cancelled").exists()


def test_bulk_verbs_run_one_statement_per_batch(django_assert_num_queries):
    make(25, state=ChatState.QUEUED)
    # A count, three UPDATEs of at most 10 chats, and the check that nothing is left.
    with django_assert_num_queries(5):
        result = Chat.objects.all().halt("outage", batch_size=10)
    assert result.changed == 25
    assert Chat.objects.filter(halt_reason="outage").count() == 25


def test_thousands_of_chats_are_changed_a_thousand_per_statement(django_assert_num_queries):
    Chat.objects.bulk_create([Chat(model="scripted:test", state="queued") for _ in range(2500)])
    Chat.objects.bulk_create([Chat(model="scripted:test") for _ in range(500)])
    # A count, three UPDATEs (1000, 1000, 500 changed), the check that nothing is left.
    with django_assert_num_queries(5):
        result = Chat.objects.all().halt("outage")
    assert (result.matched, result.changed, result.skipped) == (3000, 2500, 500)
    assert Chat.objects.filter(halt_reason="outage").count() == 2500


def test_a_halt_notifies_each_chat_in_one_call(monkeypatch):
    chats = make(3, state=ChatState.QUEUED)
    calls = []
    monkeypatch.setattr(
        "agentloop.models.bulk.notify_many",
        lambda model, pks, halt=False: calls.append((model, sorted(pks), halt)),
    )
    Chat.objects.all().halt("outage")
    assert calls == [(Chat, sorted(chat.pk for chat in chats), True)]


def test_a_local_run_is_woken_by_a_bulk_halt():
    (chat,) = make(1, state=ChatState.QUEUED)
    notice = cancel_notices.listen_locally(chat)
    Chat.objects.filter(pk=chat.pk).halt("outage")
    assert notice.is_set()
    assert notice.cancelling is False  # a halt lets a model call in flight finish


@pytest.fixture
def on_private_redis(tmp_path, settings) -> Iterator[RedisServer]:
    """Cancel notices through a ``redis-server`` of this test's own."""
    with private_redis(tmp_path) as server:
        settings.AGENTLOOP = {
            **settings.AGENTLOOP, "REDIS_URL": server.url(), "REDIS_PREFIX": "bulk",
        }  # fmt: skip
        yield server
        cancel_notices.stop_subscribers()


def test_a_batch_s_notices_are_one_redis_message_naming_every_chat(on_private_redis):
    chats = make(3, state=ChatState.QUEUED)
    with on_private_redis.client() as client:
        listening = client.pubsub(ignore_subscribe_messages=True)
        listening.subscribe(redis_client.key("cancel", cancel_notices.MANY))

        Chat.objects.all().halt("outage", batch_size=2)

        received = [listening.get_message(timeout=5) for _ in range(3)]
        listening.close()
    payloads = [json.loads(message["data"]) for message in received if message]
    assert payloads == [
        {"halt": True, "chats": [f"agentloop.chat:{chat.pk}" for chat in chats[:2]]},
        {"halt": True, "chats": [f"agentloop.chat:{chats[2].pk}"]},
    ]


def test_a_message_for_many_chats_wakes_their_runs_in_another_process(on_private_redis):
    running, halted = Chat(pk=4301), Chat(pk=4302)  # a chat key is all a notice needs
    notices = [cancel_notices.listen_locally(chat) for chat in (running, halted)]
    channel = redis_client.key("cancel", cancel_notices.MANY)

    def heard(notice, halt: bool, chat: Chat) -> bool:
        # As another process's notify_many does; again until the subscriber is listening.
        with on_private_redis.client() as client:
            client.publish(
                channel, json.dumps({"halt": halt, "chats": [f"agentloop.chat:{chat.pk}"]})
            )
        return notice.wait(0.2)

    with ExitStack() as listening:
        for chat, notice in zip((running, halted), notices, strict=True):
            listening.enter_context(cancel_notices.RedisCancelListener(chat, notice))
        wait_until(lambda: heard(notices[0], False, running), "the cancel of many chats")
        wait_until(lambda: heard(notices[1], True, halted), "the halt of many chats")
    assert (notices[0].cancelling, notices[1].cancelling) == (True, False)


# -- cancel ---------------------------------------------------------------------------------------
def test_cancel_flags_the_chats_with_a_run_and_sets_nothing_on_the_others():
    idle = make(2)
    running = [held(chat) for chat in make(2)]
    queued = make(1, state=ChatState.QUEUED)
    earlier = timezone.now() - timedelta(minutes=5)
    Chat.objects.filter(pk=queued[0].pk).update(cancel_requested_at=earlier)

    result = Chat.objects.order_by("-pk").cancel()

    assert (result.matched, result.changed, result.skipped) == (5, 3, 2)
    assert column(idle, "cancel_requested_at") == [None, None]
    assert all(column(running, "cancel_requested_at"))
    assert column(queued, "cancel_requested_at") == [earlier]  # the first request's time kept
    assert column(running, "state") == ["running", "running"]


def test_cancel_wakes_each_run_as_a_cancel():
    (chat,) = make(1, state=ChatState.QUEUED)
    notice = cancel_notices.listen_locally(chat)
    Chat.objects.all().cancel()
    assert notice.is_set() and notice.cancelling


def test_cancel_answers_the_held_calls_of_chats_waiting_for_a_person(scripted, user):
    chat = Chat.objects.create(model="scripted:test", owner=user).with_tools(transfer)
    scripted.add(tool_call("transfer", {"amount": 5, "to": "bob"}, id="t1"))
    chat.ask("Pay Bob")
    Chat.objects.filter(pk=chat.pk).update(state=ChatState.WAITING)  # as a worker leaves it

    result = Chat.objects.all().cancel()

    assert (result.changed, result.details["waiting_chats_cancelled"]) == (1, 1)
    chat.refresh_from_db()
    assert (chat.state, chat.cancel_requested_at) == ("idle", None)
    call = ToolCall.objects.get(chat=chat)
    assert (call.state, call.decision) == ("cancelled", "cancelled")
    assert call.result.content == CANCELLED_TOOL_RESULT


def test_cancel_flags_the_running_subagents_of_the_chats_it_cancels():
    (parent,) = make(1, state=ChatState.QUEUED)
    message = Message.objects.create(chat=parent, role="assistant")
    call = ToolCall.objects.create(
        chat=parent, message=message, call_id="c1", name="research", state="waiting",
        wait_reason="subagent",
    )  # fmt: skip
    child = Chat.objects.create(
        model="scripted:test", parent=parent, parent_tool_call=call, state=ChatState.QUEUED
    )

    result = Chat.objects.filter(pk=parent.pk).cancel()

    assert (result.changed, result.details["subagents_flagged"]) == (1, 1)
    child.refresh_from_db()
    assert child.cancel_requested_at is not None


def test_cancel_reaches_the_subagent_a_waiting_chat_waits_for(user):
    parent = Chat.objects.create(model="scripted:test", owner=user, state=ChatState.WAITING)
    asked = Message.objects.create(chat=parent, role="assistant")
    research = ToolCall.objects.create(
        chat=parent, message=asked, call_id="r1", name="research", state="waiting",
        wait_reason="subagent",
    )  # fmt: skip
    child = Chat.objects.create(
        model="scripted:test", owner=user, parent=parent, parent_tool_call=research,
        state=ChatState.WAITING, tools=["tests.tools.transfer"],
    )  # fmt: skip
    paying = Message.objects.create(chat=child, role="assistant")
    payment = ToolCall.objects.create(
        chat=child, message=paying, call_id="t1", name="transfer", state="waiting",
        wait_reason="approval", arguments={"amount": 5, "to": "bob"},
    )  # fmt: skip

    assert Chat.objects.filter(pk=parent.pk).cancel().changed == 1

    payment.refresh_from_db()
    research.refresh_from_db()
    assert (payment.state, payment.decision) == ("cancelled", "cancelled")
    assert research.state != "waiting"  # the cancelled subagent released its parent's call
    assert research.result.is_error
    assert Chat.objects.get(pk=child.pk).state == ChatState.IDLE


# -- complete_later, resume -----------------------------------------------------------------------
def test_complete_later_queues_and_runs_every_chat_no_run_holds(scripted):
    chats = make(3)
    for chat in chats:
        chat.ask_later("Hi")
    failed = chats[2]
    Chat.objects.filter(pk=failed.pk).update(state=ChatState.FAILED, error="boom", attempts=3)
    running = held(make(1)[0])
    scripted.add("one", "two", "three")

    result = Chat.objects.all().complete_later()
    wait_for_embedded_jobs()

    assert (result.matched, result.changed, result.skipped) == (4, 3, 1)
    assert column(chats, "state") == ["idle"] * 3
    assert column(chats, "error") == [""] * 3
    assert sorted(m.content for m in Message.objects.filter(role="assistant")) == [
        "one", "three", "two",
    ]  # fmt: skip
    assert column([running], "state") == ["running"]


def test_resume_sends_on_only_stopped_and_failed_chats(scripted):
    stopped, failed, idle, waiting = make(4)
    for chat in (stopped, failed, idle):
        chat.ask_later("Hi")
    Chat.objects.filter(pk=stopped.pk).update(state=ChatState.STOPPED, stop_reason="halted: x")
    Chat.objects.filter(pk=failed.pk).update(state=ChatState.FAILED, error="boom")
    Chat.objects.filter(pk=waiting.pk).update(state=ChatState.WAITING)
    scripted.add("again", "again")

    result = Chat.objects.all().resume()
    wait_for_embedded_jobs()

    assert (result.matched, result.changed, result.skipped) == (4, 2, 2)
    assert column([stopped, failed, idle, waiting], "state") == ["idle", "idle", "idle", "waiting"]
    assert list(idle.messages.values_list("role", flat=True)) == ["user"]  # not run


def test_complete_later_sends_each_batch_once_committed(django_capture_on_commit_callbacks):
    make(5)
    with transaction.atomic(), django_capture_on_commit_callbacks() as callbacks:
        result = Chat.objects.all().complete_later(batch_size=2)
    wait_for_embedded_jobs()
    assert result.changed == 5
    assert len(callbacks) == 3  # one send per batch of two, after the commit
    assert column(list(Chat.objects.all()), "state") == ["idle"] * 5


# -- with_model -----------------------------------------------------------------------------------
def test_with_model_switches_the_chats_no_run_holds_and_skips_running_ones():
    idle = make(2)
    queued = make(1, state=ChatState.QUEUED)
    running = [held(chat) for chat in make(1)]

    result = Chat.objects.all().with_model("offline:test")

    assert (result.matched, result.changed, result.skipped) == (4, 3, 1)
    assert column(idle + queued, "model") == ["offline:test"] * 3
    assert column(running, "model") == ["scripted:test"]


def test_with_model_of_an_unknown_provider_changes_nothing():
    make(2)
    with pytest.raises(UnknownProviderError):
        Chat.objects.all().with_model("nowhere:model")
    assert set(Chat.objects.values_list("model", flat=True)) == {"scripted:test"}


def test_a_chat_whose_lease_expired_counts_as_not_running_for_with_model():
    (chat,) = make(1)
    Chat.objects.filter(pk=chat.pk).update(
        lease_token="dead-run", lease_expires_at=timezone.now() - timedelta(seconds=5)
    )
    assert Chat.objects.all().with_model("offline:test").changed == 1


# -- the queryset ---------------------------------------------------------------------------------
def test_dry_run_counts_and_changes_nothing(django_assert_num_queries):
    make(3)
    make(2, state=ChatState.QUEUED)
    with django_assert_num_queries(2):
        result = Chat.objects.all().halt("outage", dry_run=True)
    assert result == BulkResult("halt", matched=5, changed=2, dry_run=True)
    assert str(result) == "halt: 5 matched, 2 would change, 3 skipped"
    assert not Chat.objects.exclude(halt_reason="").exists()


def test_the_verbs_are_on_querysets_only_as_delete_is():
    for verb in ("cancel", "halt", "complete_later", "resume", "with_model"):
        assert not hasattr(Chat.objects, verb)
        assert callable(getattr(Chat.objects.all(), verb))


def test_a_sliced_queryset_changes_only_its_slice():
    chats = make(5, state=ChatState.QUEUED)
    result = Chat.objects.order_by("pk")[:2].halt("outage")
    assert (result.matched, result.changed) == (2, 2)
    assert column(chats, "halt_reason") == ["outage", "outage", "", "", ""]


def test_a_filter_through_a_relation_selects_each_chat_once():
    chats = make(3, state=ChatState.QUEUED)
    for chat in chats[:2]:
        Message.objects.create(chat=chat, role="user", content="a")
        Message.objects.create(chat=chat, role="user", content="b")
    result = Chat.objects.filter(messages__role="user").halt("outage", batch_size=1)
    assert result.changed == 2
    assert column(chats, "halt_reason") == ["outage", "outage", ""]


def test_on_batch_gets_the_keys_each_batch_changed():
    chats = make(5, state=ChatState.QUEUED)
    batches: list[list] = []
    Chat.objects.all().halt("outage", batch_size=2, on_batch=batches.append)
    assert batches == [[c.pk for c in chats[:2]], [c.pk for c in chats[2:4]], [chats[4].pk]]


def test_a_batch_size_below_one_is_refused():
    with pytest.raises(ValueError, match="batch_size must be at least 1"):
        Chat.objects.all().halt("outage", batch_size=0)


def test_a_stopped_chat_sent_on_in_the_background_ends_idle_not_running(scripted):
    # The answer's write releases the chat (idle) and clears the stop reason; it must not set
    # "running" again after the release (a free chat stuck "running" until the sweeper).
    (chat,) = make(1)
    chat.ask_later("Hi")
    Chat.objects.filter(pk=chat.pk).update(state=ChatState.STOPPED, stop_reason="halted: x")
    scripted.add("again")

    Chat.objects.get(pk=chat.pk).complete_later()
    wait_for_embedded_jobs()

    chat.refresh_from_db()
    assert (chat.state, chat.stop_reason, chat.lease_token) == ("idle", "", "")

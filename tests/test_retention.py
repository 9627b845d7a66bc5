"""Retention: ``agentloop.data.delete_idle_chats`` (and ``manage.py agentloop retention``), the
``RETENTION_DAYS`` setting and its checks (docs/data-retention.md). The task run by a real
worker is in tests/test_data_erasure_celery.py."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.utils import timezone

from agentloop import checks, data
from agentloop.models import Chat, Message, ToolCall, Usage

pytestmark = pytest.mark.django_db

DAYS = 90


def aged(chat: Chat, days: float, *, messages: float | None = None) -> Chat:
    """``chat`` last touched ``days`` ago; its messages ``messages`` days ago (default: same)."""
    then = timezone.now() - timedelta(days=days)
    Chat.objects.filter(pk=chat.pk).update(created_at=then, updated_at=then)
    written = timezone.now() - timedelta(days=days if messages is None else messages)
    Message.objects.filter(chat=chat).update(created_at=written)
    return chat


def a_chat(owner, *, parent=None, **fields) -> Chat:
    chat = Chat.objects.create(model="openai:gpt-4.1-mini", owner=owner, parent=parent, **fields)
    answer = Message.objects.create(chat=chat, role="assistant", content="hello")
    Usage.objects.create(chat=chat, message=answer, owner=owner, model="m", status="succeeded")
    return chat


def test_chats_idle_longer_than_the_period_are_deleted_and_their_usage_kept(user):
    old, fresh = aged(a_chat(user), DAYS + 1), aged(a_chat(user), DAYS - 1)

    report = data.delete_idle_chats(DAYS)

    assert list(Chat.objects.values_list("pk", flat=True)) == [fresh.pk]
    assert (report.deleted.chats, report.deleted.messages) == (1, 1)
    assert Usage.objects.filter(chat=None, owner=user).count() == 1  # accounting stays
    assert not Message.objects.filter(chat_id=old.pk).exists()


def test_a_recent_message_keeps_a_chat_whose_row_is_old(user):
    chat = aged(a_chat(user), DAYS + 10, messages=1)

    data.delete_idle_chats(DAYS)

    assert Chat.objects.filter(pk=chat.pk).exists()


@pytest.mark.parametrize("state", ["queued", "running"])
def test_a_chat_in_flight_is_never_deleted(user, state):
    chat = aged(a_chat(user), DAYS + 1)
    Chat.objects.filter(pk=chat.pk).update(state=state)

    data.delete_idle_chats(DAYS)

    assert Chat.objects.filter(pk=chat.pk).exists()


def test_a_chat_held_by_a_lease_is_never_deleted(user):
    chat = aged(a_chat(user), DAYS + 1)
    Chat.objects.filter(pk=chat.pk).update(lease_token="held", lease_expires_at=timezone.now())

    data.delete_idle_chats(DAYS)

    assert Chat.objects.filter(pk=chat.pk).exists()


def test_idle_waiting_and_failed_chats_go(user):
    for state in ("waiting", "failed", "stopped"):
        chat = aged(a_chat(user), DAYS + 1)
        Chat.objects.filter(pk=chat.pk).update(state=state)

    assert data.delete_idle_chats(DAYS).deleted.chats == 3


def test_subagent_chats_go_with_their_parent(user):
    parent = aged(a_chat(user), DAYS + 1)
    child = aged(a_chat(user, parent=parent), DAYS + 1)
    grandchild = aged(a_chat(user, parent=child), DAYS + 1)

    report = data.delete_idle_chats(DAYS)

    assert not Chat.objects.filter(pk__in=[parent.pk, child.pk, grandchild.pk]).exists()
    assert report.deleted.chats == 3


def test_a_conversation_with_an_active_subagent_stays_whole(user):
    parent = aged(a_chat(user), DAYS + 1)
    child = aged(a_chat(user, parent=parent), DAYS + 1)
    grandchild = aged(a_chat(user, parent=child), 1)  # active: the whole family stays

    report = data.delete_idle_chats(DAYS)

    assert Chat.objects.filter(pk__in=[parent.pk, child.pk, grandchild.pk]).count() == 3
    assert (report.deleted.chats, report.kept_for_subagents) == (0, 1)


def test_an_old_subagent_chat_of_an_active_parent_is_not_deleted_alone(user):
    parent = aged(a_chat(user), 1)
    child = aged(a_chat(user, parent=parent), DAYS + 1)

    data.delete_idle_chats(DAYS)

    assert Chat.objects.filter(pk=child.pk).exists()


def test_deleting_leaves_no_tool_call_or_message_of_a_deleted_chat(user):
    chat = a_chat(user)
    answer = chat.messages.get()
    call = ToolCall.objects.create(chat=chat, message=answer, call_id="c", name="pay")
    Message.objects.create(chat=chat, role="tool", content="paid", tool_call=call)
    aged(chat, DAYS + 1)

    data.delete_idle_chats(DAYS)

    assert not ToolCall.objects.exists()
    assert not Message.objects.exists()


def test_the_period_comes_from_the_setting_and_none_deletes_nothing(user, settings):
    aged(a_chat(user), 40)

    assert data.delete_idle_chats().deleted.chats == 0  # RETENTION_DAYS is None by default
    assert str(data.delete_idle_chats()).startswith("No retention")
    settings.AGENTLOOP = {**settings.AGENTLOOP, "RETENTION_DAYS": 30}
    assert data.delete_idle_chats().deleted.chats == 1


@pytest.mark.parametrize("days", [0, -1, 1.5, "90", True])
def test_a_period_that_is_not_a_whole_number_of_days_is_refused(days):
    with pytest.raises(ValueError, match="whole number of days"):
        data.delete_idle_chats(days)


def test_the_queries_per_batch_dont_grow_with_the_chats(user, django_assert_max_num_queries):
    for _ in range(30):
        aged(a_chat(user), DAYS + 1)

    # 28: the expired memories' look (1), and the message embeddings of the chats and of
    # their messages (2, Django's collector) since past chats became searchable.
    with django_assert_max_num_queries(28):
        assert data.delete_idle_chats(DAYS).deleted.chats == 30


# -- the command ---------------------------------------------------------------------------------
def test_the_retention_command_counts_with_dry_run_then_deletes(user):
    aged(a_chat(user), DAYS + 1)
    out = io.StringIO()

    call_command("agentloop", "retention", "--days", str(DAYS), "--dry-run", stdout=out)
    assert out.getvalue().strip() == (
        f"1 chats are idle for more than {DAYS} days and 0 memories are past their expiry "
        "(none deleted)."
    )
    assert Chat.objects.count() == 1

    call_command("agentloop", "retention", "--days", str(DAYS), stdout=out)
    assert Chat.objects.count() == 0
    assert "Deleted 1 chats idle for more than 90 days" in out.getvalue()


def test_the_retention_command_refuses_a_bad_period_in_one_line():
    with pytest.raises(CommandError, match=r"^--days must be a whole number of days"):
        call_command("agentloop", "retention", "--days", "0")
    with pytest.raises(CommandError, match="No retention period"):
        call_command("agentloop", "retention", "--dry-run")


# -- the checks ----------------------------------------------------------------------------------
@pytest.mark.parametrize("days", [0, "90", 2.5, True])
def test_check_e011_refuses_a_retention_period_that_is_not_whole_days(settings, days):
    settings.AGENTLOOP = {"RETENTION_DAYS": days}

    (error,) = [e for e in checks.check_settings() if e.id == "agentloop.E011"]

    assert error.msg == (
        f"AGENTLOOP['RETENTION_DAYS'] must be None or a whole number of days of at least 1, "
        f"not {days!r}."
    )


@pytest.mark.parametrize("days", [None, 1, 365])
def test_check_e011_passes_none_or_whole_days(settings, days):
    settings.AGENTLOOP = {"RETENTION_DAYS": days}
    assert checks.check_settings() == []


@pytest.fixture
def celery_runner(settings):
    """The Celery runner chosen, with a broker on the current app (restored after)."""
    from celery import current_app

    conf = current_app.conf
    previous = (conf.broker_url, conf.beat_schedule)
    conf.broker_url = "redis://127.0.0.1:6379/15"
    settings.AGENTLOOP = {"RUNNER": "celery", "RETENTION_DAYS": 30}
    yield conf
    conf.broker_url, conf.beat_schedule = previous


def test_check_w006_warns_when_beat_never_runs_the_retention_task(celery_runner):
    celery_runner.beat_schedule = {"sweeper": {"task": "agentloop.resume_stalled_chats"}}

    (warning,) = checks.check_retention_scheduled()

    assert warning.id == "agentloop.W006"
    assert "'agentloop.delete_idle_chats'" in warning.msg
    assert "manage.py agentloop retention" in warning.hint


def test_check_w006_passes_with_the_task_in_the_schedule(celery_runner):
    celery_runner.beat_schedule = {
        "retention": {"task": "agentloop.delete_idle_chats", "schedule": 86400.0}
    }
    assert checks.check_retention_scheduled() == []


def test_check_w006_passes_with_agentloops_beat_schedule_and_says_to_use_it(celery_runner):
    from agentloop.tasks import beat_schedule

    celery_runner.beat_schedule = beat_schedule()
    assert checks.check_retention_scheduled() == []

    celery_runner.beat_schedule = beat_schedule(delete_idle_chats=None)
    (warning,) = checks.check_retention_scheduled()
    assert "CELERY_BEAT_SCHEDULE = beat_schedule()" in warning.hint


@override_settings(AGENTLOOP={"RUNNER": "embedded", "RETENTION_DAYS": 30})
def test_check_w006_is_quiet_without_celery():
    assert checks.check_retention_scheduled() == []

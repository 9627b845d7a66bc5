"""agentloop's Celery tasks: beat's schedule for the periodic ones (``beat_schedule()``)."""

from __future__ import annotations

import pytest
from celery import current_app

from agentloop import ConfigurationError, tasks
from agentloop.evals.running import CASE_TASK
from agentloop.runners.celery import STEP_TASK
from agentloop.tasks import PERIODIC_TASKS, beat_schedule


def agentloop_tasks() -> set[str]:
    """The tasks agentloop registers with Celery (the module's shared tasks)."""
    current_app.loader.import_default_modules()
    return {name for name in current_app.tasks if name.startswith("agentloop.")}


def test_the_schedule_names_every_periodic_task_and_nothing_else():
    scheduled = {entry["task"] for entry in beat_schedule().values()}

    assert agentloop_tasks() - {STEP_TASK, CASE_TASK} == scheduled
    assert set(PERIODIC_TASKS) == scheduled
    for name in scheduled:  # each is a task of agentloop.tasks, by that name
        assert any(getattr(task, "name", None) == name for task in vars(tasks).values())


def test_the_default_schedule():
    assert beat_schedule() == {
        "agentloop-resume-stalled-chats": {
            "task": "agentloop.resume_stalled_chats",
            "schedule": 60.0,
        },
        "agentloop-poll-batches": {"task": "agentloop.poll_batches", "schedule": 300.0},
        "agentloop-delete-idle-chats": {
            "task": "agentloop.delete_idle_chats",
            "schedule": 86400.0,
        },
        "agentloop-embed-past-messages": {
            "task": "agentloop.embed_past_messages",
            "schedule": 60.0,
        },
    }


def test_periods_are_seconds_and_none_leaves_an_optional_task_out():
    schedule = beat_schedule(
        resume_stalled_chats=10, poll_batches=None, delete_idle_chats=3600, embed_past_messages=None
    )

    assert schedule == {
        "agentloop-resume-stalled-chats": {
            "task": "agentloop.resume_stalled_chats",
            "schedule": 10.0,
        },
        "agentloop-delete-idle-chats": {"task": "agentloop.delete_idle_chats", "schedule": 3600.0},
    }


@pytest.mark.parametrize(
    ("options", "error"),
    [
        (
            {"resume_stalled_chats": None},
            r"resume_stalled_chats=\.\.\.\) takes a number of seconds above 0, not None",
        ),
        (
            {"poll_batches": 0},
            r"poll_batches=\.\.\.\) takes a number of seconds above 0 or None, not 0",
        ),
        ({"delete_idle_chats": "daily"}, r"delete_idle_chats=\.\.\.\) takes .* not 'daily'"),
        ({"poll_batches": True}, r"not True"),
    ],
)
def test_a_period_that_is_no_positive_number_is_refused(options, error):
    with pytest.raises(ConfigurationError, match=error):
        beat_schedule(**options)

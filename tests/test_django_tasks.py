"""The django.tasks runner (docs/design.md §3): ``AGENTLOOP["RUNNER"] = "django_tasks"`` runs
each step as a task of the project's own tasks backend (Django 6)."""

from __future__ import annotations

import json
import subprocess
import sys

import django
import pytest
from django.test import override_settings

from agentloop.models import Chat, ChatState
from agentloop.runners import runner_name as backend_name
from tests.processes import REPO_ROOT, process_env
from tests.tools import step_one, step_two

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(django.VERSION < (6, 0), reason="django.tasks needs Django 6"),
]

IMMEDIATE = {"default": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"}}


@pytest.fixture
def tasks_runner(settings):
    with override_settings(
        TASKS=IMMEDIATE, AGENTLOOP={**settings.AGENTLOOP, "RUNNER": "django_tasks"}
    ):
        yield


def test_the_runner_setting_chooses_django_tasks(tasks_runner):
    assert backend_name() == "django_tasks"


def test_complete_later_runs_a_tool_conversation_through_the_tasks_backend(tasks_runner, user):
    from django.tasks.signals import task_finished

    finished = []

    def record(sender, task_result, **kwargs):
        finished.append(task_result.return_value)

    task_finished.connect(record)
    try:
        chat = Chat.objects.create(model="rules:test", owner=user).with_tools(step_one, step_two)
        chat.ask_later("tools:step_one|step_two").complete_later()
    finally:
        task_finished.disconnect(record)

    chat.refresh_from_db()
    assert chat.state == ChatState.IDLE and chat.lease_token == ""
    assert [m.role for m in chat.messages.order_by("id")] == [
        "user", "assistant", "tool", "assistant", "tool", "assistant"
    ]  # fmt: skip
    # One task per step: model, tool, model, tool, model.
    assert sorted(finished) == sorted(["again", "again", "again", "again", "done"])


@pytest.mark.subprocess
def test_a_db_worker_process_runs_the_conversation_from_the_database_backend(settings, user):
    """A real worker process (django-tasks-db's ``db_worker``) takes the steps from the
    database, each step enqueueing the next as a task row."""
    pytest.importorskip("django_tasks_db")
    database = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default"]}}
    agentloop = {**settings.AGENTLOOP, "RUNNER": "django_tasks"}
    with override_settings(TASKS=database, AGENTLOOP=agentloop):
        chat = Chat.objects.create(model="rules:test", owner=user).with_tools(step_one, step_two)
        chat.ask_later("tools:step_one|step_two").complete_later()
    worker = subprocess.run(  # noqa: S603 - our own interpreter
        [sys.executable, "-m", "django", "db_worker", "--batch", "--no-startup-delay"],
        env=process_env(
            AGENTLOOP_TEST_TASKS="database",
            AGENTLOOP_TEST_SETTINGS=json.dumps({"RUNNER": "django_tasks"}),
        ),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert worker.returncode == 0, worker.stderr
    chat.refresh_from_db()
    assert (chat.state, chat.lease_token) == (ChatState.IDLE, "")
    assert chat.messages.order_by("id").last().content.startswith("done: ")
    assert [m.role for m in chat.messages.order_by("id")] == [
        "user", "assistant", "tool", "assistant", "tool", "assistant"
    ]  # fmt: skip

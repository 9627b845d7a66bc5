"""The django.tasks runner (docs/design.md §3): ``AGENTLOOP["RUNNER"] = "django_tasks"`` runs
each step as a task of the project's own tasks backend (Django 6)."""

from __future__ import annotations

import django
import pytest
from django.test import override_settings

from agentloop.background import backend_name
from agentloop.models import Chat, ChatState
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

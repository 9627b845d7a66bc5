"""A chat model of the project's own (docs/custom-models.md): ``example_project``'s
``SupportConversation`` with its own message, tool-call and usage models runs the loop in
process and in the background, shows in the admin, and the checks refuse what can't work."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import models
from django.test import override_settings
from django.test.utils import isolate_apps
from django.urls import reverse

from agentloop.checks import chat_model_problems
from agentloop.conf import agentloop_settings, get_chat_model
from agentloop.models import AbstractChat, AbstractMessage, ChatState
from agentloop.runners import wait_for_embedded_jobs
from agentloop.testing import tool_call
from example_project.models import SupportConversation, SupportUsage, Ticket
from tests.tools import add, step_one


@pytest.mark.django_db
def test_a_project_chat_model_runs_the_loop_with_its_own_tables(user, scripted):
    ticket = Ticket.objects.create(subject="Refund")
    chat = SupportConversation.objects.create(model="scripted:test", owner=user, ticket=ticket)
    scripted.add(tool_call("add", {"a": 2, "b": 3}), "5.")

    answer = chat.with_tools(add).ask("2 + 3?")

    assert answer.content == "5."
    assert type(answer).__name__ == "SupportMessage"
    assert [m.role for m in chat.messages.order_by("id")] == [
        "user", "assistant", "tool", "assistant"
    ]  # fmt: skip
    assert chat.tool_calls.get().result.content == "5"
    assert SupportUsage.objects.filter(chat=chat).count() == 2
    assert ticket.conversations.get() == chat


@pytest.mark.django_db(transaction=True)
def test_a_project_chat_model_runs_in_the_background_by_its_label(user):
    chat = SupportConversation.objects.create(model="rules:test", owner=user)
    chat.with_tools(step_one).ask_later("tools:step_one").complete_later()

    assert wait_for_embedded_jobs(60)
    chat.refresh_from_db()
    assert (chat.state, chat.lease_token) == (ChatState.IDLE, "")
    assert chat.messages.order_by("id").last().content == "done: one done"


@pytest.mark.django_db
def test_the_admin_shows_a_project_chat_models_timeline(admin_client, user, scripted):
    chat = SupportConversation.objects.create(model="scripted:test", owner=user)
    scripted.add("Hello <b>there</b>")
    chat.ask("Hi")

    page = admin_client.get(
        reverse("admin:example_project_supportconversation_change", args=[chat.pk])
    )

    assert page.status_code == 200
    assert "Hello &lt;b&gt;there&lt;/b&gt;" in page.content.decode()


def test_chat_model_setting_names_the_model_the_views_serve():
    with override_settings(AGENTLOOP={"CHAT_MODEL": "example_project.SupportConversation"}):
        agentloop_settings.reload()
        assert get_chat_model() is SupportConversation


@pytest.mark.parametrize(
    ("label", "says"),
    [("nothing", "form 'app_label.ModelName'"), ("example_project.Missing", "not installed")],
)
def test_a_chat_model_setting_that_names_no_model_is_improperly_configured(label, says):
    with override_settings(AGENTLOOP={"CHAT_MODEL": label}):
        agentloop_settings.reload()
        with pytest.raises(ImproperlyConfigured, match=says):
            get_chat_model()


def test_the_installed_chat_models_pass_the_check():
    assert chat_model_problems(SupportConversation) == []


@isolate_apps("example_project")
def test_a_chat_model_with_other_related_names_is_refused_with_a_clear_check():
    """RubyLLM's acts_as_chat lets a project name the relations; agentloop reads them by
    ``messages``, ``tool_calls`` and ``usage_records`` and says so instead of failing later."""

    class Conversation(AbstractChat):
        class Meta:
            app_label = "example_project"

    class Utterance(AbstractMessage):
        chat = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="lines")

        class Meta:
            app_label = "example_project"

    problems = chat_model_problems(Conversation)

    assert len(problems) == 3
    assert "related_name is 'messages'" in problems[0]
    assert "AbstractToolCall" in problems[1] and "AbstractUsage" in problems[2]

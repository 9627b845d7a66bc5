"""Thinking in persisted chats: stored on the message, streamed apart, shown collapsed and
escaped in the admin, and sent back after a reload only to the provider that made it."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from agentloop import chat as memory_chat
from agentloop.messages import TextDelta, ThinkingDelta
from agentloop.models import Chat
from agentloop.providers.anthropic import AnthropicProvider
from agentloop.testing import reply, stream
from tests.providers.wire import Recorder, anthropic_answer, registered

pytestmark = pytest.mark.django_db


def test_an_answers_thinking_is_stored_on_its_row(scripted):
    scripted.add(reply("8", thinking="5 + 3 = 8."))
    chat = Chat.objects.create(model="scripted:test").with_thinking("low")

    answer = chat.ask("What is 5 + 3?")

    assert Chat.objects.get(pk=chat.pk).messages.get(pk=answer.pk).thinking == "5 + 3 = 8."
    assert scripted.requests[0].thinking is not None
    assert scripted.requests[0].thinking.effort == "low"


def test_streamed_thinking_reaches_the_stream_apart_from_the_text(scripted):
    scripted.add(stream(ThinkingDelta(text="5 + 3"), ThinkingDelta(text=" = 8."), "8"))
    chat = Chat.objects.create(model="scripted:test")
    chunks: list[Any] = []

    answer = chat.ask("What is 5 + 3?", stream=chunks.append)

    assert [c.text for c in chunks if isinstance(c, ThinkingDelta)] == ["5 + 3", " = 8."]
    assert [c.text for c in chunks if isinstance(c, TextDelta)] == ["8"]
    assert (answer.content, answer.thinking) == ("8", "5 + 3 = 8.")


def test_a_memory_chat_keeps_thinking_too(scripted):
    scripted.add(reply("8", thinking="5 + 3 = 8."))

    answer = memory_chat("scripted:test").ask("What is 5 + 3?")

    assert answer.thinking == "5 + 3 = 8."


def test_the_admin_timeline_shows_thinking_collapsed_and_escaped(scripted, admin_client):
    scripted.add(reply("8", thinking="<script>alert(1)</script> 5 + 3"))
    chat = Chat.objects.create(model="scripted:test")
    chat.ask("What is 5 + 3?")

    page = admin_client.get(reverse("admin:agentloop_chat_change", args=[chat.pk])).content.decode()

    assert '<details class="agentloop-thinking"><summary>Thinking</summary>' in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt; 5 + 3" in page
    assert "<script>alert(1)" not in page


def test_signed_thinking_goes_back_after_a_reload_to_its_provider_only():
    first, backup = Recorder(), Recorder()
    first.responses += [anthropic_answer("8", signature="sig-A"), anthropic_answer("16")]
    backup.responses += [anthropic_answer("32")]
    with (
        registered("anthropic", AnthropicProvider(api_key="k", transport=first.transport())),
        registered(
            "anthropic-backup",
            AnthropicProvider(name="anthropic-backup", api_key="k", transport=backup.transport()),
        ),
    ):
        chat = Chat.objects.create(model="anthropic:claude-haiku-4-5").with_thinking("low")
        assert chat.ask("What is 5 + 3?").thinking == "About 8"

        Chat.objects.get(pk=chat.pk).with_model("anthropic-backup:claude-haiku-4-5").ask("x2?")
        Chat.objects.get(pk=chat.pk).with_model("anthropic:claude-haiku-4-5").ask("x2 again?")

    sent_to_backup = backup.bodies[0]["messages"][1]
    sent_back_home = first.bodies[1]["messages"][1]
    assert sent_to_backup == {"role": "assistant", "content": [{"type": "text", "text": "8"}]}
    assert sent_back_home["content"][0] == {
        "type": "thinking",
        "thinking": "About 8",
        "signature": "sig-A",
    }
    assert b'"signature":"sig-A"' in first.requests[1].content
    assert all(
        body["thinking"] == {"type": "enabled", "budget_tokens": 1024} for body in first.bodies
    )

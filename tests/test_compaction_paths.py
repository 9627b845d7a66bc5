"""Compaction on the other paths (docs/long-conversations.md): in the background, one step per
job, and in batches, where the chat is compacted before its call goes into the batch."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import override_settings

import agentloop
from agentloop import providers
from agentloop.batches import refresh as refresh_batch
from agentloop.engine.compaction import SUMMARY_INSTRUCTIONS, SUMMARY_PREFIX
from agentloop.messages import ModelRequest, TokenUsage
from agentloop.models import Chat, ChatState, Usage
from agentloop.providers.anthropic import AnthropicProvider
from agentloop.runners import wait_for_embedded_jobs
from agentloop.testing import FunctionProvider, reply
from tests.batch_server import FakeBatches

JOB_DEADLINE = 30.0
QUESTION = "Question {}: " + "please explain this at length " * 5


def is_summary_call(request: ModelRequest) -> bool:
    return request.messages[0].content == SUMMARY_INSTRUCTIONS


def answer(request: ModelRequest) -> object:
    """Reports its input as four characters a token; tells summary calls apart."""
    usage = TokenUsage(input_tokens=sum(len(m.content) for m in request.messages) // 4)
    if is_summary_call(request):
        return reply("The user asked numbered questions.", usage=usage)
    return reply("Answer: " + "words " * 30, usage=usage)


@pytest.fixture
def model():
    provider = FunctionProvider(answer)
    providers.register("scripted", provider)
    yield provider
    providers.unregister("scripted")


@pytest.mark.django_db(transaction=True)
def test_a_background_chat_is_compacted_between_jobs_and_keeps_answering(user, model):
    chat = Chat.objects.create(model="scripted:test", owner=user)
    chat.with_instructions("You answer.").with_context_window(300)
    chat.with_compaction(keep_recent=2)
    with override_settings(AGENTLOOP={**settings.AGENTLOOP, "BACKGROUND": "embedded"}):
        for turn in range(8):
            chat.ask_later(QUESTION.format(turn)).complete_later()
            assert wait_for_embedded_jobs(JOB_DEADLINE), "background jobs did not finish"

    chat.refresh_from_db()
    assert chat.state == ChatState.IDLE and chat.error == ""
    roles = list(chat.messages.values_list("role", flat=True))
    assert roles.count("user") == 8 and roles.count("assistant") == 8
    assert roles.count("summary") >= 1
    answers = [r for r in model.requests if not is_summary_call(r)]
    last = answers[-1].messages
    assert last[0].content == "You answer." and last[1].content.startswith(SUMMARY_PREFIX)
    assert sum(1 for m in last if m.content.startswith(SUMMARY_PREFIX)) == 1
    assert Usage.objects.filter(chat=chat, message__role="summary").count() == roles.count(
        "summary"
    )


@pytest.mark.django_db
def test_a_batched_chat_is_compacted_before_its_call_is_batched(user, model):
    fake = FakeBatches()
    providers.register(
        "anthropic", AnthropicProvider(api_key="test-key", transport=fake.transport())
    )
    try:
        chat = Chat.objects.create(model="anthropic:claude-haiku-4-5", owner=user)
        chat.with_context_window(200).with_compaction(keep_recent=1, model="scripted:small")
        for turn in range(4):
            chat.ask_later(QUESTION.format(turn))
        chat.ask_later("echo the latest")

        batch = agentloop.batch([chat])
        ((request,),) = fake.submitted()
        for _ in range(10):
            refresh_batch(batch)
            batch.refresh_from_db()
            if batch.collected_at is not None:
                break
    finally:
        providers.unregister("anthropic")

    sent = str(request["params"]["messages"])
    assert SUMMARY_PREFIX in sent and "echo the latest" in sent
    assert "Question 0" not in sent
    assert [is_summary_call(r) for r in model.requests] == [True]
    roles = list(chat.messages.values_list("role", flat=True))
    assert roles == ["user"] * 5 + ["summary", "assistant"]
    assert batch.collected_at is not None

"""Batches polled by a real ``celery worker`` process (docs/design.md §8 with §3).

The test process sends the first batch and plays celery beat (``poll_batches.delay()``);
the worker polls, appends the answers, runs the tools (they log their runs to a file) and
sends the next round's batch. The batch API is ``tests.batch_server.FakeBatches`` behind a
real HTTP server on 127.0.0.1, reached by the real ``AnthropicProvider`` in both processes.
Workers, Redis and the skip rules are the Celery tests' (the ``background`` fixture of
tests/conftest.py, tests/workers.py): skipped when Redis doesn't answer, except under
``CI=true``.
"""

from __future__ import annotations

import time

import pytest
from django.conf import settings
from django.test import override_settings

import agentloop
from agentloop.models import Batch, BatchItemStatus, BatchStatus, Chat, ChatState
from tests.batch_server import USAGE, FakeBatches, serve_over_http
from tests.tools import step_one, step_three, step_two

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]

MODEL = "batchfake:claude-haiku-4-5"


@pytest.fixture
def batch_service(background):  # noqa: F811 - the imported fixture
    """FakeBatches on a loopback HTTP server, configured as provider "batchfake" here and
    (passed to start_worker) in the worker."""
    fake = FakeBatches()
    with serve_over_http(fake) as url:
        provider = {
            "class": "agentloop.providers.anthropic.AnthropicProvider",
            "api_key": "test-key",
            "base_url": url,
        }
        configured = {**settings.AGENTLOOP["PROVIDERS"], "batchfake": provider}
        with override_settings(AGENTLOOP={**settings.AGENTLOOP, "PROVIDERS": configured}):
            yield fake, configured


def poll_until(background, condition, what):  # noqa: F811
    """Send ``agentloop.poll_batches`` every 0.2 s (as celery beat would) until ``condition``."""
    from agentloop.tasks import poll_batches

    last = 0.0

    def check():
        nonlocal last
        if time.monotonic() - last >= 0.2:
            poll_batches.delay()
            last = time.monotonic()
        return condition()

    background.wait(check, what)


def test_a_worker_polls_batches_through_a_two_round_tool_conversation(
    background,  # noqa: F811
    batch_service,
    user,
):
    fake, configured = batch_service
    worker = background.start_worker("poller", PROVIDERS=configured)
    tools = (step_one, step_two, step_three)
    questions = ["tools:step_one a", "tools:step_two,step_three b", "fail c"]
    chats = [
        Chat.objects.create(model=MODEL, owner=user).with_tools(*tools).ask_later(question)
        for question in questions
    ]

    first = agentloop.batch(chats, auto_continue=True)
    poll_until(
        background,
        lambda: Batch.objects.count() == 2 and not Batch.objects.open().exists(),
        "the worker to collect both rounds",
    )

    first.refresh_from_db()
    second = Batch.objects.get(previous=first)
    assert [b.status for b in (first, second)] == [BatchStatus.ENDED] * 2
    assert (first.succeeded_count, first.failed_count) == (2, 1)
    assert list(second.items.values_list("chat_id", "status")) == [
        (chats[0].pk, BatchItemStatus.SUCCEEDED),
        (chats[1].pk, BatchItemStatus.SUCCEEDED),
    ]
    finals = [chat.messages.order_by("id").last().content for chat in chats[:2]]
    assert finals == ["done: one done", "done: two done; three done"]
    assert [m.role for m in chats[1].messages.order_by("id")] == [
        "user", "assistant", "tool", "tool", "assistant",
    ]  # fmt: skip
    for chat in chats[:2]:
        chat.refresh_from_db()
        assert (chat.state, chat.lease_token, chat.error) == (ChatState.IDLE, "", "")
        usage = list(chat.usage_records.values_list("status", "input_tokens", "output_tokens"))
        assert usage == [("succeeded", USAGE["input_tokens"], USAGE["output_tokens"])] * 2
    failed = Chat.objects.get(pk=chats[2].pk)
    assert failed.state == ChatState.FAILED and "scripted failure" in failed.error
    # The tools ran in the worker, each once; the worker sent the second batch.
    assert sorted(background.runs()) == ["step_one", "step_three", "step_two"]
    assert len(fake.submitted()) == 2
    assert "agentloop.poll_batches[" in worker.output()

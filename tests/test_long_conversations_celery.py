"""Fallbacks and compaction in a real ``celery worker`` process (docs/fallbacks.md,
docs/long-conversations.md), one step per job.

The first model is the real ``AnthropicProvider`` reaching a loopback HTTP server that
answers every request with Anthropic's 529 "overloaded" (its recorded error format); the
fallback is the ``rules`` provider (tests/worker_provider.py). Workers, Redis and the skip
rules are those of tests/test_celery_worker.py (tests/workers.py, the
``background`` fixture of tests/conftest.py).
"""

from __future__ import annotations

import json
import threading

import httpx
import pytest
from django.conf import settings
from django.test import override_settings

from agentloop.engine.compaction import SUMMARY_PREFIX
from agentloop.models import Chat, ChatState
from tests.batch_server import serve_over_http
from tests.providers.cassettes import load
from tests.workers import settled

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]

AUTH = "chat_error_handling_with_anthropic_claude-haiku-4-5_raises_appropriate_auth_error"
FAST = {"MODEL_RETRIES": 1, "RETRY_BACKOFF": 0.001, "RETRY_BACKOFF_MAX": 0.001}


class Overloaded:
    """Anthropic's edge when overloaded: 529 with its error body; counts the requests."""

    def __init__(self) -> None:
        recorded = next(i for i in load(AUTH).interactions if i.status == 401)
        self.body = json.loads(recorded.response_text)
        self.body["error"].update(type="overloaded_error", message="Overloaded")
        self.count = 0
        self.lock = threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        with self.lock:
            self.count += 1
        return httpx.Response(529, json=self.body)


@pytest.fixture
def overloaded(background):  # noqa: F811 - the imported fixture
    """The overloaded Anthropic edge on a loopback server, configured as "anthropic"."""
    edge = Overloaded()
    with serve_over_http(edge) as url:  # type: ignore[arg-type]
        provider = {"api_key": "test-key", "base_url": url}
        configured = {**settings.AGENTLOOP["PROVIDERS"], "anthropic": provider}
        agentloop = {**settings.AGENTLOOP, "PROVIDERS": configured, **FAST}
        with override_settings(AGENTLOOP=agentloop):
            yield edge, {"PROVIDERS": configured, **FAST}


def test_a_worker_answers_from_the_fallback_when_the_first_model_is_overloaded(
    background,  # noqa: F811
    overloaded,
    user,
):
    edge, worker_settings = overloaded
    background.start_worker("w1", **worker_settings)
    chat = Chat.objects.create(model="anthropic:claude-haiku-4-5", owner=user)
    chat.with_fallbacks("rules:test")
    chat.ask_later("hello from the queue").complete_later()

    background.wait(lambda: settled(chat), "the chat to settle")

    answer = chat.messages.get(role="assistant")
    assert answer.content == "echo: hello from the queue"
    assert answer.model == "test"
    assert edge.count == 2  # the first model and its one retry, then the fallback
    rows = list(chat.usage_records.order_by("id").values_list("provider", "status"))
    assert rows == [("anthropic", "failed"), ("anthropic", "failed"), ("rules", "succeeded")]
    assert chat.error == ""


def test_a_worker_compacts_a_long_chat_and_keeps_answering(background, user):  # noqa: F811
    background.start_worker("w1")
    chat = Chat.objects.create(model="rules:test", owner=user).with_instructions("Echo.")
    chat.with_context_window(60).with_compaction(keep_recent=2)
    for turn in range(4):
        chat.ask_later(f"turn{turn} " + "and more words " * 8).complete_later()
        background.wait(lambda: settled(chat), f"turn {turn} to settle")

    chat.refresh_from_db()
    assert chat.state == ChatState.IDLE and chat.error == ""
    roles = list(chat.messages.values_list("role", flat=True))
    assert roles.count("user") == 4 and roles.count("assistant") == 4
    assert roles.count("summary") >= 1
    assert chat.usage_records.filter(message__role="summary").count() == roles.count("summary")
    answers = chat.messages.filter(role="assistant").order_by("id")
    assert answers.last().content.startswith("echo: turn3")
    assert SUMMARY_PREFIX not in answers.last().content

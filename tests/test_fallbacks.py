"""Fallback models (docs/fallbacks.md): a model call that fails in a way retrying can't fix in
the step is tried on the next model, in the same step; auth and bad requests do not fall back.

The first model is Anthropic's API at the HTTP edge (``httpx.MockTransport``): its recorded
error body (``chat_error_handling_with_anthropic_*``) with the type and status of an overload
(529), a server error (500) or a rate limit (429), or the recorded 401 itself. The second
answers with a recorded OpenRouter answer."""

from __future__ import annotations

import json

import httpx
import pytest
from django.test import override_settings

import agentloop
from agentloop import Agent, providers, signals
from agentloop.exceptions import (
    AuthenticationError,
    BadRequestError,
    ContextLengthError,
    RateLimitError,
)
from agentloop.models import Chat, Usage
from agentloop.providers.anthropic import AnthropicProvider
from agentloop.providers.gemini import GeminiProvider
from agentloop.providers.openai import OpenRouterProvider
from agentloop.testing import ScriptedProvider, stream
from tests.providers.cassettes import Interaction, load

pytestmark = pytest.mark.django_db

AUTH = "chat_error_handling_with_anthropic_claude-haiku-4-5_raises_appropriate_auth_error"
ANSWER = "chat_basic_chat_functionality_openrouter_claude-haiku-4-5_can_have_a_basic_conversation"
GEMINI_429 = (
    "chat_real_error_scenarios_gemini_gemini-2_5-flash_handles_context_length_exceeded_errors"
)
FIRST = "anthropic:claude-haiku-4-5"
SECOND = "openrouter:anthropic/claude-haiku-4.5"
#: the model id in the recorded OpenRouter answer (the first model would say claude-haiku-4-5).
SECOND_ANSWERS_AS = "anthropic/claude-4.5-haiku-20251001"
FAST = {"MODEL_RETRIES": 1, "RETRY_BACKOFF": 0.001, "RETRY_BACKOFF_MAX": 0.001}


def recorded(name: str, status: int) -> Interaction:
    return next(i for i in load(name).interactions if i.status == status)


def anthropic_error(status: int, kind: str, message: str) -> httpx.Response:
    """Anthropic's error wire format, as recorded for its 401, with another type and status."""
    body = json.loads(recorded(AUTH, 401).response_text)
    body["error"].update(type=kind, message=message)
    return httpx.Response(status, json=body)


ERRORS = {
    529: ("overloaded_error", "Overloaded"),
    500: ("api_error", "Internal server error"),
    429: ("rate_limit_error", "Number of request tokens has exceeded your rate limit"),
}


class Edge:
    """One provider's HTTP edge: answers every request with ``respond()``, counts them."""

    def __init__(self, respond) -> None:
        self.respond = respond
        self.sent: list[dict] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(json.loads(request.content))
        return self.respond()


@pytest.fixture
def edges():
    """Registers "anthropic" and "openrouter" answered by the given edges."""
    made: list[str] = []

    def install(first, second=None) -> tuple[Edge, Edge]:
        answer = recorded(ANSWER, 200)
        first_edge = Edge(first)
        second_edge = Edge(second or (lambda: httpx.Response(200, text=answer.response_text)))
        first_transport = httpx.MockTransport(first_edge.handle)
        second_transport = httpx.MockTransport(second_edge.handle)
        providers.register("anthropic", AnthropicProvider(api_key="k", transport=first_transport))
        providers.register(
            "openrouter", OpenRouterProvider(api_key="k", transport=second_transport)
        )
        made.extend(["anthropic", "openrouter"])
        return first_edge, second_edge

    with override_settings(AGENTLOOP=FAST):
        yield install
    for name in made:
        providers.unregister(name)


@pytest.fixture
def fallbacks_seen():
    seen: list[dict] = []

    def receiver(sender, **kwargs):
        seen.append(kwargs)

    signals.model_fallback.connect(receiver)
    yield seen
    signals.model_fallback.disconnect(receiver)


@pytest.mark.parametrize("status", sorted(ERRORS))
def test_the_step_answers_from_the_second_model(status, edges, fallbacks_seen, user):
    kind, message = ERRORS[status]
    first, second = edges(lambda: anthropic_error(status, kind, message))
    chat = Chat.objects.create(model=FIRST, owner=user).with_fallbacks(SECOND)

    answer = chat.ask("What's 2 + 2?")

    assert "4" in answer.content
    assert answer.model == SECOND_ANSWERS_AS
    assert len(first.sent) == 2  # the step's retries of the first model (MODEL_RETRIES=1)
    assert len(second.sent) == 1
    rows = list(Usage.objects.filter(chat=chat).order_by("id").values_list("provider", "status"))
    assert rows == [("anthropic", "failed"), ("anthropic", "failed"), ("openrouter", "succeeded")]
    assert str(status) in Usage.objects.filter(status="failed").first().error
    assert len(fallbacks_seen) == 1
    event = fallbacks_seen[0]
    assert event["chat"] == chat
    assert (event["from_model"], event["to_model"]) == (FIRST, SECOND)
    assert event["error"].status == status
    chat.refresh_from_db()
    assert chat.state == "idle" and chat.error == ""


def test_an_auth_error_does_not_fall_back(edges, fallbacks_seen, user):
    auth = recorded(AUTH, 401)
    first, second = edges(lambda: httpx.Response(401, text=auth.response_text))
    chat = Chat.objects.create(model=FIRST, owner=user).with_fallbacks(SECOND)

    with pytest.raises(AuthenticationError):
        chat.ask("What's 2 + 2?")

    assert len(first.sent) == 1 and second.sent == []
    assert fallbacks_seen == []
    chat.refresh_from_db()
    assert chat.state == "failed"


def test_a_bad_request_does_not_fall_back(edges, fallbacks_seen, user):
    first, second = edges(lambda: anthropic_error(400, "invalid_request_error", "bad field"))
    chat = Chat.objects.create(model=FIRST, owner=user).with_fallbacks(SECOND)

    with pytest.raises(BadRequestError):
        chat.ask("What's 2 + 2?")

    assert second.sent == [] and fallbacks_seen == []


def test_the_last_model_s_error_fails_the_chat(edges, user):
    overloaded = lambda: anthropic_error(529, *ERRORS[529])  # noqa: E731
    edges(overloaded, overloaded)
    chat = Chat.objects.create(model=FIRST, owner=user).with_fallbacks(SECOND)

    with pytest.raises(agentloop.ProviderError, match="529"):
        chat.ask("What's 2 + 2?")

    assert Usage.objects.filter(chat=chat, status="failed").count() == 4


def test_a_recorded_gemini_rate_limit_falls_back(edges, user):
    gemini_429 = recorded(GEMINI_429, 429)
    gemini_edge = Edge(lambda: httpx.Response(429, text=gemini_429.response_text))
    _, second = edges(lambda: anthropic_error(529, *ERRORS[529]))
    gemini = GeminiProvider(api_key="k", transport=httpx.MockTransport(gemini_edge.handle))
    providers.register("gemini", gemini)
    try:
        chat = Chat.objects.create(model="gemini:gemini-2.5-flash", owner=user)
        chat.with_fallbacks(SECOND)
        answer = chat.ask("What's 2 + 2?")
    finally:
        providers.unregister("gemini")

    assert len(gemini_edge.sent) == 2 and len(second.sent) == 1
    assert "4" in answer.content
    failed = Usage.objects.filter(chat=chat, status="failed").first()
    assert failed.provider == "gemini" and RateLimitError.__name__ in failed.error


def test_a_context_length_error_falls_back_after_the_compaction(edges, user):
    too_long = lambda: anthropic_error(400, "invalid_request_error", "prompt is too long")  # noqa: E731
    first, second = edges(too_long)
    chat = Chat.objects.create(model=FIRST, owner=user).with_fallbacks(SECOND)
    chat.with_compaction(keep_recent=1, model=SECOND)
    chat.ask_later("Old question").ask_later("New question")

    answer = chat.generate()

    assert "4" in answer.content
    assert len(first.sent) == 2  # before and after the compaction
    assert len(second.sent) == 2  # the summary, then the answer
    assert chat.messages.filter(role="summary").count() == 1
    failed = Usage.objects.filter(chat=chat, status="failed").values_list("error", flat=True)
    assert [error.split(":")[0] for error in failed] == [ContextLengthError.__name__] * 2


class Helper(Agent):
    """Answers questions; falls back to OpenRouter."""

    model = FIRST
    fallbacks = [SECOND]


def test_agent_fallbacks_configure_the_chat(edges, user):
    edges(lambda: anthropic_error(529, *ERRORS[529]))
    chat = Helper.create()
    answer = chat.ask("What's 2 + 2?")

    assert chat.conversation.store.config.get_config().fallbacks == [SECOND]
    assert answer.model == SECOND_ANSWERS_AS


def test_a_memory_chat_falls_back_and_tells_its_callback(edges):
    edges(lambda: anthropic_error(500, *ERRORS[500]))
    seen = []
    chat = agentloop.chat(FIRST).with_fallbacks(SECOND)
    chat.on("model_fallback", lambda *args: seen.append(args))

    answer = chat.ask("What's 2 + 2?")

    assert "4" in answer.content
    assert [(a, b) for a, b, _ in seen] == [(FIRST, SECOND)]


def test_a_fallback_nobody_serves_is_refused_in_one_line():
    chat = agentloop.chat("scripted:test")
    with pytest.raises(agentloop.ConfigurationError, match="Can't tell which provider") as caught:
        chat.with_fallbacks("nobody-knows")
    assert "\n" not in str(caught.value)
    assert chat.store.config.get_config().fallbacks == []


def test_the_admin_timeline_shows_which_model_answered(admin_client, edges, user):
    edges(lambda: anthropic_error(529, *ERRORS[529]))
    chat = Chat.objects.create(model=FIRST, owner=user).with_fallbacks(SECOND)
    chat.ask("What's 2 + 2?")

    content = admin_client.get(f"/admin/agentloop/chat/{chat.pk}/change/").content.decode()

    assert f'<span class="agentloop-quiet">{SECOND_ANSWERS_AS}</span>' in content
    assert "3 model calls" in content and "(2 failed)" in content


def test_a_streamed_step_falls_back_and_streams_the_second_model(edges):
    spare = ScriptedProvider(stream("Four", " it is."))
    providers.register("spare", spare)
    edges(lambda: anthropic_error(529, *ERRORS[529]))
    chunks = []
    try:
        chat = agentloop.chat(FIRST).with_fallbacks("spare:small")
        answer = chat.ask("What's 2 + 2?", stream=chunks.append)
    finally:
        providers.unregister("spare")

    assert answer.content == "Four it is."
    assert [chunk.text for chunk in chunks] == ["Four", " it is."]
    assert [m.role for m in chat.messages] == ["user", "assistant"]
    assert spare.requests[0].stream is True

"""A provider's context-length error, as recorded, triggers one compaction and one retry; a
second one fails the chat with a one-line error (docs/long-conversations.md)."""

from __future__ import annotations

import json

import httpx
import pytest

from agentloop import providers
from agentloop.engine.compaction import SUMMARY_INSTRUCTIONS, SUMMARY_PREFIX
from agentloop.exceptions import ContextLengthError
from agentloop.models import Chat, Usage
from agentloop.providers.anthropic import AnthropicProvider
from agentloop.providers.openai import DeepSeekProvider, OpenRouterProvider
from agentloop.providers.openai_responses import OpenAIResponsesProvider
from tests.providers.cassettes import NEXT, Interaction, load

pytestmark = pytest.mark.django_db

ERROR = "chat_real_error_scenarios_{}_handles_context_length_exceeded_errors"
BASIC = "chat_basic_chat_functionality_{}_can_have_a_basic_conversation"
#: (registered name, provider class, model, the recorded error, a recorded answer).
CASES = [
    ("anthropic", AnthropicProvider, "claude-haiku-4-5",
     (ERROR.format("anthropic_claude-haiku-4-5"), None),
     (BASIC.format("anthropic_claude-haiku-4-5"), None)),
    ("openai-responses", OpenAIResponsesProvider, "gpt-5-nano",
     (ERROR.format("openai_gpt-5-nano"), None), (BASIC.format("openai_gpt-5-nano"), None)),
    ("openrouter", OpenRouterProvider, "anthropic/claude-haiku-4.5",
     (ERROR.format("openrouter_claude-haiku-4-5"), None),
     (BASIC.format("openrouter_claude-haiku-4-5"), None)),
    ("deepseek", DeepSeekProvider, "deepseek-chat",
     (ERROR.format("deepseek_deepseek-chat"), NEXT),
     ("chat_deepseek_thinking_control_disables_thinking_for_effort_none", NEXT)),
]  # fmt: skip


def recorded(name: str, folder: object, status: int) -> Interaction:
    cassette = load(name, folder) if folder is not None else load(name)  # type: ignore[arg-type]
    return next(i for i in cassette.interactions if i.status == status)


class Edge:
    """The provider's HTTP edge: serves recorded responses in order, keeps the bodies sent."""

    def __init__(self, *responses: Interaction) -> None:
        self.queue = list(responses)
        self.sent: list[dict] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(json.loads(request.content))
        interaction = self.queue.pop(0)
        return httpx.Response(interaction.status, content=interaction.response_text.encode())


def texts(body: dict) -> str:
    return json.dumps(body)


@pytest.fixture(params=CASES, ids=[case[0] for case in CASES])
def case(request):
    name, provider_class, model, error, answer = request.param
    failure = recorded(*error, 400)
    success = recorded(*answer, 200)
    registered: list[str] = []

    def serve(*responses: Interaction) -> Edge:
        edge = Edge(*responses)
        providers.register(
            name, provider_class(api_key="test-key", transport=httpx.MockTransport(edge.handle))
        )
        registered.append(name)
        return edge

    yield name, model, failure, success, serve
    for registered_name in registered:
        providers.unregister(registered_name)


def long_chat(user, name: str, model: str) -> Chat:
    chat = Chat.objects.create(model=f"{name}:{model}", owner=user)
    chat.with_instructions("You answer questions.").with_compaction(keep_recent=2)
    for turn in range(5):
        chat.ask_later(f"Old question {turn}")
    return chat


def test_a_context_length_error_compacts_once_and_the_retry_answers(case, user):
    name, model, failure, success, serve = case
    edge = serve(failure, success, success)
    chat = long_chat(user, name, model)

    answer = chat.generate()

    assert answer.role == "assistant" and answer.content
    summary = chat.messages.get(role="summary")
    assert summary.content
    first, summary_call, retry = edge.sent
    assert "Old question 0" in texts(first)
    assert SUMMARY_INSTRUCTIONS in texts(summary_call) and "Old question 0" in texts(summary_call)
    # The retry: instructions, the summary, the two recent rows; the old ones are not sent.
    assert SUMMARY_PREFIX in texts(retry)
    assert "Old question 4" in texts(retry) and "Old question 3" in texts(retry)
    assert "Old question 0" not in texts(retry)
    statuses = list(
        Usage.objects.filter(chat=chat).order_by("id").values_list("status", "message__role")
    )
    assert statuses == [("failed", None), ("succeeded", "summary"), ("succeeded", "assistant")]
    assert chat.messages.filter(role="user").count() == 5


def test_a_second_context_length_error_fails_the_chat_with_one_line(case, user):
    name, model, failure, success, serve = case
    serve(failure, success, failure)
    chat = long_chat(user, name, model)

    with pytest.raises(ContextLengthError, match="still too long .* after compaction"):
        chat.generate()

    chat.refresh_from_db()
    assert chat.state == "failed"
    assert "after compaction" in chat.error
    assert "\n" not in chat.error
    assert chat.messages.filter(role="summary").count() == 1
    assert chat.messages.filter(role="assistant").count() == 0

"""``MAX_RESPONSE_BYTES``: an answer over the cap fails, plain or streamed, and is not accepted.

An OpenAI Chat Completions provider over ``httpx.MockTransport``; answers without a
``Content-Length`` are served as a chunked body, so the cap is met while reading.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from agentloop.exceptions import InvalidResponseError, ResponseTooLargeError
from agentloop.models import Chat, Usage
from agentloop.providers.openai import OpenAIProvider
from tests.providers.wire import Recorder, chat_completion, serving

pytestmark = pytest.mark.django_db

CAP = 2000


@pytest.fixture(autouse=True)
def _small_cap(settings):
    settings.AGENTLOOP = {**settings.AGENTLOOP, "MAX_RESPONSE_BYTES": CAP, "MODEL_RETRIES": 2}


@pytest.fixture
def server() -> Iterator[Recorder]:
    with serving("big", OpenAIProvider, api_key="sk-test") as recorder:
        yield recorder


@pytest.fixture
def chat(user) -> Chat:
    return Chat.objects.create(model="big:gpt-5-nano", owner=user)


def chunked(body: bytes, piece: int = 256, **headers: str) -> httpx.Response:
    """``body`` sent in pieces without a Content-Length (a chunked transfer)."""
    pieces = [body[i : i + piece] for i in range(0, len(body), piece)]
    return httpx.Response(200, headers=headers, content=iter(pieces))


def streamed_words(count: int) -> bytes:
    chunks = [
        {"id": "c", "model": "gpt-5-nano", "choices": [{"index": 0, "delta": {"content": "word "}}]}
        for _ in range(count)
    ]
    chunks.append(
        {
            "id": "c",
            "model": "gpt-5-nano",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 12, "completion_tokens": count},
        }
    )
    text = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + "data: [DONE]\n\n"
    return text.encode()


def assert_nothing_kept(chat: Chat) -> None:
    """Only the question is stored; the one attempt is a failed usage row (not retried)."""
    assert [(m.role, m.status) for m in chat.messages.order_by("id")] == [("user", "complete")]
    [usage] = Usage.objects.filter(chat=chat)
    assert (usage.status, usage.error.partition(":")[0]) == ("failed", "ResponseTooLargeError")


def test_a_plain_answer_announced_over_the_cap_fails_before_it_is_read(server, chat):
    server.responses.append(chat_completion("x" * (CAP + 1)))  # sent with its Content-Length

    with pytest.raises(ResponseTooLargeError, match="MAX_RESPONSE_BYTES"):
        chat.ask("Hi")

    assert_nothing_kept(chat)


def test_a_plain_chunked_answer_over_the_cap_fails_while_it_is_read(server, chat):
    body = chat_completion("x" * (CAP + 1)).content
    server.responses.append(chunked(body, **{"content-type": "application/json"}))

    with pytest.raises(ResponseTooLargeError):
        chat.ask("Hi")

    assert_nothing_kept(chat)
    assert len(server.requests) == 1  # permanent: not sent again


def test_a_streamed_answer_over_the_cap_fails_and_keeps_no_answer(server, chat, settings):
    settings.AGENTLOOP = {**settings.AGENTLOOP, "PARTIAL_SAVE_INTERVAL": 0.0}
    server.responses.append(chunked(streamed_words(200), **{"content-type": "text/event-stream"}))
    seen: list[object] = []

    with pytest.raises(ResponseTooLargeError):
        chat.ask_later("Hi").complete(stream=seen.append)

    assert seen  # pieces arrived before the cap was met, and the engine saved them as it
    # streamed; that row is marked "failed" (a later answer passes over it), never an answer.
    assert [m.status for m in chat.messages.filter(role="assistant")] in ([], ["failed"])
    [usage] = Usage.objects.filter(chat=chat)
    assert (usage.status, usage.error.partition(":")[0]) == ("failed", "ResponseTooLargeError")


def test_after_a_refused_stream_the_next_question_is_answered_without_its_pieces(server, chat):
    server.responses.append(chunked(streamed_words(200), **{"content-type": "text/event-stream"}))
    with pytest.raises(ResponseTooLargeError):
        chat.ask_later("Hi").complete(stream=lambda chunk: None)
    server.responses.append(chat_completion("Fine."))

    answer = chat.ask("Again")

    assert answer.content == "Fine."
    sent = [m.get("content") for m in server.bodies[-1]["messages"]]
    assert sent == ["Hi", "Again"]


def test_an_answer_within_the_cap_is_read_whole(server, chat):
    server.responses.append(chunked(chat_completion("fits").content))

    assert chat.ask("Hi").content == "fits"


def test_none_lifts_the_cap(server, chat, settings):
    settings.AGENTLOOP = {**settings.AGENTLOOP, "MAX_RESPONSE_BYTES": None}
    server.responses.append(chat_completion("y" * (CAP * 3)))

    assert len(chat.ask("Hi").content) == CAP * 3


def test_the_error_is_a_permanent_invalid_response():
    assert issubclass(ResponseTooLargeError, InvalidResponseError)
    assert ResponseTooLargeError.retryable is False

"""The engine retries transient provider errors: a Usage row per attempt, Retry-After honoured.

A persisted chat talks to an OpenAI Chat Completions provider over httpx.MockTransport.
``time.sleep`` in the engine is replaced by a recorder, so the delays are asserted, not slept.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.test import override_settings

from agentloop.exceptions import (
    AuthenticationError,
    BadRequestError,
    RateLimitError,
    ServerError,
)
from agentloop.messages import TextDelta
from agentloop.models import Chat, Usage
from agentloop.providers.openai import OpenAIProvider
from tests.providers.wire import Recorder, chat_completion, serving

pytestmark = pytest.mark.django_db


def completion(content: str = "Hello!") -> httpx.Response:
    return chat_completion(content, prompt_tokens=12, completion_tokens=3)


def stream(*pieces: str, done: bool = True) -> httpx.Response:
    chunks = [
        {"id": "c", "model": "gpt-5-nano", "choices": [{"index": 0, "delta": {"content": piece}}]}
        for piece in pieces
    ]
    chunks.append(
        {
            "id": "c",
            "model": "gpt-5-nano",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 3},
        }
    )
    text = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks)
    if done:
        text += "data: [DONE]\n\n"
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, text=text)


def failure(status: int, message: str = "Try again later", **headers: str) -> httpx.Response:
    body = {"error": {"message": message, "type": "server_error", "code": None}}
    return httpx.Response(status, json=body, headers=headers)


@pytest.fixture
def server() -> Iterator[Recorder]:
    """The provider registered as "flaky"; append the answers it should give."""
    with serving("flaky", OpenAIProvider, api_key="sk-test") as recorder:
        yield recorder


@pytest.fixture
def sleeps(monkeypatch) -> list[float]:
    """The delays the engine waited between attempts in this thread (nothing really sleeps).

    ``time.sleep`` is one function for the whole process: a thread another test left running
    (a server, a poller) still sleeps for real, and is not counted."""
    delays: list[float] = []
    this_thread = threading.get_ident()
    real_sleep = time.sleep

    def sleep(seconds: float) -> None:
        if threading.get_ident() == this_thread:
            delays.append(seconds)
        else:
            real_sleep(seconds)

    monkeypatch.setattr(time, "sleep", sleep)
    return delays


@pytest.fixture
def chat(user) -> Chat:
    return Chat.objects.create(model="flaky:gpt-5-nano", owner=user)


def attempts(chat: Chat) -> list[tuple[str, str]]:
    """(status, error class) of each Usage row, in order."""
    return [
        (usage.status, usage.error.partition(":")[0])
        for usage in Usage.objects.filter(chat=chat).order_by("id")
    ]


# -- retried ---------------------------------------------------------------------------------
def test_a_429_with_retry_after_zero_is_retried_at_once(server, sleeps, chat):
    server.responses += [failure(429, "Rate limit reached", **{"Retry-After": "0"}), completion()]

    answer = chat.ask("Hi")

    assert answer.content == "Hello!"
    assert sleeps == [0.0]
    assert attempts(chat) == [("failed", "RateLimitError"), ("succeeded", "")]
    assert server.bodies[0] == server.bodies[1]  # the same request, sent again


def test_the_retry_after_seconds_of_a_429_are_waited(server, sleeps, chat):
    server.responses += [failure(429, **{"Retry-After": "7"}), completion()]

    chat.ask("Hi")

    assert sleeps == [7.0]


def test_retry_after_ms_is_read_to_the_millisecond(server, sleeps, chat):
    server.responses += [failure(429, **{"retry-after-ms": "1500"}), completion()]

    chat.ask("Hi")

    assert sleeps == [1.5]


@override_settings(AGENTLOOP={"RETRY_BACKOFF_MAX": 30})
def test_a_retry_after_longer_than_retry_backoff_max_is_cut_to_it(server, sleeps, chat):
    server.responses += [failure(429, **{"Retry-After": "120"}), completion()]

    chat.ask("Hi")

    assert sleeps == [30.0]


def test_a_503_then_200_is_retried_with_a_usage_row_per_attempt(server, sleeps, chat):
    server.responses += [failure(503, "Service unavailable"), completion("Back again")]

    answer = chat.ask("Hi")

    assert answer.content == "Back again"
    assert attempts(chat) == [("failed", "ServerError"), ("succeeded", "")]
    succeeded = Usage.objects.get(chat=chat, status="succeeded")
    assert (succeeded.input_tokens, succeeded.output_tokens) == (12, 3)
    assert succeeded.message_id == answer.pk
    assert len(sleeps) == 1


@override_settings(AGENTLOOP={"RETRY_BACKOFF": 0.5, "RETRY_BACKOFF_MAX": 30, "MODEL_RETRIES": 3})
def test_without_retry_after_the_backoff_doubles_with_full_jitter(
    server, sleeps, chat, monkeypatch
):
    bounds: list[tuple[float, float]] = []

    def highest(low: float, high: float) -> float:
        bounds.append((low, high))
        return high

    monkeypatch.setattr("agentloop.engine._effects.random.uniform", highest)
    server.responses += [failure(503), failure(502), failure(500), completion()]

    chat.ask("Hi")

    assert bounds == [(0, 0.5), (0, 1.0), (0, 2.0)]
    assert sleeps == [0.5, 1.0, 2.0]


@override_settings(AGENTLOOP={"RETRY_BACKOFF": 0.5, "RETRY_BACKOFF_MAX": 0.75})
def test_the_jittered_backoff_never_exceeds_retry_backoff_max(server, sleeps, chat, monkeypatch):
    monkeypatch.setattr("agentloop.engine._effects.random.uniform", lambda low, high: high)
    server.responses += [failure(503), failure(503), completion()]

    chat.ask("Hi")

    assert sleeps == [0.5, 0.75]


def test_a_timeout_is_retried(server, sleeps, chat):
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    server.responses += [slow, completion()]

    chat.ask("Hi")

    assert attempts(chat) == [("failed", "ProviderTimeout"), ("succeeded", "")]


def test_a_streamed_answer_is_retried_after_a_429(server, sleeps, chat):
    server.responses += [failure(429, **{"Retry-After": "0"}), stream("Hel", "lo!")]
    chunks: list[Any] = []

    answer = chat.ask("Hi", stream=chunks.append)

    assert answer.content == "Hello!"
    assert [chunk.text for chunk in chunks if isinstance(chunk, TextDelta)] == ["Hel", "lo!"]
    assert attempts(chat) == [("failed", "RateLimitError"), ("succeeded", "")]
    assert server.bodies[1]["stream"] is True


@override_settings(AGENTLOOP={"PARTIAL_SAVE_INTERVAL": 0})
def test_a_stream_cut_short_is_retried_and_leaves_only_the_finished_answer(server, sleeps, chat):
    server.responses += [stream("Hel", done=False), stream("Hello", " again!")]

    answer = chat.ask("Hi", stream=lambda chunk: None)

    assert answer.content == "Hello again!"
    assert attempts(chat) == [("failed", "StreamInterruptedError"), ("succeeded", "")]
    assert [(m.role, m.status, m.content) for m in chat.messages.order_by("id")] == [
        ("user", "complete", "Hi"),
        ("assistant", "complete", "Hello again!"),
    ]


# -- not retried, or no more ----------------------------------------------------------------
def test_a_401_is_not_retried(server, sleeps, chat):
    server.responses += [failure(401, "Incorrect API key provided")]

    with pytest.raises(AuthenticationError):
        chat.ask("Hi")

    assert sleeps == []
    assert attempts(chat) == [("failed", "AuthenticationError")]
    assert len(server.requests) == 1


def test_a_400_is_not_retried(server, sleeps, chat):
    server.responses += [failure(400, "Invalid value for 'temperature'")]

    with pytest.raises(BadRequestError):
        chat.ask("Hi")

    assert (sleeps, len(server.requests)) == ([], 1)


@override_settings(AGENTLOOP={"MODEL_RETRIES": 2})
def test_when_retries_run_out_the_error_is_raised_after_a_failed_row_per_attempt(
    server, sleeps, chat
):
    server.responses += [failure(503), failure(503), failure(503)]

    with pytest.raises(ServerError) as raised:
        chat.ask("Hi")

    assert raised.value.status == 503
    assert attempts(chat) == [("failed", "ServerError")] * 3
    assert len(sleeps) == 2
    assert len(server.requests) == 3
    assert [m.role for m in chat.messages.all()] == ["user"]  # no answer was saved


@override_settings(AGENTLOOP={"MODEL_RETRIES": 0})
def test_model_retries_zero_makes_one_attempt(server, sleeps, chat):
    server.responses += [failure(429, **{"Retry-After": "0"})]

    with pytest.raises(RateLimitError):
        chat.ask("Hi")

    assert (sleeps, attempts(chat)) == ([], [("failed", "RateLimitError")])


def test_a_chat_can_be_asked_again_after_its_retries_ran_out(server, sleeps, chat):
    server.responses += [failure(503)] * 3
    with pytest.raises(ServerError):
        chat.ask("Hi")
    server.responses += [completion("Recovered")]

    assert chat.generate().content == "Recovered"
    assert attempts(chat)[-1] == ("succeeded", "")

"""``HTTPProvider.arequest`` over ``httpx.AsyncClient``: the size cap, error translation and
key redaction are the sync request's (served by an async ``httpx.MockTransport``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from agentloop.exceptions import (
    AuthenticationError,
    ProviderTimeout,
    ResponseTooLargeError,
    ServerError,
)
from agentloop.messages import Message, ModelRequest, TextDelta
from agentloop.providers.openai import OpenAIProvider
from tests.providers.wire import chat_completion

CAP = 2000
KEY = "sk-secret-123456"


@pytest.fixture(autouse=True)
def _small_cap(settings):
    settings.AGENTLOOP = {**settings.AGENTLOOP, "MAX_RESPONSE_BYTES": CAP}


def provider(answer: Any) -> OpenAIProvider:
    async def handle(request: httpx.Request) -> httpx.Response:
        return answer(request) if callable(answer) else answer

    return OpenAIProvider(api_key=KEY, transport=httpx.MockTransport(handle))


def request(stream: bool = False) -> ModelRequest:
    return ModelRequest(model="m", messages=[Message(role="user", content="Hi")], stream=stream)


def chunked(body: bytes, content_type: str) -> httpx.Response:
    """``body`` in 256-byte pieces without a Content-Length, read asynchronously."""

    async def pieces() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 256):
            await asyncio.sleep(0)
            yield body[start : start + 256]

    return httpx.Response(200, headers={"content-type": content_type}, content=pieces())


def sse(words: int) -> bytes:
    events = [{"choices": [{"index": 0, "delta": {"content": "word "}}]}] * words
    events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    return ("".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n").encode()


def ask(p: OpenAIProvider, stream: bool = False) -> tuple[Any, list[Any]]:
    chunks: list[Any] = []

    async def on_chunk(chunk: Any) -> None:
        chunks.append(chunk)

    response = asyncio.run(p.arequest(request(stream), on_chunk=on_chunk if stream else None))
    return response, chunks


def test_an_answer_announced_over_the_cap_is_refused():
    with pytest.raises(ResponseTooLargeError, match="MAX_RESPONSE_BYTES"):
        ask(provider(chat_completion("x" * (CAP + 1))))


def test_a_chunked_answer_over_the_cap_fails_while_it_is_read():
    body = chat_completion("x" * (CAP + 1)).content
    with pytest.raises(ResponseTooLargeError):
        ask(provider(chunked(body, "application/json")))


def test_a_stream_over_the_cap_fails_after_its_first_pieces():
    chunks: list[Any] = []

    async def on_chunk(chunk: Any) -> None:
        chunks.append(chunk)

    p = provider(chunked(sse(200), "text/event-stream"))
    with pytest.raises(ResponseTooLargeError):
        asyncio.run(p.arequest(request(stream=True), on_chunk=on_chunk))
    assert chunks and all(isinstance(c, TextDelta) for c in chunks)


def test_an_answer_within_the_cap_streams_whole():
    response, chunks = ask(provider(chunked(sse(5), "text/event-stream")), stream=True)
    assert response.content == "word " * 5
    assert [c.text for c in chunks] == ["word "] * 5


def test_a_timeout_and_an_unreachable_server_are_provider_errors():
    def timeout(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError(f"refused for key {KEY}", request=request)

    with pytest.raises(ProviderTimeout):
        ask(provider(timeout))
    with pytest.raises(ServerError) as caught:
        ask(provider(refused), stream=True)
    assert KEY not in str(caught.value)


def test_an_error_answer_names_no_key():
    body = {"error": {"message": f"Incorrect API key provided: {KEY}", "type": "invalid_request"}}
    with pytest.raises(AuthenticationError) as caught:
        ask(provider(httpx.Response(401, json=body)), stream=True)
    assert KEY not in str(caught.value) + str(caught.value.body)


def test_a_provider_with_a_sync_only_transport_runs_on_a_thread() -> None:
    """A transport that speaks only sync HTTP is never bypassed: the request runs on a thread."""
    calls: list[str] = []

    class SyncOnly(httpx.BaseTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            calls.append(str(request.url))
            body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]}
            return httpx.Response(200, json=body)

    sync_only = OpenAIProvider(api_key="test-key", transport=SyncOnly())
    question = ModelRequest(model="m", messages=[Message(role="user", content="Hi")])

    response = asyncio.run(sync_only.arequest(question))

    assert response.content == "ok"
    assert calls == ["https://api.openai.com/v1/chat/completions"]

"""A provider's connections are kept between model calls: a streamed answer is read to the
end of its body, so httpx gives the connection back to the client's pool instead of dropping
it (and the next call connecting, and shaking hands over TLS, again).

A real HTTP/1.1 server on localhost replays recorded streams (../shared/fixtures) the way
the APIs send them: ``Transfer-Encoding: chunked``, keep-alive, ``[DONE]`` or
``message_stop`` before the body's end. It counts the TCP connections it accepts.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentloop.messages import Message, ModelRequest
from agentloop.providers.anthropic import AnthropicProvider
from agentloop.providers.openai import OpenRouterProvider
from agentloop.providers.openai_responses import OpenAIResponsesProvider
from tests.providers.cassettes import Interaction, load, require_fixtures
from tests.providers.local_servers import CountingServer, KeepAliveHandler, serving

STREAMING = "can_use_tools_with_multi-turn_streaming_conversations"
CASSETTES = {  # Chat Completions (OpenRouter's), the Responses API, Anthropic's Messages
    "chat_completions": (OpenRouterProvider, "openrouter_claude-haiku-4-5", "/api/v1"),
    "responses": (OpenAIResponsesProvider, "openai_gpt-5-nano", "/v1"),
    "anthropic": (AnthropicProvider, "anthropic_claude-haiku-4-5", ""),
}


class _Replaying(CountingServer):
    def __init__(self, body: bytes) -> None:
        super().__init__(_Handler)
        self.body = body


class _Handler(KeepAliveHandler):
    server: _Replaying

    def do_POST(self) -> None:  # noqa: N802 - the handler's API
        self.rfile.read(int(self.headers.get("content-length", 0)))
        body = self.server.body
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        # The events in a few chunks, then the empty chunk that ends the body.
        for start in range(0, len(body), 512):
            piece = body[start : start + 512]
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        self.wfile.write(b"0\r\n\r\n")


def _first_stream(name: str) -> Interaction:
    require_fixtures()
    return next(i for i in load(name).interactions if i.is_stream and i.status == 200)


@pytest.mark.parametrize("api", CASSETTES)
def test_streamed_answers_one_after_another_share_one_connection(api):
    provider_class, recording, path = CASSETTES[api]
    recorded = _first_stream(f"chat_function_calling_{recording}_{STREAMING}")
    with serving(_Replaying(recorded.response_text.encode())) as server:
        provider = provider_class(api_key="test-key", base_url=f"{server.url}{path}")
        answers = _three_streamed(provider)

    assert answers[0] == answers[1] == answers[2]
    assert server.connections == 1


def _three_streamed(provider: Any) -> list[Any]:
    request = ModelRequest(model="m", messages=[Message(role="user", content="hi")], stream=True)

    answers = []
    try:
        for _ in range(3):
            chunks: list[Any] = []
            answers.append(provider.request(request, on_chunk=chunks.append))
            assert chunks, "the answer was streamed"
    finally:
        provider.close()
    return answers

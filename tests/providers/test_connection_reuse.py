"""A provider's connections are kept between model calls: a streamed answer is read to the
end of its body, so httpx gives the connection back to the client's pool instead of dropping
it (and the next call connecting, and shaking hands over TLS, again).

A real HTTP/1.1 server on localhost replays recorded streams (../shared/fixtures) the way
the APIs send them: ``Transfer-Encoding: chunked``, keep-alive, ``[DONE]`` or
``message_stop`` before the body's end. It counts the TCP connections it accepts.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from agentloop.messages import Message, ModelRequest
from agentloop.providers.anthropic import AnthropicProvider
from agentloop.providers.openai import OpenRouterProvider
from agentloop.providers.openai_responses import OpenAIResponsesProvider
from tests.providers.cassettes import Interaction, load, require_fixtures

STREAMING = "can_use_tools_with_multi-turn_streaming_conversations"
CASSETTES = {  # Chat Completions (OpenRouter's), the Responses API, Anthropic's Messages
    "chat_completions": (OpenRouterProvider, "openrouter_claude-haiku-4-5", "/api/v1"),
    "responses": (OpenAIResponsesProvider, "openai_gpt-5-nano", "/v1"),
    "anthropic": (AnthropicProvider, "anthropic_claude-haiku-4-5", ""),
}


class _Replaying(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, bodies: list[bytes]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.bodies = bodies
        self.connections = 0
        self.lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.lock:
            self.connections += 1
        super().process_request(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: _Replaying

    def do_POST(self) -> None:  # noqa: N802 - the handler's API
        self.rfile.read(int(self.headers.get("content-length", 0)))
        body = self.server.bodies[0]
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        # The events in a few chunks, then the empty chunk that ends the body.
        for start in range(0, len(body), 512):
            piece = body[start : start + 512]
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the handler's API
        return None


@pytest.fixture
def replaying() -> Iterator[Any]:
    servers: list[_Replaying] = []

    def start(interaction: Interaction) -> _Replaying:
        server = _Replaying([interaction.response_text.encode()])
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _first_stream(name: str) -> Interaction:
    require_fixtures()
    return next(i for i in load(name).interactions if i.is_stream and i.status == 200)


@pytest.mark.parametrize("api", CASSETTES)
def test_streamed_answers_one_after_another_share_one_connection(replaying, api):
    provider_class, recording, path = CASSETTES[api]
    recorded = _first_stream(f"chat_function_calling_{recording}_{STREAMING}")
    server = replaying(recorded)
    provider = provider_class(
        api_key="test-key", base_url=f"http://127.0.0.1:{server.server_address[1]}{path}"
    )
    request = ModelRequest(model="m", messages=[Message(role="user", content="hi")], stream=True)

    answers = []
    try:
        for _ in range(3):
            chunks: list[Any] = []
            answers.append(provider.request(request, on_chunk=chunks.append))
            assert chunks, "the answer was streamed"
    finally:
        provider.close()

    assert answers[0] == answers[1] == answers[2]
    assert server.connections == 1

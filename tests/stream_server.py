"""A tiny OpenAI-compatible HTTP server streaming answers, for tests that must see a model call
abandoned on the wire (its client closing the connection mid-stream).

A streamed request whose latest user message contains "quick" is answered at once (a few
chunks, the usage, ``[DONE]``); any other is streamed a chunk every 50 ms until the client goes
away. A request that does not stream gets the quick answer as one JSON body.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from agentloop import providers
from agentloop.providers.openai import OpenAIProvider

#: the words of a quick answer, one chunk each.
QUICK_WORDS = ["Quick ", "answer ", "here."]


class StreamServer(ThreadingHTTPServer):
    """Counts requests, the ones answered in full, and those the client closed mid-stream."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []
        self.answered = 0
        self.closed_by_client = 0
        self.stopping = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def latest_user_texts(self) -> list[str]:
        """The latest user message of each request, in order."""
        with self.lock:
            bodies = list(self.requests)
        return [
            next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
            for body in bodies
        ]


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    body = {"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 0,
            "model": "test", "choices": [choice]}  # fmt: skip
    return f"data: {json.dumps(body)}\n\n".encode()


class _Handler(BaseHTTPRequestHandler):
    server: StreamServer

    def do_POST(self) -> None:  # noqa: N802 - the handler's API
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
        with self.server.lock:
            self.server.requests.append(body)
        latest = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
        if not body.get("stream"):
            self._whole()
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        try:
            if "quick" in str(latest):
                self._quick()
            else:
                self._endless()
        except OSError:
            with self.server.lock:
                self.server.closed_by_client += 1

    def _whole(self) -> None:
        """A request that does not stream: the quick answer as one JSON body."""
        answer = {"role": "assistant", "content": "".join(QUICK_WORDS)}
        data = json.dumps({
            "id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": "test",
            "choices": [{"index": 0, "message": answer, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
        }).encode()  # fmt: skip
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        with self.server.lock:
            self.server.answered += 1

    def _quick(self) -> None:
        self.wfile.write(_chunk({"role": "assistant", "content": ""}))
        for word in QUICK_WORDS:
            self.wfile.write(_chunk({"content": word}))
        self.wfile.write(_chunk({}, "stop"))
        usage = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
        self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        with self.server.lock:
            self.server.answered += 1

    def _endless(self) -> None:
        index = 0
        while not self.server.stopping.is_set():
            self.wfile.write(_chunk({"content": f"w{index} "}))
            self.wfile.flush()
            index += 1
            time.sleep(0.05)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the handler's API
        return None


@contextmanager
def stream_server(name: str = "streamer") -> Iterator[StreamServer]:
    """The server, registered as provider ``name`` (model ``"<name>:test"``)."""
    server = StreamServer()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    providers.register(name, OpenAIProvider(base_url=server.url, api_key="test-key"))
    try:
        yield server
    finally:
        providers.unregister(name)
        server.stopping.set()
        server.shutdown()
        server.server_close()

"""A fake OpenAI-compatible server with a set latency: real HTTP, real wire format, no model.

``POST /chat/completions`` waits ``latency`` seconds, then answers, plain or streamed (SSE,
``stream: true``) as OpenAI's Chat Completions does:

* when the request offers tools and no tool result follows the latest user message: one
  call of the first tool, its arguments ``{"key": <the latest user message>}``;
* otherwise: ``"answer: <the latest tool result>"`` (``"answer: <the user message>"``
  without one).

So a chat with one tool is the round of issue 20: the model asks for the tool, the tool
runs, the model answers, two model calls of ``latency`` each. The server counts requests
and the most it served at once (``peak``). Used by ``bench/in_flight.py`` and by
``tests/test_in_flight.py``.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["FakeOpenAI"]


def answer_for(body: dict[str, Any]) -> dict[str, Any]:
    """The assistant message (``content`` or ``tool_calls``) for a request body."""
    messages = body.get("messages") or []
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    user = messages[last_user].get("content") if last_user >= 0 else ""
    if isinstance(user, list):  # content parts
        user = "".join(part.get("text", "") for part in user if isinstance(part, dict))
    results = [m for m in messages[last_user + 1 :] if m.get("role") == "tool"]
    tools = body.get("tools") or []
    if tools and not results:
        name = tools[0]["function"]["name"]
        arguments = json.dumps({"key": user})
        call = {
            "id": f"call_{abs(hash((user, name))) % 10**12}",
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    text = results[-1].get("content") if results else user
    return {"role": "assistant", "content": f"answer: {text}"}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the API's clients expect
    disable_nagle_algorithm = True  # as API servers do: a reused connection has no 40 ms stalls
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass

    def do_POST(self) -> None:  # noqa: N802 - the base class's name
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        fake = self.server.fake
        fake.started()
        try:
            time.sleep(fake.latency)
            message = answer_for(body)
        finally:
            fake.finished()
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        if body.get("stream"):
            payload = self._events(body.get("model", ""), message, usage)
            content_type = "text/event-stream"
        else:
            choice = {"index": 0, "message": message, "finish_reason": _finish(message)}
            data = {"id": "fake", "object": "chat.completion", "model": body.get("model", "")}
            payload = json.dumps({**data, "choices": [choice], "usage": usage}).encode()
            content_type = "application/json"
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    @staticmethod
    def _events(model: str, message: dict[str, Any], usage: dict[str, int]) -> bytes:
        base = {"id": "fake", "object": "chat.completion.chunk", "model": model}
        delta: dict[str, Any] = {"role": "assistant"}
        if message.get("tool_calls"):
            delta["tool_calls"] = [{"index": 0, **message["tool_calls"][0]}]
        else:
            delta["content"] = message["content"]
        chunks = [
            {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
            {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": _finish(message)}]},
            {**base, "choices": [], "usage": usage},
        ]
        lines = [f"data: {json.dumps(chunk)}\n\n" for chunk in chunks]
        return ("".join(lines) + "data: [DONE]\n\n").encode()


def _finish(message: dict[str, Any]) -> str:
    return "tool_calls" if message.get("tool_calls") else "stop"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 4096  # a burst of hundreds of connections at once
    fake: FakeOpenAI


class FakeOpenAI:
    """The server on 127.0.0.1 (a free port), on a thread; ``url`` is its base URL."""

    def __init__(self, latency: float) -> None:
        self.latency = latency
        self.requests = 0
        self.in_flight = 0
        self.peak = 0
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.fake = self
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def started(self) -> None:
        with self._lock:
            self.requests += 1
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)

    def finished(self) -> None:
        with self._lock:
            self.in_flight -= 1

    def __enter__(self) -> FakeOpenAI:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

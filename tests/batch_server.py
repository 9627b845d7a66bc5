"""A stand-in for Anthropic's Message Batches API, for batch tests.

``FakeBatches`` answers the requests ``AnthropicProvider`` sends, as an
``httpx.MockTransport`` handler (``fake.transport()``) or, for other processes (a Celery
worker), behind a real HTTP server on the loopback interface (``serve_over_http(fake)``).
Each batch reads as ``in_progress`` for ``polls`` status reads, then ``ended``; its results
follow rules written in the latest user message of each request (as tests/worker_provider.py
does for direct calls):

``tools:step_one,step_two|step_three``
    One round of tool calls per ``|``-separated group; after the last round's results, the
    text ``"done: <those results, joined by '; '>"``. Arguments from worker_provider.ARGUMENTS.
``fail``
    The request errors (``invalid_request_error``).
anything else
    ``"echo: <the message>"``.

Every answer costs 100 input and 20 output tokens.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from tests import worker_provider

#: arguments of the tools a rule names (tools without an entry get none).
ARGUMENTS: dict[str, dict[str, Any]] = {
    **worker_provider.ARGUMENTS,
    "transfer": {"amount": 5, "to": "Ada"},
}
USAGE = {"input_tokens": 100, "output_tokens": 20}
MODEL = "claude-haiku-4-5"


@dataclass
class FakeBatch:
    id: str
    requests: list[dict[str, Any]]
    reads_left: int
    cancelled: bool = False

    @property
    def ended(self) -> bool:
        return self.reads_left <= 0 or self.cancelled


@dataclass
class FakeBatches:
    """The batch endpoints of the Anthropic API, answering by rule (see the module docstring)."""

    polls: int = 1
    batches: dict[str, FakeBatch] = field(default_factory=dict)
    #: every request received: (method, path, parsed JSON body or None).
    received: list[tuple[str, str, Any]] = field(default_factory=list)
    #: HTTP errors to answer the next requests with, in order (status codes).
    failures: list[int] = field(default_factory=list)
    #: called just before results are served (e.g. to cancel a chat at that moment).
    before_results: Callable[[], Any] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self)

    def submitted(self) -> list[list[dict[str, Any]]]:
        """The requests of each batch, in the order the batches came."""
        return [batch.requests for batch in self.batches.values()]

    def __call__(self, request: httpx.Request) -> httpx.Response:
        with self.lock:
            body = json.loads(request.content) if request.content else None
            self.received.append((request.method, request.url.path, body))
            if request.headers.get("x-api-key") != "test-key":
                return _error(401, "authentication_error", "invalid x-api-key")
            if self.failures:
                return _error(self.failures.pop(0), "api_error", "scripted failure")
            return self._route(request.method, request.url.path, body)

    def _route(self, method: str, path: str, body: Any) -> httpx.Response:
        parts = path.strip("/").split("/")  # v1 messages batches [id [results|cancel]]
        if parts[:3] != ["v1", "messages", "batches"]:
            return _error(404, "not_found_error", path)
        if method == "POST" and len(parts) == 3:
            batch = FakeBatch(f"msgbatch_{len(self.batches) + 1:03d}", body["requests"], self.polls)
            self.batches[batch.id] = batch
            return httpx.Response(200, json=self._status(batch))
        batch = self.batches.get(parts[3]) if len(parts) > 3 else None
        if batch is None:
            return _error(404, "not_found_error", path)
        if method == "GET" and len(parts) == 4:
            answer = self._status(batch)
            batch.reads_left -= 1
            return httpx.Response(200, json=answer)
        if method == "GET" and parts[4] == "results" and batch.ended:
            if self.before_results is not None:
                self.before_results()
            lines = [json.dumps(self._result(batch, item)) for item in batch.requests]
            return httpx.Response(200, text="\n".join(lines) + "\n")
        if method == "POST" and parts[4] == "cancel":
            batch.cancelled = not batch.ended or batch.cancelled
            answer = self._status(batch)
            answer["processing_status"] = "canceling"
            return httpx.Response(200, json=answer)
        return _error(400, "invalid_request_error", f"{method} {path}")

    @staticmethod
    def _status(batch: FakeBatch) -> dict[str, Any]:
        count = len(batch.requests)
        ended = batch.ended
        failed = sum(1 for item in batch.requests if _rule(item["params"]) == "fail")
        counts = {
            "processing": 0 if ended else count,
            "succeeded": 0 if not ended or batch.cancelled else count - failed,
            "errored": failed if ended and not batch.cancelled else 0,
            "canceled": count if batch.cancelled else 0,
            "expired": 0,
        }
        return {
            "id": batch.id,
            "type": "message_batch",
            "processing_status": "ended" if ended else "in_progress",
            "request_counts": counts,
            "cancel_initiated_at": "2026-08-19T14:49:30Z" if batch.cancelled else None,
            "results_url": f"https://api.anthropic.com/v1/messages/batches/{batch.id}/results",
        }

    @staticmethod
    def _result(batch: FakeBatch, item: dict[str, Any]) -> dict[str, Any]:
        custom_id = item["custom_id"]
        if batch.cancelled:
            return {"custom_id": custom_id, "result": {"type": "canceled"}}
        params = item["params"]
        rule = _rule(params)
        if rule == "fail":
            error = {"type": "invalid_request_error", "message": "scripted failure"}
            return {
                "custom_id": custom_id,
                "result": {"type": "errored", "error": {"type": "error", "error": error}},
            }
        content, stop = _answer(params, rule, f"{batch.id}_{custom_id}")
        message = {
            "id": f"msg_{batch.id}_{custom_id}",
            "type": "message",
            "role": "assistant",
            "model": f"{params['model']}-20251001",
            "content": content,
            "stop_reason": stop,
            "usage": USAGE,
        }
        return {"custom_id": custom_id, "result": {"type": "succeeded", "message": message}}


def _error(status: int, kind: str, message: str) -> httpx.Response:
    return httpx.Response(
        status, json={"type": "error", "error": {"type": kind, "message": message}}
    )


def _texts(message: dict[str, Any], kind: str) -> list[str]:
    blocks = message["content"]
    if isinstance(blocks, str):
        return [blocks] if kind == "text" else []
    found = []
    for block in blocks:
        if block["type"] != kind:
            continue
        if kind == "text":
            found.append(block["text"])
        else:
            found.append("".join(part["text"] for part in block.get("content") or []))
    return found


def _latest_user_text(params: dict[str, Any]) -> tuple[str, int]:
    """The latest user text, and how many assistant turns came after it."""
    messages = params["messages"]
    for index in range(len(messages) - 1, -1, -1):
        if messages[index]["role"] == "user":
            texts = _texts(messages[index], "text")
            if texts:
                after = messages[index + 1 :]
                return texts[-1], sum(1 for m in after if m["role"] == "assistant")
    return "", 0


def _rule(params: dict[str, Any]) -> str:
    return _latest_user_text(params)[0].split(" ", 1)[0]


def _answer(params: dict[str, Any], rule: str, prefix: str) -> tuple[list[dict[str, Any]], str]:
    text, round_ = _latest_user_text(params)
    kind, _, spec = rule.partition(":")
    if kind != "tools":
        return [{"type": "text", "text": f"echo: {text}"}], "end_turn"
    rounds = spec.split("|")
    if round_ < len(rounds):
        names = [name for name in rounds[round_].split(",") if name]
        blocks = [
            {
                "type": "tool_use",
                "id": f"toolu_{prefix}_{round_}_{index}",
                "name": name,
                "input": ARGUMENTS.get(name, {}),
            }
            for index, name in enumerate(names)
        ]
        return blocks, "tool_use"
    results = _texts(params["messages"][-1], "tool_result")
    return [{"type": "text", "text": "done: " + "; ".join(results)}], "end_turn"


@contextmanager
def serve_over_http(handler: FakeBatches) -> Iterator[str]:
    """Serve ``handler`` on a real loopback HTTP server; yields its base URL."""

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            request = httpx.Request(
                self.command,
                f"http://127.0.0.1{self.path}",
                headers=dict(self.headers.items()),
                content=self.rfile.read(length) if length else b"",
            )
            response = handler(request)
            body = response.read()
            self.send_response(response.status_code)
            self.send_header("Content-Type", response.headers.get("content-type", "text/plain"))
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = _answer  # noqa: N815 - the names http.server calls
        do_POST = _answer  # noqa: N815

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass  # keep test output quiet

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()

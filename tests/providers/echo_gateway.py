"""A gateway on 127.0.0.1 that refuses every request with an error repeating the request:
its method, URL and every header (``Proxy-Authorization`` included, when it is asked as a
forward proxy), as a careless gateway or a debugging proxy would. What it saw is kept, so
a test can check that nothing sensitive it was sent comes back to a user.

It refuses with an HTTP error status, or (``mid_stream``) with HTTP 200 and the error as the
stream's first event, in the wire format of the API the path names."""

from __future__ import annotations

import json
import struct
import threading
import zlib
from dataclasses import dataclass, field
from typing import Any

from tests.providers.local_servers import CountingServer, KeepAliveHandler

#: headers whose values are credentials (and the scheme word before a token, when any).
SENSITIVE_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "x-api-key",
        "api-key",
        "x-goog-api-key",
        "x-amz-security-token",
        "x-gateway-key",
    }
)


@dataclass
class Seen:
    """One request the gateway refused: its method, target (absolute when proxied) and
    headers, names lowered."""

    method: str
    target: str
    headers: dict[str, str]


@dataclass
class EchoState:
    """What the gateway answers (``status``) and what it has seen."""

    status: int = 400
    #: refuse with HTTP 200 and an error event instead of an error status.
    mid_stream: bool = False
    seen: list[Seen] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def sensitive_values(self) -> set[str]:
        """Every credential the gateway was sent: each sensitive header's value, and the
        token after its scheme word (``Bearer``, ``Basic``), and each part of a SigV4
        ``Authorization`` (``Credential=...``, ``Signature=...``)."""
        found: set[str] = set()
        with self.lock:
            requests = list(self.seen)
        for request in requests:
            for name, value in request.headers.items():
                if name not in SENSITIVE_HEADERS:
                    continue
                found.add(value)
                scheme, _, token = value.partition(" ")
                if token:
                    found.add(token)
                if scheme == "AWS4-HMAC-SHA256":
                    for part in token.split(","):
                        key, _, signed = part.strip().partition("=")
                        if key in ("Credential", "Signature"):
                            found.add(signed)
        return found


class EchoHandler(KeepAliveHandler):
    """Reads the body, then answers ``state.status`` with a JSON error repeating everything."""

    server: EchoServer

    def _echo(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        headers = {key.lower(): value for key, value in self.headers.items()}
        state = self.server.state
        with state.lock:
            state.seen.append(Seen(self.command, self.path, headers))
        lines = "; ".join(f"{key}: {value}" for key, value in self.headers.items())
        message = f"gateway refused {self.command} {self.path} sent with {lines}"
        error = {
            "code": state.status,
            "message": message,
            "type": "invalid_request_error",
            "status": "INVALID_ARGUMENT",
            "request": {"method": self.command, "url": self.path, "headers": headers},
        }
        if state.mid_stream:
            status, kind, payload = 200, *_stream_error(self.path, error)
        else:
            status, kind = state.status, "application/json"
            payload = json.dumps({"error": error, "message": message}).encode()
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_POST(self) -> None:
        self._echo()

    def do_GET(self) -> None:
        self._echo()


def _stream_error(path: str, error: dict[str, Any]) -> tuple[str, bytes]:
    """The content type and body of a stream whose first event is ``error``, as the API
    that ``path`` names sends one: Bedrock's event-stream exception, or server-sent events
    of Gemini (and Vertex AI), Anthropic, OpenAI Responses or Chat Completions."""
    message = error["message"]
    if "converse-stream" in path:
        headers = {
            ":exception-type": "validationException",
            ":content-type": "application/json",
            ":message-type": "exception",
        }
        return "application/vnd.amazon.eventstream", _frame(headers, {"message": message})
    if "streamGenerateContent" in path:
        event = {"error": error}
    elif path.endswith("/messages"):
        event = {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    elif path.endswith("/responses"):
        event = {"type": "error", "code": "invalid_request_error", "message": message}
    else:
        event = {"error": error}
    return "text/event-stream", f"data: {json.dumps(event)}\n\n".encode()


def _frame(headers: dict[str, str], payload: dict[str, Any]) -> bytes:
    """One ``application/vnd.amazon.eventstream`` message: prelude, headers, payload, CRCs."""
    head = b""
    for name, value in headers.items():
        raw_name, raw_value = name.encode(), value.encode()
        head += bytes([len(raw_name)]) + raw_name + b"\x07"  # 7: a string value
        head += struct.pack(">H", len(raw_value)) + raw_value
    body = json.dumps(payload).encode()
    prelude = struct.pack(">II", 12 + len(head) + len(body) + 4, len(head))
    prelude += struct.pack(">I", zlib.crc32(prelude))
    message = prelude + head + body
    return message + struct.pack(">I", zlib.crc32(message))


class EchoServer(CountingServer):
    """The echoing gateway; ``url`` is both its address as an endpoint and as a proxy."""

    def __init__(self) -> None:
        super().__init__(EchoHandler)
        self.state = EchoState()

    def proxy_url(self, user: str, password: str) -> str:
        """This gateway as an HTTP proxy that asks for ``user`` and ``password``."""
        return self.url.replace("http://", f"http://{user}:{password}@")

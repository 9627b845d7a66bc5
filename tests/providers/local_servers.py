"""Local HTTP/1.1 servers for the provider tests that need a real connection (keep-alive,
no Nagle delay, as the APIs' servers): :class:`CountingServer` counts the TCP connections
it accepts and those closed; :func:`serving` runs one on a thread for the length of a
block."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

S = TypeVar("S", bound="CountingServer")


class CountingServer(ThreadingHTTPServer):
    """Serves ``handler`` on a free port of 127.0.0.1; ``connections`` accepted so far, and
    ``closed``: those whose client has gone (its handler returned)."""

    daemon_threads = True
    request_queue_size = 128  # many calls may connect at once

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.lock = threading.Lock()
        self.connections = 0
        self.closed = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.lock:
            self.connections += 1
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        super().shutdown_request(request)
        with self.lock:
            self.closed += 1


class KeepAliveHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 with keep-alive and TCP_NODELAY; nothing logged."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the handler's API
        return None


@contextmanager
def serving(server: S) -> Iterator[S]:
    """``server`` answering on a thread of its own until the block ends."""
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()

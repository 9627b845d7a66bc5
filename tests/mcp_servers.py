"""The MCP test server (tests/mcp_server.py) as the tests run it: over stdio (an
``MCP_SERVERS`` entry, :func:`stdio_entry`) or over streamable HTTP in a subprocess of its
own (:class:`HttpServer`; the ``http_server`` fixture of tests/conftest.py), the tool calls
it logged (:func:`calls`), and settings naming servers (:func:`configure`)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.test import override_settings

SERVER_SCRIPT = Path(__file__).resolve().parent / "mcp_server.py"
DEADLINE = 30.0  # seconds the HTTP server may take to start


def stdio_entry(log: Path, **extra: Any) -> dict[str, Any]:
    """The MCP_SERVERS entry of the test server over stdio."""
    env = {"AGENTLOOP_TEST_MCP_LOG": str(log)}
    return {"command": [sys.executable, str(SERVER_SCRIPT), "stdio"], "env": env, **extra}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class HttpServer:
    """The test server over streamable HTTP, in a subprocess of its own."""

    process: subprocess.Popen[bytes]
    url: str
    log: Path
    output: Path

    @classmethod
    def start(cls, directory: Path) -> HttpServer:
        port = free_port()
        log, output = directory / "http-calls.log", directory / "http-server.out"
        env = {**os.environ, "AGENTLOOP_TEST_MCP_LOG": str(log)}
        with output.open("wb") as out:
            process = subprocess.Popen(  # noqa: S603 - our own interpreter and script
                [sys.executable, str(SERVER_SCRIPT), "http", str(port)],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        server = cls(process, f"http://127.0.0.1:{port}/mcp", log, output)
        deadline = time.monotonic() + DEADLINE
        while not server.answers():
            if process.poll() is not None or time.monotonic() > deadline:
                server.stop()
                raise AssertionError(f"the MCP server did not start:\n{output.read_text()}")
            time.sleep(0.05)
        return server

    def answers(self) -> bool:
        port = int(self.url.split(":")[2].split("/")[0])
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            return False
        return True

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
        self.process.wait(timeout=30)


def calls(log: Path) -> list[dict[str, Any]]:
    """The tool calls the server logged."""
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def configure(**servers: dict[str, Any]) -> Any:
    """``override_settings`` with these MCP servers on top of the tests' settings."""
    return override_settings(AGENTLOOP={**settings.AGENTLOOP, "MCP_SERVERS": servers})

"""Reading the chat event stream as the tests do (``agentloop:events``): its frames parsed
from a sync (:class:`Reader`) or async (:class:`AsyncReader`) streaming response, the stream's
URL, messages written behind it (:func:`say`), a real uvicorn serving the test site
(:func:`uvicorn_serving`), and the Redis the event tests use (:data:`REDIS_URL`; the
``redis_events`` fixture of tests/conftest.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from agentloop.models import Message
from tests.processes import REPO_ROOT, process_env
from tests.redis_urls import redis_url

# Streams are named by chat pk, which restarts at 1 in every test database: a Redis database
# per test process (1-14; the Celery tests use 15) keeps runs side by side apart.
REDIS_URL = os.environ.get("AGENTLOOP_TEST_SSE_REDIS_URL", redis_url(1 + os.getpid() % 14))
IN_CI = os.environ.get("CI") == "true"
DEADLINE = 30.0


@dataclass
class Frame:
    event: str | None = None
    id: str | None = None
    data: Any = None
    comment: str | None = None
    retry: int | None = None


def parse(block: str) -> Frame:
    frame = Frame()
    for line in block.split("\n"):
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "":
            frame.comment = value
        elif field == "event":
            frame.event = value
        elif field == "id":
            frame.id = value
        elif field == "data":
            frame.data = json.loads(value)
        elif field == "retry":
            frame.retry = int(value)
    return frame


class Reader:
    """Frames of a streaming response, parsed as they come (sync iterator)."""

    def __init__(self, response) -> None:
        self.response = response
        self.chunks = iter(response.streaming_content)
        self.buffer = ""

    def next_frame(self) -> Frame:
        deadline = time.monotonic() + DEADLINE
        while "\n\n" not in self.buffer:
            assert time.monotonic() < deadline, "no complete frame before the deadline"
            self.buffer += next(self.chunks).decode()
        block, self.buffer = self.buffer.split("\n\n", 1)
        self.last_block = block
        return parse(block)

    def until(self, condition) -> list[Frame]:
        """Frames up to and including the first that meets ``condition``."""
        seen = []
        while True:
            frame = self.next_frame()
            seen.append(frame)
            if condition(frame):
                return seen

    def close(self) -> None:
        # Through the test client's wrapper around the content (what a server does at the
        # end): it closes the response without letting request_finished close the test's
        # own database connection, as a plain response.close() would.
        self.response._iterator.close()


def is_state(frame: Frame) -> bool:
    return frame.event == "state"


def messages_in(frames: list[Frame]) -> list[tuple[str, str]]:
    return [(f.data["role"], f.data["content"]) for f in frames if f.event == "message"]


def events_url(chat) -> str:
    return reverse("agentloop:events", args=[chat.pk])


def say(chat, role: str, content: str, **fields) -> Message:
    return Message.objects.create(chat=chat, role=role, content=content, **fields)


class AsyncReader:
    def __init__(self, response) -> None:
        self.response = response
        self.chunks = response.streaming_content
        self.buffer = ""

    async def next_frame(self) -> Frame:
        while "\n\n" not in self.buffer:
            self.buffer += (await anext(self.chunks)).decode()
        block, self.buffer = self.buffer.split("\n\n", 1)
        return parse(block)

    async def until(self, condition) -> list[Frame]:
        seen = []
        while True:
            seen.append(await self.next_frame())
            if condition(seen[-1]):
                return seen

    async def close(self) -> None:
        await self.chunks.aclose()


def unavailable(reason: str) -> None:
    """Skip, or fail under ``CI=true``: CI must run the Redis event stream tests."""
    if IN_CI:
        pytest.fail(f"{reason}; under CI=true the Redis event stream tests must run")
    pytest.skip(f"{reason} (start it with: bash scripts/services.sh start)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def uvicorn_serving(tmp_path, settings: dict, **env: Any) -> Iterator[str]:
    """uvicorn serving the test site (``settings`` over its AGENTLOOP, ``env`` in its
    environment); yields the site's URL."""
    pytest.importorskip("uvicorn", reason="uvicorn is a dev dependency (pip install -e '.[dev]')")
    port = free_port()
    log = (tmp_path / "uvicorn.log").open("w")
    process = subprocess.Popen(  # noqa: S603 - our own interpreter
        [sys.executable, "-m", "uvicorn", "tests.asgi:application", "--port", str(port),
         "--host", "127.0.0.1", "--log-level", "warning"],
        env=process_env(AGENTLOOP_TEST_SETTINGS=json.dumps(settings), **env),
        cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_for_port(port, process, tmp_path / "uvicorn.log")
        yield f"http://localhost:{port}"  # a host the test settings allow
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


def wait_for_port(port: int, process, log) -> None:
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the server exited:\n{log.read_text()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"the server did not listen in time:\n{log.read_text()}")


def session_cookie(user) -> dict[str, str]:
    client = Client()
    client.force_login(user)
    return {"sessionid": client.cookies["sessionid"].value}

"""Test doubles for providers, shipped so your tests need no network.

``ScriptedProvider`` answers from a FIFO of scripted replies and records every
request; ``FunctionProvider`` decides each answer from the request. Register
either under a name and point a chat at it::

    provider = ScriptedProvider(tool_call("add", {"a": 1, "b": 2}), "3")
    agentloop.providers.register("scripted", provider)
    chat = agentloop.chat("scripted:any")
    chat.ask("1 + 2?")
    provider.assert_complete()

``OfflineProvider`` is the one made from settings: named in ``AGENTLOOP["PROVIDERS"]``, every
process (the shell, the web server, a worker) makes the same deterministic model, no key needed.

``block_network()`` makes any connection to a non-loopback address fail.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from .conf import agentloop_settings
from .exceptions import ConfigurationError
from .messages import (
    Chunk,
    ModelRequest,
    ModelResponse,
    TextDelta,
    ThinkingDelta,
    TokenUsage,
    ToolCall,
    ToolCallDelta,
)
from .providers.base import ChunkCallback, Provider

__all__ = [
    "FunctionProvider",
    "NetworkBlockedError",
    "OfflineProvider",
    "ScriptedProvider",
    "Stream",
    "block_network",
    "reply",
    "stream",
    "tool_call",
]


def tool_call(
    name: str, arguments: dict[str, Any] | None = None, *, id: str | None = None
) -> ToolCall:  # noqa: A002
    """A tool call for a scripted reply (the id is made up when not given)."""
    return ToolCall(id=id or f"call_{uuid.uuid4().hex[:10]}", name=name, arguments=arguments or {})


def reply(
    text: str = "",
    *tool_calls: ToolCall,
    usage: TokenUsage | None = None,
    parsed: Any = None,
    finish_reason: str | None = None,
    thinking: str = "",
) -> ModelResponse:
    """A scripted answer: text, tool calls, or both (and the thinking behind them)."""
    return ModelResponse(
        content=text,
        thinking=thinking,
        tool_calls=list(tool_calls),
        usage=usage or TokenUsage(input_tokens=10, output_tokens=max(1, len(text.split()))),
        parsed=parsed,
        finish_reason=finish_reason or ("tool_calls" if tool_calls else "stop"),
    )


@dataclass
class Stream:
    """A scripted streamed answer: ``chunks`` arrive ``delay`` seconds apart.

    When the caller does not stream, the chunks are joined into one answer.
    ``fail_after`` raises that exception after so many chunks (a dropped stream).
    """

    chunks: list[str | Chunk]
    delay: float = 0.0
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: TokenUsage | None = None
    fail_after: int | None = None
    error: BaseException | None = None


def stream(
    *chunks: str | Chunk,
    delay: float = 0.0,
    tool_calls: list[ToolCall] | None = None,
    fail_after: int | None = None,
    error: BaseException | None = None,
) -> Stream:
    """A scripted streamed answer (see :class:`Stream`)."""
    return Stream(list(chunks), delay, tool_calls or [], None, fail_after, error)


Reply = str | ModelResponse | ToolCall | list[ToolCall] | Stream | BaseException


def _to_response(item: Reply) -> ModelResponse | Stream | BaseException:
    if isinstance(item, str):
        return reply(item)
    if isinstance(item, ToolCall):
        return reply("", item)
    if isinstance(item, list):
        return reply("", *item)
    return item


def _play(script: Stream, on_chunk: ChunkCallback | None) -> ModelResponse:
    text: list[str] = []
    thoughts: list[str] = []
    for index, piece in enumerate(script.chunks):
        if script.fail_after is not None and index >= script.fail_after:
            raise script.error or RuntimeError("stream dropped")
        if script.delay:
            time.sleep(script.delay)
        chunk = TextDelta(text=piece) if isinstance(piece, str) else piece
        if isinstance(chunk, TextDelta):
            text.append(chunk.text)
        elif isinstance(chunk, ThinkingDelta):
            thoughts.append(chunk.text)
        if on_chunk is not None:
            on_chunk(chunk)
    if script.fail_after is not None and script.fail_after >= len(script.chunks):
        raise script.error or RuntimeError("stream dropped")
    if on_chunk is not None:
        for index, call in enumerate(script.tool_calls):
            on_chunk(ToolCallDelta(index=index, id=call.id, name=call.name))
            on_chunk(ToolCallDelta(index=index, arguments=json.dumps(call.arguments)))
    content = "".join(text)
    return ModelResponse(
        content=content,
        thinking="".join(thoughts),
        tool_calls=list(script.tool_calls),
        usage=script.usage or TokenUsage(input_tokens=10, output_tokens=len(script.chunks)),
        finish_reason="tool_calls" if script.tool_calls else "stop",
    )


class ScriptedProvider(Provider):
    """Answers with scripted replies, first in first out, and records each request.

    A reply is a string (a text answer), a :class:`ToolCall` or list of them, a
    :class:`~agentloop.messages.ModelResponse` (see :func:`reply`), a :class:`Stream`,
    or an exception instance (raised, e.g. ``RateLimitError("slow down")``).
    """

    name = "scripted"

    def __init__(self, *replies: Reply) -> None:
        self._replies: deque[Reply] = deque(replies)
        self._lock = threading.Lock()
        #: every request received, in order.
        self.requests: list[ModelRequest] = []

    def add(self, *replies: Reply) -> ScriptedProvider:
        """Queue more replies."""
        with self._lock:
            self._replies.extend(replies)
        return self

    @property
    def remaining(self) -> int:
        """Replies not used yet."""
        return len(self._replies)

    def assert_complete(self) -> None:
        """Fail if scripted replies were left unused."""
        if self._replies:
            raise AssertionError(f"{len(self._replies)} scripted replies were not used")

    def request(
        self, request: ModelRequest, *, on_chunk: ChunkCallback | None = None
    ) -> ModelResponse:
        with self._lock:
            self.requests.append(request)
            if not self._replies:
                raise AssertionError(
                    f"ScriptedProvider got request #{len(self.requests)} but has no replies left"
                )
            item = _to_response(self._replies.popleft())
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, Stream):
            return _play(item, on_chunk)
        if on_chunk is not None and item.thinking:
            on_chunk(ThinkingDelta(text=item.thinking))
        if on_chunk is not None and item.content:
            on_chunk(TextDelta(text=item.content))
        return item


class FunctionProvider(Provider):
    """Answers by calling ``function(request)``; it returns anything a scripted reply can be.

    Streams the text word by word when the caller streams (``delay`` between words).
    """

    name = "function"

    def __init__(self, function: Callable[[ModelRequest], Reply], *, delay: float = 0.0) -> None:
        self.function = function
        self.delay = delay
        self.requests: list[ModelRequest] = []

    def request(
        self, request: ModelRequest, *, on_chunk: ChunkCallback | None = None
    ) -> ModelResponse:
        self.requests.append(request)
        item = _to_response(self.function(request))
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, Stream):
            return _play(item, on_chunk)
        if on_chunk is not None and item.content:
            words = item.content.split(" ")
            pieces = [word + (" " if i < len(words) - 1 else "") for i, word in enumerate(words)]
            return _play(
                Stream(list(pieces), self.delay, list(item.tool_calls), item.usage), on_chunk
            ).model_copy(update={"parsed": item.parsed, "finish_reason": item.finish_reason})
        return item


class OfflineProvider(Provider):
    """A model that answers from settings: no key, no network, the same answer in any process.

    Made from settings like a real provider, so the shell that starts a chat and the worker
    that runs it both have it (a provider passed to ``register()`` exists only in the process
    that registered it)::

        AGENTLOOP["PROVIDERS"] = {
            "offline": {"class": "agentloop.testing.OfflineProvider", "reply": "Installed."},
        }

    Settings (``AGENTLOOP["PROVIDERS"][name]``), each also a constructor argument:

    ``reply``
        The answer's text; ``{message}`` in it stands for the latest user message.
        Default ``"You said: {message}"``.
    ``replies``
        Answers by user message (compared without surrounding spaces), tried before ``reply``.
    ``delay``
        Seconds between the words of a streamed answer (default 0), to watch a live page.

    The answer depends only on the transcript, so a retried or resumed step (on another
    worker, after a crash) gets the same one.
    """

    name = "offline"

    def __init__(
        self,
        name: str = "offline",
        *,
        reply: str | None = None,
        replies: dict[str, str] | None = None,
        delay: float | None = None,
    ) -> None:
        self.name = name
        configured: dict[str, Any] = agentloop_settings.PROVIDERS.get(name) or {}
        where = f"AGENTLOOP['PROVIDERS'][{name!r}]"
        self.reply: str = self._checked(
            reply if reply is not None else configured.get("reply", "You said: {message}"),
            str,
            f"{where}['reply'] must be a string",
        )
        self.replies: dict[str, str] = self._checked(
            replies if replies is not None else configured.get("replies", {}),
            dict,
            f"{where}['replies'] must be a dict of user message to answer",
        )
        raw_delay = delay if delay is not None else configured.get("delay", 0)
        if isinstance(raw_delay, bool) or not isinstance(raw_delay, int | float) or raw_delay < 0:
            raise ConfigurationError(f"{where}['delay'] must be a number of seconds >= 0")
        self.delay = float(raw_delay)

    @staticmethod
    def _checked(value: Any, kind: type, message: str) -> Any:
        if not isinstance(value, kind):
            raise ConfigurationError(message)
        return value

    def answer_to(self, message: str) -> str:
        """The text this model answers to a user message."""
        key = message.strip()
        if key in self.replies:
            return str(self.replies[key])
        # replace(), not format(): braces in a user's message must not be read as fields.
        return self.reply.replace("{message}", message)

    def request(
        self, request: ModelRequest, *, on_chunk: ChunkCallback | None = None
    ) -> ModelResponse:
        latest = next((m.content for m in reversed(request.messages) if m.role == "user"), "")
        text = self.answer_to(latest)
        words = text.split(" ")
        if on_chunk is not None:
            pieces = [word + (" " if i < len(words) - 1 else "") for i, word in enumerate(words)]
            _play(Stream(list(pieces), self.delay), on_chunk)
        return reply(text)


class NetworkBlockedError(ConnectionError):
    """A test tried to reach the network."""


_LOOPBACK = ("127.", "::1", "localhost")


@contextmanager
def block_network() -> Iterator[None]:
    """Refuse connections to anything but loopback and Unix sockets while active."""
    original = socket.socket.connect

    def guarded(sock: socket.socket, address: Any) -> Any:
        host = address[0] if isinstance(address, tuple) else None
        if host is not None and not str(host).startswith(_LOOPBACK):
            raise NetworkBlockedError(f"Network access to {address!r} is blocked in tests")
        return original(sock, address)

    socket.socket.connect = guarded  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        socket.socket.connect = original  # type: ignore[method-assign]

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
import re
import socket
import string
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from .conf import agentloop_settings
from .exceptions import ConfigurationError, ProviderError
from .messages import (
    Chunk,
    Message,
    ModelRequest,
    ModelResponse,
    TextDelta,
    ThinkingDelta,
    TokenUsage,
    ToolCall,
    ToolCallDelta,
)
from .providers.base import ChunkCallback, Provider
from .providers.batch_apis import ENDED, IN_PROGRESS, BatchAPI, BatchInfo, BatchResult

__all__ = [
    "FunctionProvider",
    "NetworkBlockedError",
    "OfflineBatchAPI",
    "OfflineProvider",
    "OfflineRule",
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


@dataclass(frozen=True)
class OfflineRule:
    """One rule of :class:`OfflineProvider`: a user message it matches, the tool call it
    makes, and the answer it gives once the call has a result."""

    #: searched in the latest user message (case-insensitive); its named groups fill the
    #: templates below.
    match: re.Pattern[str]
    #: the tool to call (a rule whose tool the chat doesn't offer is skipped).
    tool: str
    #: the call's arguments; ``{group}`` and ``{message}`` in a string value are filled in
    #: (other values are sent as they are).
    arguments: dict[str, Any]
    #: the answer; ``{result}`` is the tool's result, with the groups and ``{message}``.
    answer: str

    def fill(self, template: str, found: re.Match[str], **more: str) -> str:
        """``template`` with the match's groups, the message and ``more`` filled in."""
        values = {key: value or "" for key, value in found.groupdict().items()}
        # format_map on the settings' template only: braces in the user's text stay text.
        return template.format_map({**values, "message": found.string, **more})


def _fields(template: str) -> set[str]:
    """The ``{field}`` names a template uses."""
    return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}


def _offline_rule(where: str, raw: Any) -> OfflineRule:
    """A rule from settings, or a one-line ConfigurationError saying what is wrong."""
    if not isinstance(raw, dict):
        raise ConfigurationError(f"{where} must be a dict with 'match' and 'tool'")
    unknown = set(raw) - {"match", "tool", "arguments", "answer"}
    if unknown:
        raise ConfigurationError(
            f"{where} has unknown keys {sorted(unknown)} (known: match, tool, arguments, answer)"
        )
    pattern, tool, arguments, answer = (
        raw.get("match"), raw.get("tool"), raw.get("arguments", {}), raw.get("answer", "{result}")
    )  # fmt: skip
    if not isinstance(pattern, str) or not pattern:
        raise ConfigurationError(f"{where}['match'] must be a regular expression (a string)")
    try:
        match = re.compile(pattern, re.IGNORECASE)
    except re.error as exc:
        raise ConfigurationError(f"{where}['match'] is not a regular expression: {exc}") from exc
    if not isinstance(tool, str) or not tool:
        raise ConfigurationError(f"{where}['tool'] must be a tool's name")
    if not isinstance(arguments, dict):
        raise ConfigurationError(f"{where}['arguments'] must be a dict of argument to value")
    if not isinstance(answer, str):
        raise ConfigurationError(f"{where}['answer'] must be a string")
    groups = set(match.groupindex) | {"message"}
    templates = [(f"{where}['answer']", answer, groups | {"result"})] + [
        (f"{where}['arguments'][{key!r}]", value, groups)
        for key, value in arguments.items()
        if isinstance(value, str)
    ]
    for place, template, allowed in templates:
        try:
            missing = _fields(template) - allowed
        except ValueError as exc:
            raise ConfigurationError(f"{place} is not a template: {exc}") from exc
        if missing:
            raise ConfigurationError(
                f"{place} uses {{{sorted(missing)[0]}}}, which is neither a named group of "
                f"'match' nor one of {sorted(allowed - set(match.groupindex))}"
            )
    return OfflineRule(match=match, tool=tool, arguments=dict(arguments), answer=answer)


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
    ``rules``
        Tool calls by user message, tried first: a list of dicts, each ``match`` (a regular
        expression searched in the latest user message, case-insensitive), ``tool`` (the
        tool's name), ``arguments`` (``{group}`` in a string value is the match's named
        group, ``{message}`` the whole message; a value filled into an ``integer``,
        ``number`` or ``boolean`` parameter of the tool becomes one) and ``answer`` (said
        once the call has its result: ``{result}`` is the result's text; default
        ``"{result}"``). Every rule that
        matches and whose tool the chat offers makes one call, in the rules' order, all in
        one answer; the next answer says each rule's ``answer`` (an error result is told as
        ``"The <tool> tool failed: <result>"``). A message no rule matches gets ``replies``
        or ``reply``.
    ``delay``
        Seconds between the words of a streamed answer (default 0), to watch a live page.

    The answer depends only on the transcript, so a retried or resumed step (on another
    worker, after a crash) gets the same one.

    It serves batches too (:class:`OfflineBatchAPI`): ``agentloop.batch`` and batch-mode
    evals run offline, polled in the process that sent them.
    """

    name = "offline"

    def __init__(
        self,
        name: str = "offline",
        *,
        reply: str | None = None,
        replies: dict[str, str] | None = None,
        rules: list[dict[str, Any]] | None = None,
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
        raw_rules = self._checked(
            rules if rules is not None else configured.get("rules", []),
            list,
            f"{where}['rules'] must be a list of dicts (match, tool, arguments, answer)",
        )
        #: the tool rules, in order.
        self.rules: list[OfflineRule] = [
            _offline_rule(f"{where}['rules'][{n}]", raw) for n, raw in enumerate(raw_rules)
        ]
        raw_delay = delay if delay is not None else configured.get("delay", 0)
        if isinstance(raw_delay, bool) or not isinstance(raw_delay, int | float) or raw_delay < 0:
            raise ConfigurationError(f"{where}['delay'] must be a number of seconds >= 0")
        self.delay = float(raw_delay)
        #: the batches sent in this process: their answers by custom id.
        self.batches: dict[str, dict[str, BatchResult]] = {}

    def batch_api(self) -> OfflineBatchAPI:
        """Its batch API (see :class:`OfflineBatchAPI`)."""
        return OfflineBatchAPI(self)

    @staticmethod
    def _checked(value: Any, kind: type, message: str) -> Any:
        if not isinstance(value, kind):
            raise ConfigurationError(message)
        return value

    def answer_to(self, message: str) -> str:
        """The text this model answers to a user message no rule calls a tool for."""
        key = message.strip()
        if key in self.replies:
            return str(self.replies[key])
        # replace(), not format(): braces in a user's message must not be read as fields.
        return self.reply.replace("{message}", message)

    def matches(
        self, message: str, offered: set[str] | None = None
    ) -> list[tuple[OfflineRule, re.Match[str]]]:
        """The rules a user message sets off, in order, with their matches; ``offered``
        (default: any) leaves out rules whose tool the chat doesn't offer."""
        found = []
        for rule in self.rules:
            match = rule.match.search(message)
            if match is not None and (offered is None or rule.tool in offered):
                found.append((rule, match))
        return found

    def request(
        self, request: ModelRequest, *, on_chunk: ChunkCallback | None = None
    ) -> ModelResponse:
        messages = request.messages
        last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)
        latest = messages[last_user].content if last_user >= 0 else ""
        turn = messages[last_user + 1 :]
        asked = [call for m in turn for call in m.tool_calls]
        offered = set() if request.tool_choice == "none" else {t.name for t in request.tools}
        schemas = {t.name: t.parameters.get("properties") or {} for t in request.tools}
        calls: list[ToolCall] = []
        if asked:  # this turn's calls have their results: say what the rules answer
            text = self._answers(self.matches(latest, offered), asked, turn)
        else:
            found = self.matches(latest, offered)
            if request.parallel_tool_calls is False:
                found = found[:1]
            # Ids unique in the chat and the same on every run: numbered after earlier calls.
            earlier = sum(len(m.tool_calls) for m in messages)
            calls = [
                ToolCall(
                    id=f"offline_{earlier + n}",
                    name=rule.tool,
                    arguments={
                        key: _typed(
                            rule.fill(value, match) if isinstance(value, str) else value,
                            schemas[rule.tool].get(key),
                        )
                        for key, value in rule.arguments.items()
                    },
                )
                for n, (rule, match) in enumerate(found, 1)
            ]
            text = "" if calls else self.answer_to(latest)
        words = text.split(" ") if text else []
        pieces: list[str | Chunk] = [
            w + (" " if i < len(words) - 1 else "") for i, w in enumerate(words)
        ]
        if on_chunk is not None:
            return _play(Stream(pieces, self.delay, calls), on_chunk)
        return reply(text, *calls)

    @staticmethod
    def _answers(
        found: list[tuple[OfflineRule, re.Match[str]]], asked: list[ToolCall], turn: list[Message]
    ) -> str:
        """One sentence per call of the turn, from the rule that made it (same order)."""
        results = {m.tool_call_id: m for m in turn if m.role == "tool"}
        sentences = []
        for index, call in enumerate(asked):
            result = results.get(call.id)
            content = result.content if result is not None else ""
            if result is not None and result.is_error:
                sentences.append(f"The {call.name} tool failed: {content}")
            elif index < len(found) and found[index][0].tool == call.name:
                rule, match = found[index]
                sentences.append(rule.fill(rule.answer, match, result=content))
            else:
                sentences.append(content)
        return " ".join(sentences)


class OfflineBatchAPI(BatchAPI):
    """An :class:`OfflineProvider`'s batches, answered in memory: each request is answered
    as ``request()`` answers it when the batch is sent; the batch reads as in progress then,
    and as ended from its first status read on. Kept by the provider object, so a batch is
    polled in the process that sent it (``eval run --batch`` polls in its own)."""

    mixed_models = True
    provider: OfflineProvider

    def submit(self, items: Any, *, display_name: str | None = None) -> BatchInfo:
        answers: dict[str, BatchResult] = {}
        for custom_id, request in items:
            try:
                answers[custom_id] = self.provider.request(request)
            except ProviderError as exc:
                answers[custom_id] = exc
        batch_id = f"offline_batch_{uuid.uuid4().hex[:12]}"
        self.provider.batches[batch_id] = answers
        return self._info(batch_id, IN_PROGRESS)

    def status(self, batch_id: str) -> BatchInfo:
        return self._info(batch_id, ENDED)

    def results(self, batch_id: str) -> dict[str, BatchResult]:
        return dict(self._answers(batch_id))

    def cancel(self, batch_id: str) -> BatchInfo | None:
        return self._info(batch_id, ENDED)  # every request was answered when it was sent

    def _answers(self, batch_id: str) -> dict[str, BatchResult]:
        answers = self.provider.batches.get(batch_id)
        if answers is None:
            raise ProviderError(
                f"Offline batch {batch_id} is not in this process: an offline batch is "
                "polled in the process that sent it."
            )
        return answers

    def _info(self, batch_id: str, status: str) -> BatchInfo:
        answers = self._answers(batch_id)
        failed = sum(1 for answer in answers.values() if isinstance(answer, ProviderError))
        ended = status == ENDED
        return BatchInfo(
            id=batch_id, status=status, request_count=len(answers),
            processing_count=0 if ended else len(answers),
            succeeded_count=len(answers) - failed if ended else 0,
            failed_count=failed if ended else 0,
        )  # fmt: skip


def _typed(value: Any, schema: Any) -> Any:
    """A filled-in string as the JSON type the tool's parameter has (a number for an
    ``integer`` one), as a model writes it; left a string when it doesn't read as one."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    if not isinstance(value, str) or kind not in ("integer", "number", "boolean"):
        return value
    text = value.strip()
    if kind == "boolean":
        return {"true": True, "false": False}.get(text.lower(), value)
    try:
        return int(text) if kind == "integer" else float(text) if "." in text else int(text)
    except ValueError:
        return value


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

"""A deterministic provider for worker processes: it decides each answer from the transcript.

Registered in ``tests/settings.py`` as ``AGENTLOOP["PROVIDERS"]["rules"]``, so a chat with
model ``"rules:test"`` gets the same answers in the test process, an embedded thread and a
Celery worker subprocess, with nothing to script per process. The rule is the first word of
the latest user message (anything after a space is a free label, e.g. to keep chats apart):

``tools:step_one,step_two|step_three``
    One round of tool calls per ``|``-separated group (``step_one`` and ``step_two`` in one
    answer; after their results ``step_three``); after the last round, a final text
    ``"done: <the last round's results, joined by '; '>"``. Call ids are
    ``call_<turn>_<round>_<index>`` (turn = user messages so far), the same in any process.
    Arguments come from :data:`ARGUMENTS` by tool name.
``stream:<chunks>:<delay>``
    Streams ``w0 w1 ...`` (one word per chunk) ``delay`` seconds apart.
``sleep:<seconds>``
    Waits, then answers ``"slept"``.
``fail-once:<status>``
    The first request of this rule's turn fails with that HTTP status's error (429 and 5xx
    are transient, 401 permanent); later ones answer ``"recovered"``. Counted in
    ``$AGENTLOOP_TEST_PROVIDER_LOG`` when set (so it holds across processes), else in memory.
anything else
    ``"echo: <the message>"``, at once (the zero-latency provider of the benchmarks).

Each request is appended to ``$AGENTLOOP_TEST_PROVIDER_LOG`` (one JSON line: rule, turn,
round, pid, and the request's model, system message and tool names) when that is set, so a
test can count model calls made by any process and see which agent made each.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

from agentloop.conf import agentloop_settings
from agentloop.exceptions import AuthenticationError, RateLimitError, ServerError
from agentloop.messages import ModelRequest, ModelResponse, TextDelta, TokenUsage, ToolCall
from agentloop.providers import ChunkCallback, Provider

#: arguments of the tools a rule names (tools without an entry get none).
ARGUMENTS: dict[str, dict[str, Any]] = {
    "charge_card": {"amount": 42},
    "charge_card_slowly": {"amount": 42},
    "add": {"a": 2, "b": 3},
    "slow": {"seconds": 0.2},
    "book_table": {"day": "friday"},  # the MCP test server's tool that asks a person
    "guard": {"amount": 500},
    "ask_accounting": {"invoice": "INV-7"},
    "transfer_to_refunds": {"order": "7"},
    "lookup_order": {"order": "7"},
    "invoice_total": {"order": "7"},
    "escalate": {"customer": "Ada"},
    # the Clerk subagent (tests/editing_agents.py) is handed a task that makes it wait
    "clerk": {"task": "tools:ask_accounting"},
    # the memory tools (tests/test_memory_celery.py): one owner's fact, and a search that
    # names that owner, as a prompt injection in another owner's chat would have it
    "remember": {"text": "Ada edits her code in the Vim editor"},
    "recall": {"query": "memories of user ada: which editor does ada use"},
}

_LOG_ENV = "AGENTLOOP_TEST_PROVIDER_LOG"
_lock = threading.Lock()
_seen: Counter[tuple[str, int]] = Counter()


def logged_requests(path: Path) -> list[dict[str, Any]]:
    """The requests recorded in a provider log (for assertions)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _position(request: ModelRequest) -> tuple[str, int, int, list[Any]]:
    """The latest user message, the turn number, the round, and what came after it."""
    messages = [m for m in request.messages if m.is_finished]
    turn = sum(1 for m in messages if m.role == "user")
    last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)
    content = messages[last_user].content if last_user >= 0 else ""
    after = messages[last_user + 1 :]
    rounds = sum(1 for m in after if m.role == "assistant")
    return content, turn, rounds, after


class RuleProvider(Provider):
    """Answers by the rule in the latest user message (see the module docstring). With
    ``"price_per_token"`` in its ``AGENTLOOP["PROVIDERS"]`` entry every token (input or
    output) costs that many dollars (the budget tests' "priced" model)."""

    def __init__(self, name: str = "rules") -> None:
        self.name = name
        price = (agentloop_settings.PROVIDERS.get(name) or {}).get("price_per_token")
        self.price = None if price is None else Decimal(str(price))

    def cost(self, model: str, usage: TokenUsage) -> Decimal | None:
        if self.price is None:
            return None
        return (usage.input_tokens + usage.output_tokens) * self.price

    def _record(self, rule: str, turn: int, round_: int, request: ModelRequest) -> int:
        """Log this request; returns how many requests of this rule and turn came before."""
        key = (rule, turn)
        path = os.environ.get(_LOG_ENV)
        with _lock:
            if not path:
                _seen[key] += 1
                return _seen[key] - 1
            log = Path(path)
            before = sum(
                1 for entry in logged_requests(log) if (entry["rule"], entry["turn"]) == key
            )
            with log.open("a") as handle:
                line = {
                    "rule": rule, "turn": turn, "round": round_, "pid": os.getpid(),
                    # which agent asked: its model, instructions and tools
                    "model": request.model,
                    "system": next(
                        (m.content for m in request.messages if m.role == "system"), ""
                    ),
                    "tools": sorted(definition.name for definition in request.tools),
                }  # fmt: skip
                handle.write(json.dumps(line) + "\n")
                handle.flush()
                os.fsync(handle.fileno())
            return before

    def request(
        self, request: ModelRequest, *, on_chunk: ChunkCallback | None = None
    ) -> ModelResponse:
        content, turn, round_, after = _position(request)
        rule = content.split(" ", 1)[0]
        before = self._record(rule, turn, round_, request)
        kind, _, spec = rule.partition(":")
        if kind == "tools":
            return self._tools(spec.split("|"), turn, round_, after)
        if kind == "stream":
            count, _, delay = spec.partition(":")
            return self._stream([f"w{i} " for i in range(int(count))], float(delay or 0), on_chunk)
        if kind == "sleep":
            time.sleep(float(spec))
            return self._text("slept", on_chunk)
        if kind == "fail-once":
            if before == 0:
                raise _error(int(spec))
            return self._text("recovered", on_chunk)
        return self._text(f"echo: {content}", on_chunk)

    def _tools(self, rounds: list[str], turn: int, round_: int, after: list[Any]) -> ModelResponse:
        if round_ < len(rounds):
            names = [name for name in rounds[round_].split(",") if name]
            calls = [
                ToolCall(
                    id=f"call_{turn}_{round_}_{index}", name=name, arguments=ARGUMENTS.get(name, {})
                )
                for index, name in enumerate(names)
            ]
            return ModelResponse(
                tool_calls=calls,
                usage=TokenUsage(input_tokens=10, output_tokens=len(calls)),
                finish_reason="tool_calls",
            )
        last_round = [m.content for m in after[-len(rounds[-1].split(",")) :] if m.role == "tool"]
        return ModelResponse(
            content="done: " + "; ".join(last_round),
            usage=TokenUsage(input_tokens=10, output_tokens=2),
            finish_reason="stop",
        )

    def _text(self, text: str, on_chunk: ChunkCallback | None) -> ModelResponse:
        if on_chunk is not None:
            on_chunk(TextDelta(text=text))
        return ModelResponse(
            content=text,
            usage=TokenUsage(input_tokens=10, output_tokens=len(text.split())),
            finish_reason="stop",
        )

    def _stream(
        self, pieces: list[str], delay: float, on_chunk: ChunkCallback | None
    ) -> ModelResponse:
        for piece in pieces:
            if delay:
                time.sleep(delay)
            if on_chunk is not None:
                on_chunk(TextDelta(text=piece))
        return ModelResponse(
            content="".join(pieces),
            usage=TokenUsage(input_tokens=10, output_tokens=len(pieces)),
            finish_reason="stop",
        )


def _error(status: int) -> Exception:
    message = f"scripted HTTP {status}"
    if status == 429:
        return RateLimitError(message, status=status, retry_after=0)
    if status >= 500:
        return ServerError(message, status=status)
    return AuthenticationError(message, status=status)

"""A deterministic provider for the terminal chat tests, usable in a ``manage.py`` subprocess.

The subprocess names it in its settings (``AGENTLOOP["PROVIDERS"]["terminal"]["class"]``),
so ``--model terminal:test`` answers the same there as in the test process. Rules, by the
first word of the latest user message (anything else is the :class:`RuleProvider`'s, e.g.
``stream:<chunks>:<delay>`` for a slow stream and ``echo: ...`` for any other text):

``gate``
    Streams ``"first "``, then holds until the file named by ``$AGENTLOOP_TEST_GATE``
    exists, then streams ``"second "`` and ``"third."``: a test sees the first chunk
    arrive while the answer is provably unfinished, with no timing involved.
``pay <amount> <to>``
    Calls ``transfer(amount, to)`` (a tool that needs approval), then answers
    ``"paid: <the result>"``.
``ask <question>``
    Calls ``ask_manager(question)`` (a tool that waits for a person's answer), then
    answers ``"the manager said: <the result>"``.
``broken``
    Fails with a permanent error (HTTP 401).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from agentloop.exceptions import AuthenticationError
from agentloop.messages import ModelRequest, ModelResponse, TextDelta, TokenUsage, ToolCall
from agentloop.providers import ChunkCallback
from tests.worker_provider import RuleProvider

__all__ = ["TerminalProvider"]

GATE_ENV = "AGENTLOOP_TEST_GATE"
#: how long ``gate`` waits for its file before giving up (a test failing, not a hang).
GATE_TIMEOUT = 60


class TerminalProvider(RuleProvider):
    """The rules above, then :class:`RuleProvider`'s."""

    def __init__(self, name: str = "terminal") -> None:
        super().__init__(name)

    def request(
        self, request: ModelRequest, *, on_chunk: ChunkCallback | None = None
    ) -> ModelResponse:
        messages = [m for m in request.messages if m.is_finished]
        last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)
        words = messages[last_user].content.split() if last_user >= 0 else []
        results = [m for m in messages[last_user + 1 :] if m.role == "tool"]
        rule = words[0] if words else ""
        if rule == "broken":
            raise AuthenticationError("scripted HTTP 401", status=401)
        if rule == "gate":
            return self._gated(on_chunk)
        if rule == "pay" and len(words) == 3:
            if results:
                return self._text(f"paid: {results[-1].content}", on_chunk)
            arguments = {"amount": int(words[1]), "to": words[2]}
            return self._call(messages, "transfer", arguments)
        if rule == "ask" and len(words) > 1:
            if results:
                return self._text(f"the manager said: {results[-1].content}", on_chunk)
            return self._call(messages, "ask_manager", {"question": " ".join(words[1:])})
        return super().request(request, on_chunk=on_chunk)

    @staticmethod
    def _call(messages: list, name: str, arguments: dict) -> ModelResponse:
        earlier = sum(len(m.tool_calls) for m in messages)
        call = ToolCall(id=f"term_{earlier + 1}", name=name, arguments=arguments)
        return ModelResponse(
            tool_calls=[call],
            usage=TokenUsage(input_tokens=10, output_tokens=3),
            finish_reason="tool_calls",
        )

    @staticmethod
    def _gated(on_chunk: ChunkCallback | None) -> ModelResponse:
        pieces = ["first ", "second ", "third."]
        if on_chunk is not None:
            on_chunk(TextDelta(text=pieces[0]))
        gate = os.environ.get(GATE_ENV)
        deadline = time.monotonic() + GATE_TIMEOUT
        while gate and not Path(gate).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        if on_chunk is not None:
            for piece in pieces[1:]:
                on_chunk(TextDelta(text=piece))
        return ModelResponse(
            content="".join(pieces),
            usage=TokenUsage(input_tokens=10, output_tokens=3),
            finish_reason="stop",
        )

"""An offline, rule-based model for the demo: no network, no API key, same answer every time.

It reads the latest user message and calls the tools it recognises (several in
one answer when the message asks for several things); once their results are in
the transcript it sums them up. It only calls tools the chat offers.

- arithmetic such as ``(12 + 30) * 2``          -> ``calculator``
- "weather in Paris and Tokyo"                   -> ``weather`` once per city
- "note: ..." / "remember that ..."             -> ``save_note``
- "notes" / "what did I note"                   -> ``list_notes``
"""

from __future__ import annotations

import json
import re
from typing import Any

from agentloop.messages import (
    Message,
    ModelRequest,
    ModelResponse,
    TextDelta,
    TokenUsage,
    ToolCall,
    ToolCallDelta,
)
from agentloop.providers import ChunkCallback, Provider

__all__ = ["RuleBasedProvider", "plan_tool_calls"]

_SAVE_NOTE = re.compile(r"(?:\bnote:|\bremember(?:\s+that)?\b)\s*(?P<text>\S.*)", re.I | re.S)
_LIST_NOTES = re.compile(r"\bnotes\b|\bwhat did i note\b", re.I)
_CITY = r"[A-Z][\w'-]*(?:\s+[A-Z][\w'-]*)*"
_WEATHER = re.compile(
    rf"(?i:\bweather\s+(?:in|for))\s+(?P<cities>{_CITY}(?:\s*(?:,|\band\b)\s*(?:in\s+)?{_CITY})*)"
)
_CITY_SEPARATOR = re.compile(r"\s*(?:,|\band\b)\s*(?:in\s+)?")
_EXPRESSION = re.compile(r"[-(]*\d[\d.\s()+\-*/]*[\d)]")
_OPERATOR = re.compile(r"[\d)]\s*(?:\*\*|[-+*/])\s*[-+(]*\d")

HELP = (
    "I'm the offline demo model. I can do arithmetic such as (12 + 30) * 2, tell you the "
    '(made-up) weather in a city, save a note ("remember that ...") and list your notes.'
)


def _balanced(expression: str) -> str:
    """Drop parentheses the sentence around an expression opened or closed."""
    while expression.count("(") > expression.count(")") and expression.startswith("("):
        expression = expression[1:]
    while expression.count(")") > expression.count("(") and expression.endswith(")"):
        expression = expression[:-1]
    return expression.strip()


def plan_tool_calls(text: str) -> list[tuple[str, dict[str, Any]]]:
    """The ``(tool name, arguments)`` calls a user message asks for, in reading order."""
    found: list[tuple[int, str, dict[str, Any]]] = []
    note = _SAVE_NOTE.search(text)
    if note:  # everything after "remember" is the note, not more requests
        found.append((note.start(), "save_note", {"text": note["text"].strip().rstrip(".")}))
        text = text[: note.start()]
    for match in _EXPRESSION.finditer(text):
        expression = _balanced(match.group())
        if _OPERATOR.search(expression):
            found.append((match.start(), "calculator", {"expression": expression}))
    for match in _WEATHER.finditer(text):
        for offset, city in enumerate(_CITY_SEPARATOR.split(match["cities"])):
            found.append((match.start() + offset, "weather", {"city": city}))
    listing = _LIST_NOTES.search(text)
    if listing:
        found.append((listing.start(), "list_notes", {}))
    return [(name, arguments) for _, name, arguments in sorted(found, key=lambda f: f[0])]


def _summary(call: ToolCall, result: Message) -> str:
    """One sentence about one tool result."""
    if result.is_error:
        return f"The {call.name} tool reported a problem: {result.content}"
    try:
        data: Any = json.loads(result.content)
    except ValueError:
        data = result.content
    if call.name == "calculator":
        return f"{call.arguments.get('expression')} = {result.content}."
    if call.name == "weather" and isinstance(data, dict):
        return (
            f"In {data['city']} it is {data['temperature_c']} °C and {data['conditions']} "
            f"({data['source']})."
        )
    if call.name == "save_note":
        return f"I saved your note: {call.arguments.get('text')}."
    if call.name == "list_notes" and isinstance(data, dict):
        if not data["notes"]:
            return "You have no notes yet."
        listed = "; ".join(f"{n}) {text}" for n, text in enumerate(data["notes"], 1))
        return f"Your notes: {listed}."
    return f"{call.name} returned: {result.content}"


def _join(names: list[str]) -> str:
    unique = list(dict.fromkeys(names))
    return unique[0] if len(unique) == 1 else ", ".join(unique[:-1]) + " and " + unique[-1]


def _words(text: str) -> int:
    return len(text.split())


def _call_words(calls: list[ToolCall]) -> int:
    return sum(_words(f"{call.name} {json.dumps(call.arguments)}") for call in calls)


class RuleBasedProvider(Provider):
    """Decides each answer from the transcript with the rules above; streams word by word."""

    name = "demo"

    def request(
        self, request: ModelRequest, *, on_chunk: ChunkCallback | None = None
    ) -> ModelResponse:
        messages = request.messages
        last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)
        turn = messages[last_user + 1 :]
        results = [m for m in turn if m.role == "tool"]
        calls: list[ToolCall] = []
        if last_user < 0:
            text = HELP
        elif results:  # the tools have answered: sum up
            asked = {call.id: call for m in turn for call in m.tool_calls}
            text = " ".join(
                _summary(asked[r.tool_call_id], r) for r in results if r.tool_call_id in asked
            )
        else:
            calls = self._calls(request, messages[last_user].content)
            text = f"Let me use {_join([c.name for c in calls])}." if calls else HELP
        if on_chunk is not None:
            self._stream(text, calls, on_chunk)
        return ModelResponse(
            content=text,
            tool_calls=calls,
            usage=self._usage(request, text, calls),
            finish_reason="tool_calls" if calls else "stop",
            model=request.model,
        )

    def _calls(self, request: ModelRequest, text: str) -> list[ToolCall]:
        offered = {tool.name for tool in request.tools}
        if request.tool_choice == "none":
            offered = set()
        planned = [(name, args) for name, args in plan_tool_calls(text) if name in offered]
        if request.parallel_tool_calls is False:
            planned = planned[:1]
        # Ids unique in the chat and the same on every run: numbered after the earlier calls.
        earlier = sum(len(m.tool_calls) for m in request.messages)
        return [
            ToolCall(id=f"demo_{earlier + n}", name=name, arguments=arguments)
            for n, (name, arguments) in enumerate(planned, 1)
        ]

    @staticmethod
    def _stream(text: str, calls: list[ToolCall], on_chunk: ChunkCallback) -> None:
        words = text.split(" ")
        for n, word in enumerate(words):
            on_chunk(TextDelta(text=word if n == len(words) - 1 else word + " "))
        for index, call in enumerate(calls):
            on_chunk(ToolCallDelta(index=index, id=call.id, name=call.name))
            on_chunk(ToolCallDelta(index=index, arguments=json.dumps(call.arguments)))

    @staticmethod
    def _usage(request: ModelRequest, text: str, calls: list[ToolCall]) -> TokenUsage:
        """Words stand in for tokens: what was read (transcript and tools), what was written."""
        read = sum(_words(m.content) + _call_words(m.tool_calls) for m in request.messages)
        read += sum(
            _words(f"{t.name} {t.description} {json.dumps(t.parameters)}") for t in request.tools
        )
        written = _words(text) + _call_words(calls)
        return TokenUsage(input_tokens=read, output_tokens=written)

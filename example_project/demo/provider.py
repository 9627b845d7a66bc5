"""An offline, rule-based model for the demo: no network, no API key, same answer every time.

It reads the latest user message and calls the tools it recognises (several in
one answer when the message asks for several things); once their results are in
the transcript it sums them up. It only calls tools the chat offers.

- arithmetic such as ``(12 + 30) * 2``          -> ``calculator``
- "weather in Paris and Tokyo"                   -> ``weather`` once per city
- "note: ..." / "remember that ..."             -> ``save_note``
- "notes" / "what did I note"                   -> ``list_notes``
- "delete my notes" / "forget my notes"         -> ``delete_notes`` (it needs approval)
- "ask me ..."                                   -> ``ask_person`` (which city?), then
  ``weather`` for the city the person answers
- "research ..."                                 -> the ``researcher`` subagent, given
  the whole message as its task
- "slowly" anywhere                             -> a long story (when no tool fits),
  streamed one word every ``slow_delay`` seconds: time to press Cancel
"""

from __future__ import annotations

import json
import re
import time
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
_DELETE_NOTES = re.compile(r"\b(?:delete|forget|clear|erase)\b[^.?!]*?\bnotes?\b", re.I)
_ASK_ME = re.compile(r"\bask me\b", re.I)
_RESEARCH = re.compile(r"\bresearch(?:er)?\b", re.I)
_SLOW = re.compile(r"\bslow(?:ly)?\b", re.I)
_CITY = r"[A-Z][\w'-]*(?:\s+[A-Z][\w'-]*)*"
_WEATHER = re.compile(
    rf"(?i:\bweather\s+(?:in|for))\s+(?P<cities>{_CITY}(?:\s*(?:,|\band\b)\s*(?:in\s+)?{_CITY})*)"
)
_CITY_SEPARATOR = re.compile(r"\s*(?:,|\band\b)\s*(?:in\s+)?")
_EXPRESSION = re.compile(r"[-(]*\d[\d.\s()+\-*/]*[\d)]")
_OPERATOR = re.compile(r"[\d)]\s*(?:\*\*|[-+*/])\s*[-+(]*\d")

HELP = (
    "I'm the offline demo model. I can do arithmetic such as (12 + 30) * 2, tell you the "
    '(made-up) weather in a city, save a note ("remember that ..."), list your notes, and '
    'delete them ("delete my notes": I ask for your approval first).'
)
#: what "ask me" asks.
CITY_QUESTION = "Which city should I look up the weather for?"
#: the slow answer: long enough to cancel halfway.
STORY = (
    "Once upon a time, a small agent lived in a database. Every morning it read the whole "
    "transcript from the top, because the transcript was the only thing it could trust. "
    "It called its tools one at a time, wrote down every result before doing anything "
    "else, and when the power went out in the middle of a sentence it simply picked up "
    "where the last saved line ended. People could stop it at any moment with a button, "
    "and it would put down its pen mid-word, keep what it had written, and wait politely "
    "for the next question. It was not a clever agent, but it was a very reliable one, "
    "and everybody who worked with it slept well at night."
)


def _balanced(expression: str) -> str:
    """Drop parentheses the sentence around an expression opened or closed."""
    while expression.count("(") > expression.count(")") and expression.startswith("("):
        expression = expression[1:]
    while expression.count(")") > expression.count("(") and expression.endswith(")"):
        expression = expression[:-1]
    return expression.strip()


def plan_tool_calls(text: str, offered: set[str] | None = None) -> list[tuple[str, dict[str, Any]]]:
    """The ``(tool name, arguments)`` calls a user message asks for, in reading order.

    ``offered`` (default: any) decides whether research goes to the ``researcher``
    subagent, which takes the whole message as its task.
    """
    if _RESEARCH.search(text) and (offered is None or "researcher" in offered):
        return [("researcher", {"task": text.strip()})]
    found: list[tuple[int, str, dict[str, Any]]] = []
    note = _SAVE_NOTE.search(text)
    if note:  # everything after "remember" is the note, not more requests
        found.append((note.start(), "save_note", {"text": note["text"].strip().rstrip(".")}))
        text = text[: note.start()]
    deleting = _DELETE_NOTES.search(text)
    if deleting:  # "delete my notes" is no request to list them
        found.append((deleting.start(), "delete_notes", {}))
        text = text[: deleting.start()] + " " * len(deleting.group()) + text[deleting.end() :]
    asking = _ASK_ME.search(text)
    if asking:
        found.append((asking.start(), "ask_person", {"question": CITY_QUESTION}))
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
    if call.name == "ask_person":
        return f"You answered: {result.content.strip()}."
    if call.name == "researcher":
        return f"The researcher reports: {result.content}"
    if call.name == "delete_notes":
        return f"Done: {result.content}"
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

    def __init__(self, slow_delay: float = 0.1) -> None:
        #: seconds between the words of an answer to a message that says "slowly".
        self.slow_delay = slow_delay

    def request(
        self, request: ModelRequest, *, on_chunk: ChunkCallback | None = None
    ) -> ModelResponse:
        messages = request.messages
        last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)
        turn = messages[last_user + 1 :]
        results = [m for m in turn if m.role == "tool"]
        asked_text = messages[last_user].content if last_user >= 0 else ""
        calls: list[ToolCall] = []
        if last_user < 0:
            text = HELP
        elif results:  # the tools have answered: go on with the answer, or sum up
            asked = {call.id: call for m in turn for call in m.tool_calls}
            calls = self._follow_up(request, turn, asked, results)
            if calls:
                text = f"Let me look up the weather in {calls[0].arguments['city']}."
            else:
                text = " ".join(
                    _summary(asked[r.tool_call_id], r) for r in results if r.tool_call_id in asked
                )
        else:
            calls = self._calls(request, asked_text)
            if calls:
                text = f"Let me use {_join([c.name for c in calls])}."
            else:
                text = STORY if _SLOW.search(asked_text) else HELP
        if on_chunk is not None:
            delay = self.slow_delay if _SLOW.search(asked_text) else 0.0
            self._stream(text, calls, on_chunk, delay)
        return ModelResponse(
            content=text,
            tool_calls=calls,
            usage=self._usage(request, text, calls),
            finish_reason="tool_calls" if calls else "stop",
            model=request.model,
        )

    def _offered(self, request: ModelRequest) -> set[str]:
        if request.tool_choice == "none":
            return set()
        return {tool.name for tool in request.tools}

    def _calls(self, request: ModelRequest, text: str) -> list[ToolCall]:
        offered = self._offered(request)
        planned = [(name, args) for name, args in plan_tool_calls(text, offered) if name in offered]
        if request.parallel_tool_calls is False:
            planned = planned[:1]
        return self._numbered(request, planned)

    def _follow_up(
        self,
        request: ModelRequest,
        turn: list[Message],
        asked: dict[str, ToolCall],
        results: list[Message],
    ) -> list[ToolCall]:
        """After the person answered "which city?": the weather there (once per turn)."""
        if "weather" not in self._offered(request):
            return []
        if any(call.name == "weather" for call in asked.values()):
            return []
        answers = [
            r.content.strip().rstrip(".")
            for r in results
            if not r.is_error and r.tool_call_id in asked
            and asked[r.tool_call_id].name == "ask_person"
        ]  # fmt: skip
        if not answers or not answers[-1]:
            return []
        return self._numbered(request, [("weather", {"city": answers[-1]})])

    @staticmethod
    def _numbered(
        request: ModelRequest, planned: list[tuple[str, dict[str, Any]]]
    ) -> list[ToolCall]:
        # Ids unique in the chat and the same on every run: numbered after the earlier calls.
        earlier = sum(len(m.tool_calls) for m in request.messages)
        return [
            ToolCall(id=f"demo_{earlier + n}", name=name, arguments=arguments)
            for n, (name, arguments) in enumerate(planned, 1)
        ]

    @staticmethod
    def _stream(
        text: str, calls: list[ToolCall], on_chunk: ChunkCallback, delay: float = 0.0
    ) -> None:
        words = text.split(" ")
        for n, word in enumerate(words):
            if delay:
                time.sleep(delay)
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

"""Helpers of the bad-input tests (tests/test_bad_input.py, tests/test_bad_input_properties.py):
text and numbers from outside at their worst, tools that hand such text back and count their
runs, a model priced by the test, and the recorded answers of each provider family with
their text and token counts replaced (read in place from ../shared/fixtures)."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from hypothesis import strategies as st

from agentloop import ToolError, tool
from agentloop.messages import TokenUsage
from agentloop.testing import ScriptedProvider
from tests.providers import cassettes

# -- text and numbers from outside -----------------------------------------------------------
#: what breaks a write or a wire format: NUL, lone surrogates of both halves, a surrogate
#: pair as two code points, a terminal escape, line and paragraph separators, a BOM.
NASTY = [
    "\x00",
    "\ud800",
    "\udbff",
    "\udc00",
    "\udfff",
    "\ud83d\ude00",
    "\x1b[31m",
    "\r\n",
    "\u2028",
    "\ufeff",
    "\ufffd",
    "\x7f",
    '"',
    "\\",
    "</script>",
]
#: what a browser can send in a form: anything but a lone surrogate (it sends U+FFFD).
TYPED = [piece for piece in NASTY if not re.search("[\ud800-\udfff]", piece)]

#: any character but a surrogate (a form can't carry one).
_typed_character = st.characters(exclude_categories=("Cs",))
_any_character = st.one_of(
    _typed_character,
    st.characters(max_codepoint=0x1F),  # control characters, NUL included
    st.integers(0xD800, 0xDFFF).map(chr),  # lone surrogates
)
#: any text a model, a tool or a JSON client can produce.
wild_text = st.lists(st.one_of(_any_character, st.sampled_from(NASTY)), max_size=30).map("".join)
#: any text a person can type into a form.
typed_text = st.lists(
    st.one_of(_typed_character, st.characters(max_codepoint=0x1F), st.sampled_from(TYPED)),
    max_size=30,
).map("".join) | st.just("before\x00after")
#: a number where a provider reports a token count: any JSON value, at its worst.
reported_number = st.one_of(
    st.integers(-(2**40), 2**40),
    st.integers(2**31 - 3, 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(alphabet="0123456789-.eE xNaInfity", max_size=8),
    st.none(),
    st.booleans(),
)
#: a cost a provider's price gives: any number, at its worst.
reported_cost = st.one_of(
    st.decimals(allow_nan=True, allow_infinity=True),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**20), 10**20),
    st.none(),
)


# -- tools that give text back -----------------------------------------------------------------
#: the text of every run of ``echo`` and ``fail_with``, in order (tests run them in process).
RUNS: list[str] = []


@tool
def echo(text: str) -> str:
    """Returns the text it was given.

    Args:
        text: Any text.
    """
    RUNS.append(text)
    return text


#: what ``spoiled`` returns, by kind.
SPOILED = {"nul": "before\x00after", "lone-surrogate": "before\ud800after"}


@tool
def spoiled(kind: str) -> str:
    """Returns text holding a NUL byte ("nul") or a lone surrogate ("lone-surrogate").

    Args:
        kind: "nul" or "lone-surrogate".
    """
    RUNS.append(kind)
    return SPOILED[kind]


@tool
def fail_with(text: str) -> str:
    """Fails with the text it was given.

    Args:
        text: Any text.
    """
    RUNS.append(text)
    raise ToolError(text)


@tool(requires_approval=True)
def guarded(text: str) -> str:
    """Runs once a person approves it.

    Args:
        text: Any text.
    """
    RUNS.append("guarded")
    return text


# -- a model priced by the test ------------------------------------------------------------------
class CostedProvider(ScriptedProvider):
    """A ScriptedProvider whose every call costs ``price``, whatever that is."""

    name = "costed"

    def __init__(self, price: Any = None) -> None:
        super().__init__()
        self.price = price

    def cost(self, model: str, usage: TokenUsage) -> Decimal | None:
        return self.price  # type: ignore[no-any-return]


# -- the recorded answers of each provider family ------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Family:
    """A provider family's wire format: a provider class answering a recording, and the
    model a chat names it by."""

    name: str
    model: str
    provider: str  # the class's import path (Bedrock's needs AWS credentials set first)
    answer: str  # a recording of a plain answer
    streamed: str | None  # a recording of a streamed answer (None: binary frames)
    folder: str = "providers"

    def interaction(self, streamed: bool) -> cassettes.Interaction:
        folder = cassettes.FIXTURES.parent / self.folder
        name = self.streamed if streamed else self.answer
        assert name is not None  # noqa: S101 - the caller asks only for recordings there are
        return cassettes.cached(name, folder).interactions[0]


FAMILIES = [
    Family(
        "openai-chat",
        "openrouter:anthropic/claude-haiku-4.5",
        "agentloop.providers.openai.OpenRouterProvider",
        "chat_basic_chat_functionality_openrouter_claude-haiku-4-5_can_have_a_basic_conversation",
        "chat_streaming_responses_openrouter_claude-haiku-4-5_supports_streaming_responses",
    ),
    Family(
        "openai-responses",
        "openai-responses:gpt-5-nano",
        "agentloop.providers.openai_responses.OpenAIResponsesProvider",
        "chat_basic_chat_functionality_openai_gpt-5-nano_can_have_a_basic_conversation",
        "chat_streaming_responses_openai_gpt-5-nano_supports_streaming_responses",
    ),
    Family(
        "anthropic",
        "anthropic:claude-haiku-4-5",
        "agentloop.providers.anthropic.AnthropicProvider",
        "chat_basic_chat_functionality_anthropic_claude-haiku-4-5_can_have_a_basic_conversation",
        "chat_streaming_responses_anthropic_claude-haiku-4-5_supports_streaming_responses",
    ),
    Family(
        "gemini",
        "gemini:gemini-2.5-flash",
        "agentloop.providers.gemini.GeminiProvider",
        "chat_basic_chat_functionality_gemini_gemini-2_5-flash_can_have_a_basic_conversation",
        "chat_streaming_responses_gemini_gemini-2_5-flash_supports_streaming_responses",
    ),
    Family(
        "bedrock",
        "bedrock:amazon.nova-2-lite-v1:0",
        "agentloop.providers.bedrock.BedrockProvider",
        "chat_basic_chat_functionality_bedrock_amazon_nova-2-lite-v1_0_can_have_a_basic_conversation",
        None,  # Converse streams binary event-stream frames, each with its CRC
        folder="providers-cloud",
    ),
]

#: keys whose string values are a model's text in some family's answer.
TEXT_KEYS = frozenset({"text", "content", "delta", "thinking", "reasoning", "reasoning_content"})
#: keys whose numbers are token counts in some family's answer.
_TOKEN_KEY = re.compile(r"(?i)tokens?(_count)?$|tokencount$")


def replaced(value: Any, text: str, number: Callable[[], Any], key: str = "") -> Any:
    """A recorded JSON value with each model text in it ``text`` and each token count
    ``number()``."""
    if isinstance(value, dict):
        return {name: replaced(item, text, number, name) for name, item in value.items()}
    if isinstance(value, list):
        return [replaced(item, text, number, key) for item in value]
    if isinstance(value, str) and key in TEXT_KEYS:
        return text
    if isinstance(value, int | float) and not isinstance(value, bool) and _TOKEN_KEY.search(key):
        return number()
    return value


def rewritten(
    interaction: cassettes.Interaction, text: str, number: Callable[[], Any]
) -> cassettes.Interaction:
    """The recorded answer with its text and token counts replaced (:func:`replaced`); a
    stream event by event (its ``data:`` lines), JSON escaping what the wire would."""
    if interaction.is_stream:
        lines = []
        for line in interaction.response_text.splitlines(keepends=True):
            body = line.removeprefix("data:").strip()
            if line.startswith("data:") and body.startswith("{"):
                ending = line[len(line.rstrip("\r\n")) :]
                line = "data: " + json.dumps(replaced(json.loads(body), text, number)) + ending
            lines.append(line)
        body_text = "".join(lines)
    else:
        body_text = json.dumps(replaced(interaction.response_json(), text, number))
    return dataclasses.replace(interaction, response_text=body_text, response_bytes=b"")

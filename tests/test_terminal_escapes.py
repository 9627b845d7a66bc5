"""The terminal chat shows untrusted text escaped, so a model can't hide or fake a prompt.

The attack (issue 12): a model answers with ``\\x1b[8m`` (conceal) and a fake
``? Run transfer(amount=5)`` line while the call it really makes is
``transfer(5000, ...)``. Printed raw, a terminal hides the real prompt behind the fake
one; printed escaped, the person reads the escapes and the real call.
"""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management.base import OutputWrapper
from django.core.management.color import no_style
from pydantic import BaseModel, ConfigDict

from agentloop.models import Chat, ToolCall
from agentloop.terminal import PROMPT, RESET_STYLE, TerminalChat, visible
from agentloop.testing import reply, stream, tool_call
from agentloop.tools import Tool, tool
from tests.tools import ask_manager, transfer

pytestmark = pytest.mark.django_db

CONCEAL = "\x1b[8m"
FAKE_PROMPT = '\n  ? Run transfer(amount=5, to="bob")? [y/N/reason] '
CSI = "\x9b"  # the one-byte C1 form of ESC [ (JSON leaves it as it is)


class Keyboard:
    """Lines a person types, in order (then Ctrl-D); notes each prompt and what was on
    the screen when it was drawn."""

    def __init__(self, out: StringIO, *lines: str) -> None:
        self.out = out
        self.lines = list(lines)
        self.prompts: list[str] = []
        self.screens: list[str] = []

    def __call__(self, prompt: str) -> str:
        self.prompts.append(prompt)
        self.screens.append(self.out.getvalue())
        if not self.lines:
            raise EOFError
        return self.lines.pop(0)


class TerminalOut(StringIO):
    """Output that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def converse(chat, *lines: str, out: StringIO | None = None) -> tuple[str, Keyboard]:
    out = out if out is not None else StringIO()
    keyboard = Keyboard(out, *lines)
    TerminalChat(chat, out=OutputWrapper(out), style=no_style(), read_line=keyboard).run()
    return out.getvalue(), keyboard


@pytest.fixture
def chat(scripted):
    return Chat.objects.create(model="scripted:test")


def test_a_faked_approval_prompt_is_shown_escaped_and_the_real_call_is_asked(scripted, chat):
    chat.with_tools(transfer)
    scripted.add(
        reply(
            f"I'll pay bob 5.{CONCEAL}{FAKE_PROMPT}",
            tool_call("transfer", {"amount": 5000, "to": f"mallory{CONCEAL}{CSI}8m{FAKE_PROMPT}"}),
        ),
        "Not paid.",
    )

    output, keyboard = converse(chat, "Pay bob 5.", "n")

    shown = output + "".join(keyboard.prompts)
    assert "\x1b" not in shown and CSI not in shown  # nothing reaches the terminal raw
    assert "I'll pay bob 5.\\x1b[8m" in output  # the escape, visibly
    approval = keyboard.prompts[1]
    assert approval.startswith("  ? Run transfer(amount=5000, to=")
    assert "mallory\\u001b[8m\\x9b8m" in approval  # JSON's escape, then ours for C1
    assert ToolCall.objects.get().decision == "denied"


def test_streamed_answer_text_is_escaped_chunk_by_chunk(scripted, chat):
    scripted.add(stream("Hello", CONCEAL, "hidden", "\x1b", "[0m"))

    output, _ = converse(chat, "hi")

    assert "assistant> Hello\\x1b[8mhidden\\x1b[0m" in output
    assert "\x1b" not in output


@tool
def echo(text: str) -> str:
    """Returns the text it was given: a result carrying whatever the model sent."""
    return text


def test_tool_results_are_escaped(scripted, chat):
    chat.with_tools(echo)
    scripted.add(tool_call("echo", {"text": f"ok{CONCEAL}hidden"}), "Done.")

    output, _ = converse(chat, "echo")

    assert "<- echo: ok\\x1b[8mhidden" in output
    assert "\x1b" not in output


def test_a_tool_error_result_from_a_model_named_tool_is_escaped(scripted, chat):
    scripted.add(tool_call(f"no_such_tool{CONCEAL}", {}), "Sorry.")

    output, _ = converse(chat, "go")

    assert "<- no_such_tool\\x1b[8m error: Unknown tool 'no_such_tool\\x1b[8m'" in output
    assert "\x1b" not in output


def test_a_question_is_shown_escaped(scripted, chat):
    chat.with_tools(ask_manager)
    scripted.add(tool_call("ask_manager", {"question": f"Budget?{CONCEAL}\rApproved"}), "Ok.")

    output, keyboard = converse(chat, "ask", "small")

    assert "? ask_manager asks: Budget?\\x1b[8m\\x0dApproved" in output
    assert "\x1b" not in output and "\r" not in output


def test_on_a_terminal_the_style_is_reset_before_every_prompt(scripted, chat):
    chat.with_tools(transfer)
    scripted.add(tool_call("transfer", {"amount": 1, "to": "bob"}), "Paid.")

    _, keyboard = converse(chat, "pay", "y", out=TerminalOut())

    assert keyboard.prompts[:2] == [PROMPT, '  ? Run transfer(amount=1, to="bob")? [y/N/reason] ']
    assert all(screen.endswith(RESET_STYLE) for screen in keyboard.screens)


def test_without_a_terminal_no_reset_is_written(scripted, chat):
    scripted.add("Hi.")

    output, keyboard = converse(chat, "hello")

    assert RESET_STYLE not in output
    assert len(keyboard.prompts) == 2


def test_visible_keeps_newlines_and_tabs_and_escapes_the_rest():
    text = "a\tb\nc\x00d\x7fe\x9bf\u202eg\u2066h"

    assert visible(text) == "a\tb\nc\\x00d\\x7fe\\x9bf\\u202eg\\u2066h"
    assert visible("plain ünïcode ✓") == "plain ünïcode ✓"


class Payout(Tool):
    """Pays out; takes any extra keys (its Params allow them), and needs approval."""

    requires_approval = True

    class Params(BaseModel):
        model_config = ConfigDict(extra="allow")
        amount: int

    def execute(self, amount: int, **extra: object) -> str:
        return f"paid {amount}"


def test_an_argument_name_is_shown_escaped_so_it_cannot_fake_a_prompt_line(scripted, chat):
    chat.with_tools(Payout)
    fake_key = f"note{FAKE_PROMPT}y\n  ? Run payout(amount=5"
    scripted.add(tool_call("payout", {"amount": 5000, fake_key: 1}), "Not paid.")

    output, keyboard = converse(chat, "Pay out.", "n")

    approval = keyboard.prompts[1]
    assert approval.startswith("  ? Run payout(amount=5000, ")
    assert "\n" not in approval  # one line: no fake prompt line under the real one
    assert '"note\\n  ? Run transfer(amount=5, to=\\"bob\\")? [y/N/reason] y\\n' in approval
    assert ToolCall.objects.get().decision == "denied"


def test_a_plain_argument_name_is_shown_as_it_is(scripted, chat):
    chat.with_tools(transfer)
    scripted.add(tool_call("transfer", {"amount": 5, "to": "bob"}), "Not paid.")

    _, keyboard = converse(chat, "Pay bob 5.", "n")

    assert keyboard.prompts[1].startswith('  ? Run transfer(amount=5, to="bob")? ')


def test_a_call_with_an_argument_its_tool_does_not_take_is_refused_before_anyone_is_asked(
    scripted, chat
):
    chat.with_tools(transfer)
    scripted.add(
        tool_call("transfer", {"amount": 5, "to": "bob", f"memo{FAKE_PROMPT}": "x"}), "Sorry."
    )

    output, keyboard = converse(chat, "Pay bob 5.")

    assert keyboard.prompts == [PROMPT, PROMPT]  # never "? Run transfer(...)"
    call = ToolCall.objects.get()
    assert (call.state, call.decision) == ("failed", "")
    result = call.result.content
    assert result.startswith("Invalid arguments for tool 'transfer': ") and "\n" not in result
    assert "<- transfer error: Invalid arguments for tool 'transfer'" in output

"""``manage.py agentloop chat``: the terminal chat, driven through a pseudo-terminal.

The pty tests start the real command in a subprocess whose controlling terminal is a
pty we hold, so typed lines, Ctrl-C (``\\x03``, turned into SIGINT by the terminal) and
Ctrl-D (``\\x04``, end of input) reach it the way a person's keys do. The subprocess
opens the test database and answers with :mod:`tests.terminal_provider`. The in-process
tests drive :class:`agentloop.terminal.TerminalChat` with scripted lines of input.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError, OutputWrapper
from django.core.management.color import no_style

from agentloop import providers
from agentloop.models import Chat, ChatState, Message, ToolCall, Usage
from agentloop.terminal import PROMPT, TerminalChat
from agentloop.testing import FunctionProvider, tool_call
from tests.agents import Calculator, Interviewer, Lead, Payer, register_agents_provider
from tests.processes import REPO_ROOT, process_env
from tests.terminal_provider import GATE_ENV, TerminalProvider
from tests.tools import add, ask_manager

MODEL = "terminal:test"
#: the subprocess's providers: ours, and the rules provider tests/settings.py names.
SUBPROCESS_SETTINGS = {
    "PROVIDERS": {
        "rules": {"class": "tests.worker_provider.RuleProvider"},
        "terminal": {"class": "tests.terminal_provider.TerminalProvider"},
    },
    "DEFAULT_MODEL": MODEL,
}
#: how long to wait for the terminal to print something before failing the test.
DEADLINE = 30
_ANSI = re.compile(r"\x1b(?:\[[0-9;?]*[ -/]*[@-~]|[@-Z\\-_])")
#: makes the pty the controlling terminal of the command (so \x03 sends it SIGINT), then
#: becomes it. Runs in the child after start_new_session's setsid(). SIGINT goes back to its
#: default first, as in a person's new terminal: a test run started where SIGINT is ignored (a
#: background job of a script, nohup) passes SIG_IGN on through exec, and Python then installs
#: no KeyboardInterrupt handler, so Ctrl-C at the prompt did nothing and the test timed out.
_LAUNCH = (
    "import fcntl, os, signal, sys, termios; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)

pytestmark = pytest.mark.django_db(transaction=True)


class Terminal:
    """A ``manage.py agentloop chat`` process on a pseudo-terminal we type into."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        master, slave = os.openpty()
        environment = process_env(
            AGENTLOOP_TEST_SETTINGS=json.dumps(SUBPROCESS_SETTINGS), TERM="dumb", **(env or {})
        )
        self.process = subprocess.Popen(  # noqa: S603 - our own interpreter and manage.py
            [sys.executable, "-c", _LAUNCH, str(REPO_ROOT / "manage.py"), "agentloop", "chat"]
            + list(args),
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=environment,
            cwd=REPO_ROOT,
            start_new_session=True,
        )
        os.close(slave)
        self.master = master
        #: everything printed so far (colours removed, newlines as \n), and how far we've read.
        self.output = ""
        self.seen = 0
        self.closed = False

    def _read(self, until: float) -> bool:
        """Read what is there (waiting until ``until``); False at the end of the output."""
        ready, _, _ = select.select([self.master], [], [], max(0.0, until - time.monotonic()))
        if not ready:
            return True
        try:
            data = os.read(self.master, 65536)
        except OSError:  # EIO: the command exited and closed the terminal
            data = b""
        if not data:
            self.closed = True
            return False
        self.output += _ANSI.sub("", data.decode(errors="replace")).replace("\r\n", "\n")
        return True

    def expect(self, text: str) -> str:
        """Wait until ``text`` is printed after what was already expected; returns the
        output up to and including it."""
        until = time.monotonic() + DEADLINE
        while text not in self.output[self.seen :]:
            if time.monotonic() > until or self.closed or not self._read(until):
                raise AssertionError(f"{text!r} not printed; the terminal shows:\n{self.output}")
        end = self.output.index(text, self.seen) + len(text)
        printed, self.seen = self.output[self.seen : end], end
        return printed

    def type(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def line(self, text: str) -> None:
        self.type(text + "\n")

    def exit_code(self) -> int:
        """Wait for the command to end (reading its last output); its exit status."""
        until = time.monotonic() + DEADLINE
        while not self.closed and time.monotonic() < until:
            self._read(until)
        return self.process.wait(timeout=DEADLINE)

    def interrupt_at_the_prompt(self) -> None:
        """Press Ctrl-C at the prompt until the command ends.

        CPython's input() with readline prints the prompt, then blocks in select(); a
        SIGINT landing between the two is only noticed at the next one (readline.c checks
        signals when select is interrupted). A person never hits that window; a test typing
        the instant the prompt shows can, so it presses again (as a person would) while
        nothing at all happens.
        """
        until = time.monotonic() + DEADLINE
        while time.monotonic() < until:
            self.type("\x03")
            printed = len(self.output)
            again = min(until, time.monotonic() + 0.5)
            while time.monotonic() < again:
                if not self._read(again) or len(self.output) > printed:
                    return  # heard: it is leaving

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        os.close(self.master)


@pytest.fixture
def terminal():
    """Start terminals with ``terminal(*args)``; all are closed after the test."""
    started: list[Terminal] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Terminal:
        started.append(Terminal(*args, env=env))
        return started[-1]

    yield start
    for each in started:
        each.close()


@pytest.fixture
def terminal_provider() -> Iterator[TerminalProvider]:
    """The subprocess's provider, registered here too (for chats made by the test)."""
    provider = TerminalProvider()
    providers.register("terminal", provider)
    yield provider
    providers.unregister("terminal")


# -- through a pseudo-terminal -------------------------------------------------------------
@pytest.mark.subprocess
def test_the_answer_is_printed_while_it_streams(terminal, tmp_path):
    gate = tmp_path / "gate"
    chat = terminal("--model", MODEL, env={GATE_ENV: str(gate)})
    chat.expect(PROMPT)

    chat.line("gate")
    printed = chat.expect("assistant> first ")
    # The provider holds the rest of its answer until the gate opens: the first chunk is
    # on the screen while the answer provably isn't finished.
    assert "second" not in chat.output
    gate.touch()
    chat.expect("second third.\n")

    assert printed == "gate\nassistant> first "  # the line we typed (echoed), then the answer
    answer = Message.objects.get(role="assistant")
    assert (answer.content, answer.status) == ("first second third.", "complete")


@pytest.mark.subprocess
def test_ctrl_c_cancels_the_streaming_answer_and_the_chat_goes_on(terminal):
    chat = terminal("--model", MODEL)
    chat.expect(PROMPT)
    chat.line("stream:400:0.05")  # 400 words, 20 seconds: only a cancel ends it early
    chat.expect("w2 ")

    chat.type("\x03")
    chat.expect("[cancelled]\n")
    chat.expect(PROMPT)
    chat.line("hello there")
    chat.expect("assistant> echo: hello there\n")

    assert chat.process.poll() is None
    partial = Message.objects.get(role="assistant", status="cancelled")
    assert partial.content.startswith("w0 w1 w2 ")
    assert len(partial.content.split()) < 400
    assert list(Usage.objects.order_by("pk").values_list("status", flat=True)) == [
        "cancelled",
        "succeeded",
    ]
    assert Chat.objects.get().cancel_requested_at is None


@pytest.mark.subprocess
def test_an_approval_answered_y_runs_the_tool(terminal):
    chat = terminal("--agent", "tests.agents.Payer", "--model", MODEL)
    chat.expect(PROMPT)

    chat.line("pay 5 bob")
    chat.expect('? Run transfer(amount=5, to="bob")? [y/N/reason] ')
    chat.line("y")
    chat.expect("<- transfer: sent 5 to bob\n")
    chat.expect("assistant> paid: sent 5 to bob\n")

    call = ToolCall.objects.get()
    assert (call.name, call.decision, call.state) == ("transfer", "approved", "succeeded")
    assert Chat.objects.get().agent_path == "tests.agents.Payer"


@pytest.mark.subprocess
def test_ctrl_d_at_the_prompt_exits_with_code_0(terminal):
    chat = terminal("--model", MODEL)
    chat.expect(PROMPT)

    chat.type("\x04")

    assert chat.exit_code() == 0


@pytest.mark.subprocess
def test_ctrl_c_at_the_prompt_exits_with_code_0(terminal):
    chat = terminal("--model", MODEL)
    chat.expect(PROMPT)

    chat.interrupt_at_the_prompt()

    assert chat.exit_code() == 0
    assert "[cancelled]" not in chat.output
    assert "[interrupted]" not in chat.output


@pytest.mark.subprocess
def test_ctrl_c_at_the_prompt_works_when_the_test_run_ignores_sigint(terminal):
    # A run started as a script's background job (or under nohup) ignores SIGINT, and the
    # terminal's process would inherit that through exec: it starts as a person's does.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        chat = terminal("--model", MODEL)
    finally:
        signal.signal(signal.SIGINT, previous)
    chat.expect(PROMPT)

    chat.interrupt_at_the_prompt()

    assert chat.exit_code() == 0


@pytest.mark.subprocess
def test_a_continued_chat_asks_first_for_the_decision_it_waits_for(
    terminal, terminal_provider, user
):
    waiting = Payer.create(owner=user)
    waiting.with_model(MODEL).ask("pay 7 carol")
    assert waiting.is_waiting()

    chat = terminal("--chat", str(waiting.pk), "--owner", "ada")
    chat.expect("continuing after 2 messages")
    chat.expect('? Run transfer(amount=7, to="carol")? [y/N/reason] ')
    chat.line("not today")
    chat.expect("assistant> paid: The user denied this tool call; it was not run. ")

    call = ToolCall.objects.get()
    assert (call.decision, call.decision_reason, call.decided_by) == ("denied", "not today", user)


# -- the command's options -----------------------------------------------------------------
def test_chat_refuses_an_unknown_chat():
    with pytest.raises(CommandError, match="No chat '404'"):
        call_command("agentloop", "chat", "--chat", "404")


def test_chat_refuses_agent_and_chat_together():
    with pytest.raises(CommandError, match="--chat continues a chat"):
        call_command("agentloop", "chat", "--chat", "1", "--agent", "tests.agents.Payer")


def test_chat_refuses_a_path_that_is_not_an_agent():
    with pytest.raises(CommandError, match="is not an agentloop.Agent class"):
        call_command("agentloop", "chat", "--agent", "tests.tools.add")


def test_chat_refuses_an_unknown_provider_before_making_a_chat():
    with pytest.raises(CommandError, match="No provider is registered as 'nowhere'"):
        call_command("agentloop", "chat", "--model", "nowhere:model")

    assert not Chat.objects.exists()


def test_chat_refuses_an_agent_missing_an_input():
    with pytest.raises(CommandError, match="needs the input"):
        call_command("agentloop", "chat", "--agent", "tests.agents.Research", "--model", MODEL)

    assert not Chat.objects.exists()


def test_chat_refuses_a_chat_a_worker_is_running(terminal_provider):
    running = Chat.objects.create(model=MODEL, state=ChatState.RUNNING)

    with pytest.raises(CommandError, match="running in the background"):
        call_command("agentloop", "chat", "--chat", str(running.pk))


# -- the conversation (in this process, scripted input) -----------------------------------
class Keyboard:
    """Lines a person types, in order; then Ctrl-D."""

    def __init__(self, *lines: str) -> None:
        self.lines = list(lines)
        self.prompts: list[str] = []

    def __call__(self, prompt: str) -> str:
        self.prompts.append(prompt)
        if not self.lines:
            raise EOFError
        return self.lines.pop(0)


def converse(chat, *lines: str, **options) -> tuple[str, Keyboard]:
    out = StringIO()
    keyboard = Keyboard(*lines)
    TerminalChat(
        chat, out=OutputWrapper(out), style=no_style(), read_line=keyboard, **options
    ).run()
    return out.getvalue(), keyboard


def test_a_denial_with_a_reason_reaches_the_model(terminal_provider):
    chat = Payer.create().with_model(MODEL)

    output, keyboard = converse(chat, "pay 9 dave", "wrong account")

    assert keyboard.prompts[1] == '  ? Run transfer(amount=9, to="dave")? [y/N/reason] '
    assert "<- transfer error: The user denied this tool call; it was not run." in output
    assert chat.messages.last().content == (
        "paid: The user denied this tool call; it was not run. Reason: wrong account"
    )
    assert ToolCall.objects.get().decision == "denied"


def test_a_question_is_asked_inline_and_the_answer_is_the_result(terminal_provider):
    chat = Interviewer.create().with_model(MODEL).with_tools(ask_manager)

    output, keyboard = converse(chat, "ask Which budget?", "", "the small one")

    assert "? ask_manager asks: Which budget?" in output
    assert keyboard.prompts[1:3] == ["  answer> ", "  answer> "]  # an empty answer is asked again
    assert chat.messages.last().content == "the manager said: the small one"
    assert ToolCall.objects.get().decision == "answered"


def test_an_approval_a_subagent_waits_for_is_asked_and_both_chats_finish(user):
    brains = register_agents_provider()
    brains.script("You are LEAD.", tool_call("payer", {"task": "Pay bob 5."}), "Bob is paid.")
    brains.script("You are PAYER.", tool_call("transfer", {"amount": 5, "to": "bob"}), "Paid.")
    lead = Lead.create(owner=user)
    try:
        output, keyboard = converse(lead, "Pay bob.", "y", by=user)
    finally:
        providers.unregister("agents")

    assert keyboard.prompts[1] == '  ? Run transfer(amount=5, to="bob") (in Payer)? [y/N/reason] '
    assert '  -> payer(task="Pay bob 5.")' in output
    assert (
        '    -> transfer(amount=5, to="bob")\n    <- transfer: sent 5 to bob\n  Payer> Paid.'
        in output
    )
    assert output.rstrip().endswith("assistant> Bob is paid.")
    payer = Chat.objects.get(parent=lead)
    transfer = payer.tool_calls.get()
    assert (transfer.state, transfer.decision, transfer.decided_by) == (
        "succeeded",
        "approved",
        user,
    )
    assert lead.tool_calls.get().state == "succeeded"
    brains.assert_complete()


def press_ctrl_c_and_wait_for_the_cancel(chats) -> None:
    """Ctrl-C in this process (the handler is installed while a run is in progress); returns
    once the cancel, written by the handler's thread, is in the database for ``chats``."""
    signal.raise_signal(signal.SIGINT)
    until = time.monotonic() + DEADLINE
    while not chats.filter(cancel_requested_at__isnull=False).exists():
        assert time.monotonic() < until, "the cancel was never written"
        time.sleep(0.01)


def test_ctrl_c_before_the_tools_run_leaves_a_chat_that_takes_the_next_message():
    def model(request):
        if [m.content for m in request.messages if m.role == "user"] == ["Add 2 and 3."]:
            # Pressed while the model thinks; it answers with a tool call all the same.
            press_ctrl_c_and_wait_for_the_cancel(Chat.objects.all())
            return tool_call("add", {"a": 2, "b": 3})
        return "Moving on."

    providers.register("function", FunctionProvider(model))
    chat = Chat.objects.create(model="function:test").with_tools(add)
    try:
        output, _ = converse(chat, "Add 2 and 3.", "Forget it.")
    finally:
        providers.unregister("function")

    assert "[cancelled]" in output
    assert "-> add" not in output
    assert output.rstrip().endswith("assistant> Moving on.")
    assert chat.tool_calls.get().state == "cancelled"  # answered as cancelled, never run
    assert [m.role for m in chat.messages.all()] == [
        "user", "assistant", "tool", "user", "assistant"
    ]  # fmt: skip


def test_ctrl_c_while_a_subagent_runs_stops_the_subagent_and_its_parent(user):
    def interrupt(request):
        # Pressed while the subagent thinks: its next checkpoint (before the tool it asks
        # for) sees the cancel.
        press_ctrl_c_and_wait_for_the_cancel(Chat.objects.filter(parent__isnull=False))
        return tool_call("add", {"a": 2, "b": 3})

    brains = register_agents_provider()
    brains.script("You are LEAD.", tool_call("calculator", {"task": "2 + 3?"}), "Fine.")
    brains.script("You are CALCULATOR.", interrupt)
    lead = Chat.objects.create(model="agents:test", owner=user)
    lead.with_instructions("You are LEAD.").with_tools(Calculator)
    try:
        output, _ = converse(lead, "Add 2 and 3.", "Never mind.")
    finally:
        providers.unregister("agents")

    assert "[cancelled]" in output
    assert output.rstrip().endswith("assistant> Fine.")
    calculator = Chat.objects.get(parent=lead)
    assert calculator.tool_calls.get().state == "cancelled"  # add never ran
    assert not Chat.objects.filter(cancel_requested_at__isnull=False).exists()
    brains.assert_complete()


def test_usage_prints_the_chat_totals(terminal_provider):
    chat = Chat.objects.create(model=MODEL)

    output, _ = converse(chat, "hello", "hello again", "/usage")

    assert f"Chat #{chat.pk}: 2 model calls, 20 input and 5 output tokens, cost unknown." in output


def test_new_starts_a_fresh_chat_and_quit_leaves(terminal_provider):
    first = Chat.objects.create(model=MODEL)

    def new_chat():
        return Chat.objects.create(model=MODEL)

    output, keyboard = converse(
        first, "hello", "/new", "hi", "/quit", "never sent", new_chat=new_chat
    )

    second = Chat.objects.exclude(pk=first.pk).get()
    assert f"agentloop chat #{second.pk}" in output
    assert [m.content for m in first.messages.all()] == ["hello", "echo: hello"]
    assert [m.content for m in second.messages.all()] == ["hi", "echo: hi"]
    assert keyboard.lines == ["never sent"]


def test_a_provider_error_is_printed_and_the_prompt_comes_back(terminal_provider):
    chat = Chat.objects.create(model=MODEL)

    output, keyboard = converse(chat, "broken", "hello")

    assert "[error: AuthenticationError: scripted HTTP 401]" in output
    assert "echo: hello" in output
    assert keyboard.prompts == [PROMPT, PROMPT, PROMPT]

"""Chats in a terminal: the interactive ``manage.py agentloop chat`` and the demo's printer.

:class:`TerminalChat` reads a line, runs the chat in this process (no worker, no
broker) and prints what happens as it happens: the answer as it streams, each tool
call when it starts and its result when it ends. Approvals and questions are asked
inline. Ctrl-C during a run cancels that run (``chat.cancel()``), not the program;
at the prompt, Ctrl-C, Ctrl-D or ``/quit`` leaves.

Text from models and tools is untrusted: control characters and escape sequences in
answers, tool names, arguments (their names too), results and questions are printed
escaped (``\x1b[8m`` shows as those six characters), so a model can't hide or fake an
approval prompt; and on a terminal the style is reset before every prompt. A call whose
arguments its tool refuses is answered with an error before anyone is asked about it.
"""

from __future__ import annotations

import json
import re
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from types import FrameType
from typing import Any

from django.db import connections

from .exceptions import AgentloopError, CancelledError, ChatStoppedError
from .messages import StreamUpdate, TextDelta

__all__ = ["PROMPT", "TerminalChat", "TranscriptPrinter", "visible"]

PROMPT = "you> "
#: SGR reset: whatever style was left on, the prompt is drawn plain.
RESET_STYLE = "\x1b[0m"
#: control characters (C0 but newline and tab, DEL, C1) and the bidirectional overrides
#: and isolates that reorder how a line reads.
_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
#: longest tool result printed in full; the admin has all of it.
RESULT_PREVIEW = 240
HELP = (
    "Commands: /usage (tokens and cost), /new (a new chat), /quit. Ctrl-C stops a running answer."
)

ReadLine = Callable[[str], str]


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: Any) -> str:
    """``text`` safe to print on a terminal: control characters shown escaped (``\\x1b``)."""
    return _UNSAFE.sub(_escape, str(text))


def _arguments(arguments: dict[str, Any], tool: Any = None) -> str:
    """``a=1, b="x"``, in the order the tool declares its parameters (a JSON column, e.g.
    PostgreSQL's jsonb, may give the keys back in another order); shown :func:`visible`."""
    keys = list(arguments)
    if tool is not None:
        declared = list(tool.definition().parameters.get("properties", {}))
        keys.sort(key=lambda key: declared.index(key) if key in declared else len(declared))
    return visible(
        ", ".join(f"{_key(key)}={json.dumps(arguments[key], ensure_ascii=False)}" for key in keys)
    )


def _key(key: Any) -> str:
    """An argument's name as it is when it reads as a plain name; else escaped like a value
    (a JSON string), so a newline, a quote or ``=`` in a key can't fake another argument or
    another prompt line."""
    text = str(key)
    return text if text.isidentifier() else json.dumps(text, ensure_ascii=False)


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


class TranscriptPrinter:
    """Writes a conversation as it happens, from a chat's callbacks and its stream."""

    def __init__(self, out: Any, style: Any, label: str = "Assistant:", indent: str = "") -> None:
        self.out = out
        self.style = style
        self.label = label
        self.indent = indent
        self.streaming = False  # an answer is being written on the current line
        self.streamed_text = False
        self.tool_names: dict[Any, str] = {}
        self.chat: Any = None

    def attach(self, chat: Any) -> Any:
        """Print ``chat``'s messages and tool calls (callbacks of this chat instance)."""
        self.chat = chat
        chat.before_message(self.before_message)
        chat.after_message(self.after_message)
        chat.before_tool_call(self.before_tool_call)
        chat.after_tool_result(self.after_tool_result)
        return chat

    def end_line(self) -> None:
        if self.streaming:
            self.out.write("")
            self.streaming = False

    def before_message(self) -> None:
        self.streamed_text = False

    def on_chunk(self, chunk: StreamUpdate) -> None:
        if not isinstance(chunk, TextDelta) or not chunk.text:
            return  # tool calls are printed when they start
        if not self.streaming:
            self.out.write(f"{self.indent}{self.style.SUCCESS(self.label)} ", ending="")
            self.streaming = self.streamed_text = True
        self.out.write(visible(chunk.text), ending="")
        self.out.flush()

    def after_message(self, message: Any) -> None:
        if message.role != "assistant":
            return
        if not self.streamed_text and message.content:  # a provider that doesn't stream
            label = self.style.SUCCESS(self.label)
            self.out.write(f"{self.indent}{label} {visible(message.content)}")
        self.end_line()
        recall = getattr(message, "recall", None)
        if recall:
            # Which memories the answer was given (ids and similarity: no memory's text).
            shown = ", ".join(
                f"#{visible(item.get('id'))} ({float(item.get('similarity') or 0):.2f})"
                for item in recall
                if isinstance(item, dict)
            )
            self.out.write(self.style.NOTICE(f"{self.indent}  [recalled: {shown}]"))

    def before_tool_call(self, tool_call: Any) -> None:
        self.end_line()
        self.tool_names[tool_call.pk] = visible(tool_call.name)
        call = f"{visible(tool_call.name)}({self.arguments(tool_call)})"
        self.out.write(self.style.NOTICE(f"{self.indent}  -> {call}"))
        self.out.flush()

    def arguments(self, tool_call: Any) -> str:
        tool = self.chat.conversation.tools().get(tool_call.name) if self.chat else None
        return _arguments(tool_call.arguments, tool)

    def after_tool_result(self, result: Any) -> None:
        self.end_line()
        name = self.tool_names.get(result.tool_call_id) or visible(result.tool_call.name)
        text = visible(" ".join(result.content.split()))
        if len(text) > RESULT_PREVIEW:
            text = text[: RESULT_PREVIEW - 3] + "..."
        if result.is_error:
            self.out.write(self.style.ERROR(f"{self.indent}  <- {name} error: {text}"))
        else:
            self.out.write(f"{self.indent}  <- {name}: {text}")
        self.out.flush()


class _InterruptCancels:
    """While installed, Ctrl-C (SIGINT) cancels the running chat instead of raising.

    The handler only starts a thread: the cancel is a database write, and the main
    thread may be inside a query on its connection when the signal arrives (psycopg
    holds a lock there), so it is written from another thread on its own connection.
    ``chat.cancel()`` also wakes the run's checkpoint at once. A second Ctrl-C while
    the run is still stopping raises KeyboardInterrupt to leave for good.
    """

    def __init__(self, chat: Any) -> None:
        self.chat = chat
        #: the chats this cancel flagged: the chat and its subagent chats.
        self.flagged: list[Any] = []
        self.thread: threading.Thread | None = None

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if self.thread is not None:
            raise KeyboardInterrupt
        self.thread = threading.Thread(
            target=self._cancel, name="agentloop-terminal-cancel", daemon=True
        )
        self.thread.start()

    def _cancel(self) -> None:
        try:
            self.flagged.append(self.chat)
            self.chat.cancel()
            # A cancel reaches queued or running subagents by itself; subagents running in
            # this process look idle, so they are told one by one.
            model = type(self.chat)
            for child in model.objects.filter(pk__in=family_ids(self.chat)[1:]).only("pk"):
                self.flagged.append(child)
                child.cancel()
        finally:
            connections.close_all()  # this thread's own connections

    @contextmanager
    def installed(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield  # signals reach the main thread only
            return
        previous = signal.signal(signal.SIGINT, self.handle)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)
            self._forget_late_cancel()

    def _forget_late_cancel(self) -> None:
        """A cancel flag left once the run is over has nothing to stop; left set, it would
        stop the next run at its first checkpoint."""
        if self.thread is None:
            return
        self.thread.join()
        model = type(self.chat)
        model.objects.filter(
            pk__in=[chat.pk for chat in self.flagged], cancel_requested_at__isnull=False
        ).update(cancel_requested_at=None)


class TerminalChat:
    """An interactive chat: read a line, run the chat in this process, print it live."""

    def __init__(
        self,
        chat: Any,
        *,
        out: Any,
        style: Any,
        new_chat: Callable[[], Any] | None = None,
        read_line: ReadLine | None = None,
        by: Any = None,
    ) -> None:
        self.out = out
        self.style = style
        self.new_chat = new_chat
        self.read_line = read_line or self._input
        #: who approves, denies and answers (recorded on the tool call).
        self.by = by
        self.printer = TranscriptPrinter(out, style, label="assistant>")
        self.chat = self.printer.attach(chat)
        self._children: dict[Any, tuple[Any, TranscriptPrinter]] = {}

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> None:
        """Chat until /quit, Ctrl-D, or Ctrl-C at the prompt."""
        self._banner()
        try:
            self._settle()  # a continued chat may wait for a decision already
            while True:
                try:
                    line = self._ask(PROMPT)
                except (EOFError, KeyboardInterrupt):
                    self.out.write("")  # leave the terminal on a fresh line
                    return
                text = line.strip()
                if text.startswith("/"):
                    if not self._command(text):
                        return
                elif text:
                    self.send(text)
        except KeyboardInterrupt:  # a second Ctrl-C while a run was stopping
            self._notice("[interrupted]")

    def send(self, text: str) -> None:
        """Ask the chat ``text`` and run it until it answers, asking for decisions inline."""
        if not self._settle():
            self.out.write(self.style.WARNING("[not sent: the chat still waits for you]"))
            return
        if self._run(self.chat, lambda: self.chat.ask_later(text).complete(self.printer.on_chunk)):
            self._settle()

    def _command(self, text: str) -> bool:
        """Run a /command; False to leave."""
        name = text.split()[0].lower()
        if name in ("/quit", "/exit", "/q"):
            return False
        if name == "/usage":
            self._usage()
        elif name == "/new" and self.new_chat is not None:
            self.chat = self.printer.attach(self.new_chat())
            self._children.clear()
            self._banner()
        elif name == "/help":
            self.out.write(HELP)
        else:
            self.out.write(self.style.WARNING(f"Unknown command {name}. {HELP}"))
        return True

    # -- running ------------------------------------------------------------------------------
    def _run(self, chat: Any, work: Callable[[], Any]) -> bool:
        """Do ``work`` (which runs ``chat``) with Ctrl-C cancelling it; False if it stopped."""
        interrupts = _InterruptCancels(chat)
        try:
            with interrupts.installed():
                work()
        except CancelledError:
            if interrupts.thread is not None and not self.printer.streaming:
                self.out.write("")  # off the line where the terminal echoed ^C
            self._notice("[cancelled]")
            return False
        except ChatStoppedError as exc:  # a limit, a guardrail's block
            self._notice(f"[stopped: {exc}]")
            return False
        except AgentloopError as exc:
            self._notice(f"[error: {type(exc).__name__}: {exc}]", error=True)
            return False
        finally:
            self.printer.end_line()
        return True

    def _notice(self, text: str, *, error: bool = False) -> None:
        self.printer.end_line()
        for printer in (printer for _, printer in self._children.values()):
            printer.end_line()
        text = visible(text)  # an error's message may quote the provider or a tool
        self.out.write(self.style.ERROR(text) if error else self.style.WARNING(text))

    # -- people in the loop ------------------------------------------------------------------
    def _settle(self) -> bool:
        """Ask for every decision holding the chat and continue it after each round.

        False if the person stopped (Ctrl-C or Ctrl-D at a question) or the run stopped.
        """
        while True:
            held = self._held(self.chat)
            if not held:
                return True
            for chat, call in held:
                try:
                    self._decide(chat, call)
                except (EOFError, KeyboardInterrupt):
                    self._notice(
                        f"[cancelled] Chat #{self.chat.pk} still waits for your decision: "
                        "it is asked again before your next message."
                    )
                    return False
            # Subagents first, deepest first: a finished child hands its answer to its parent.
            children = dict.fromkeys(chat for chat, _ in reversed(held) if chat is not self.chat)
            for chat in [*children, self.chat]:
                if not self._continue(chat):
                    return False

    def _continue(self, chat: Any) -> bool:
        """Run ``chat`` on until it answers or waits again; False if the run stopped."""
        printer = self.printer if chat is self.chat else self._children[chat.pk][1]
        return self._run(chat, lambda: chat.complete(stream=printer.on_chunk))

    def _held(self, chat: Any) -> list[tuple[Any, Any]]:
        """(chat, tool call) for each decision holding ``chat``, its subagents' included."""
        # The chat's own calls (Chat.pending_* add its subagents'; they are walked below).
        own = chat.conversation
        calls = sorted([*own.pending_approvals(), *own.pending_questions()], key=_order)
        found = [(chat, call) for call in calls]
        waiting = chat.tool_calls.filter(state="waiting", wait_reason="subagent")
        for call in waiting.order_by("pk"):
            child = type(chat).objects.filter(parent_tool_call_id=call.pk).first()
            if child is not None:
                found.extend(self._held(self._child(child)))
        return found

    def _child(self, child: Any) -> Any:
        """One instance per subagent chat, printing what it does under its agent's name."""
        if child.pk not in self._children:
            label = f"{visible(child.title or 'subagent')}>"
            printer = TranscriptPrinter(self.out, self.style, label=label, indent="  ")
            self._children[child.pk] = (printer.attach(child), printer)
        return self._children[child.pk][0]

    def _decide(self, chat: Any, call: Any) -> None:
        """Ask the person about one waiting call and record the decision."""
        self.printer.end_line()
        where = "" if chat is self.chat else f" (in {visible(chat.title or 'a subagent')})"
        name = visible(call.name)
        if call.wait_reason == "approval":
            printer = self.printer if chat is self.chat else self._children[chat.pk][1]
            prompt = f"  ? Run {name}({printer.arguments(call)}){where}? [y/N/reason] "
            reply = self._ask(prompt).strip()
            if reply.lower() in ("y", "yes"):
                chat.approve(call, by=self.by)
                self.out.write(self.style.SUCCESS(f"    approved {name}"))
            else:
                reason = "" if reply.lower() in ("", "n", "no") else reply
                chat.deny(call, reason=reason, by=self.by)
            return
        self.out.write(self.style.WARNING(f"  ? {name} asks{where}: {visible(call.question)}"))
        reply = ""
        while not reply.strip():
            reply = self._ask("  answer> ")
        chat.answer(call, reply.strip(), by=self.by)

    def _ask(self, prompt: str) -> str:
        """Read a line after ``prompt``; on a terminal, any style left on is reset first."""
        isatty = getattr(self.out, "isatty", None)
        if isatty is not None and isatty():
            # Written before the prompt, not in it: readline counts a prompt's characters.
            self.out.write(RESET_STYLE, ending="")
        return self.read_line(prompt)

    # -- output -------------------------------------------------------------------------------
    def _banner(self) -> None:
        chat = self.chat
        tools = ", ".join(sorted(chat.conversation.tools())) or "none"
        count = chat.messages.exclude(role="system").count()
        state = f", continuing after {_count(count, 'message')}" if count else ""
        self.out.write(
            self.style.MIGRATE_HEADING(f"agentloop chat #{chat.pk}")
            + visible(f" (model {chat.model}; tools: {tools}{state})")
        )
        self.out.write(HELP)

    def _usage(self) -> None:
        usage_model = self.chat.usage_records.model
        ids = family_ids(self.chat)
        totals = usage_model.objects.filter(chat_id__in=ids).totals()
        cost = f"cost {totals['cost']}" if totals["cost"] else "cost unknown"
        also = [
            f"{totals[status]} {status}" for status in ("cancelled", "failed") if totals[status]
        ]
        detail = f" ({', '.join(also)})" if also else ""
        subagents = f" (with {_count(len(ids) - 1, 'subagent chat')})" if len(ids) > 1 else ""
        self.out.write(
            f"Chat #{self.chat.pk}{subagents}: {_count(totals['attempts'], 'model call')}"
            f"{detail}, {totals['input_tokens']} input and {totals['output_tokens']} output "
            f"tokens, {cost}."
        )

    def _input(self, prompt: str) -> str:
        self.out.flush()
        with suppress(ImportError):
            import readline  # noqa: F401 - line editing and history for input()
        return input(prompt)


def _order(call: Any) -> Any:
    return call.pk


def family_ids(chat: Any) -> list[Any]:
    """The primary keys of ``chat`` and its subagent chats, at any depth."""
    ids = [chat.pk]
    if not any(field.name == "parent" for field in chat._meta.get_fields()):
        return ids
    level = [chat.pk]
    while level:
        level = list(type(chat).objects.filter(parent_id__in=level).values_list("pk", flat=True))
        ids.extend(level)
    return ids

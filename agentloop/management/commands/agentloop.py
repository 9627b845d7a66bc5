"""``manage.py agentloop <subcommand>``: agentloop's commands in one place.

    manage.py agentloop demo [QUESTION ...] [--model M] [--tool PATH ...] [--instructions TEXT]

``demo`` runs a persisted chat through a few questions and prints the transcript as it
happens. What it asks and which tools it offers come from ``AGENTLOOP["DEMO"]`` (a dict or
the import path of one: ``instructions``, ``tools``, ``questions``, ``title``), or from the
options, which win; the model is ``--model``, else ``AGENTLOOP["DEFAULT_MODEL"]``. agentloop
ships no demo tools of its own: a project names its own, so the command works with any model.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections
from django.urls import NoReverseMatch, reverse

from ... import providers
from ...conf import agentloop_settings
from ...exceptions import AgentloopError
from ...messages import Chunk, TextDelta
from ...tools import load_by_path

DEFAULT_INSTRUCTIONS = "You are a helpful assistant. Use the tools you are given when they help."
#: longest tool result printed in full; the transcript in the admin has all of it.
RESULT_PREVIEW = 240


class Command(BaseCommand):
    help = "agentloop commands. Run 'manage.py agentloop demo' for the offline demo."

    def add_arguments(self, parser: CommandParser) -> None:
        subcommands = parser.add_subparsers(
            dest="subcommand", metavar="subcommand", title="subcommands", required=True
        )
        demo = subcommands.add_parser(
            "demo",
            help="Run a persisted chat through a multi-tool conversation and print it.",
            description=(
                "Creates a chat, asks it the demo questions and prints the transcript as it "
                "happens: streamed answers, tool calls and their results, and token usage."
            ),
        )
        demo.add_argument(
            "questions",
            nargs="*",
            metavar="QUESTION",
            help="What to ask, in order (default: AGENTLOOP['DEMO']['questions']).",
        )
        demo.add_argument(
            "--model", help="'provider:model' to run (default: AGENTLOOP['DEFAULT_MODEL'])."
        )
        demo.add_argument(
            "--tool",
            dest="tools",
            action="append",
            metavar="IMPORT.PATH",
            help="A tool to offer, by import path; repeat for more "
            "(default: AGENTLOOP['DEMO']['tools']).",
        )
        demo.add_argument("--instructions", help="The system message (default: AGENTLOOP['DEMO']).")
        resume = subcommands.add_parser(
            "resume",
            help="Re-enqueue chats whose worker died or whose job was lost.",
            description=(
                "Finds running chats whose lease expired and queued chats nobody picked up "
                "(AGENTLOOP['STALE_QUEUED_SECONDS']) and enqueues a step for each. The "
                "periodic task agentloop.resume_stalled_chats does the same."
            ),
        )
        resume.add_argument(
            "--dry-run", action="store_true", help="List the stalled chats; enqueue nothing."
        )

    def handle(self, *args: Any, subcommand: str, **options: Any) -> None:
        handlers = {"demo": self.handle_demo, "resume": self.handle_resume}
        handlers[subcommand](**options)

    # -- resume ----------------------------------------------------------------------------
    def handle_resume(self, **options: Any) -> None:
        from ...background import backend_name, wait_for_embedded_jobs
        from ...recovery import resume_stalled, stalled_chats

        label = agentloop_settings.CHAT_MODEL
        if options["dry_run"]:
            ids = list(stalled_chats(label).values_list("pk", flat=True))
            self.stdout.write(f"{len(ids)} stalled chat(s): {', '.join(map(str, ids)) or '-'}")
            return
        ids = resume_stalled(label)
        self.stdout.write(
            self.style.SUCCESS(f"Re-enqueued {len(ids)} chat(s)")
            + (f": {', '.join(map(str, ids))}" if ids else "")
        )
        if ids and backend_name() == "embedded":
            # No broker: the steps run in this process, so wait for them before exiting.
            wait_for_embedded_jobs()

    # -- demo ------------------------------------------------------------------------------
    def handle_demo(self, **options: Any) -> None:
        config = _demo_config()
        questions = options["questions"] or list(config.get("questions") or [])
        if not questions:
            raise CommandError(
                "No questions to ask: pass them as arguments, or set "
                "AGENTLOOP['DEMO'] = {'questions': [...], 'tools': [...]} in your settings."
            )
        model = options["model"] or config.get("model") or agentloop_settings.DEFAULT_MODEL
        tool_paths = options["tools"] or list(config.get("tools") or [])
        instructions = options["instructions"] or config.get("instructions")

        from ...models import Chat

        try:
            providers.resolve(model)  # an unknown provider fails here, before a chat exists
            tools = [load_by_path(path) for path in tool_paths]
            chat = Chat(title=str(config.get("title") or "agentloop demo"))
            chat.with_model(model)
            chat.with_instructions(instructions or DEFAULT_INSTRUCTIONS)
            chat.with_tools(*tools)
        except AgentloopError as exc:
            raise CommandError(str(exc)) from exc

        transcript = _TranscriptPrinter(self)
        chat.before_message(transcript.before_message)
        chat.after_message(transcript.after_message)
        chat.before_tool_call(transcript.before_tool_call)
        chat.after_tool_result(transcript.after_tool_result)

        connection = connections[chat._state.db or "default"]
        self.stdout.write(
            self.style.MIGRATE_HEADING(
                f"agentloop demo: chat #{chat.pk}, model {model}, "
                f"{connection.vendor} database {connection.settings_dict['NAME']}"
            )
        )
        names = ", ".join(tool.name for tool in tools) or "none"
        self.stdout.write(f"Tools: {names}")
        for question in questions:
            self.stdout.write("")
            self.stdout.write(f"{self.style.MIGRATE_LABEL('You:')} {question}")
            try:
                chat.ask(question, stream=transcript.on_chunk)
            except AgentloopError as exc:
                transcript.end_line()
                raise CommandError(f"The chat stopped: {type(exc).__name__}: {exc}") from exc
        self._print_summary(chat)

    def _print_summary(self, chat: Any) -> None:
        totals = chat.usage_records.totals()
        cost = f", cost {totals['cost']}" if totals["cost"] else ""
        self.stdout.write("")
        self.stdout.write(
            self.style.MIGRATE_HEADING("Usage: ")
            + f"{_count(totals['attempts'], 'model call')}, {totals['input_tokens']} input and "
            f"{totals['output_tokens']} output tokens{cost}; stored "
            f"{_count(chat.messages.count(), 'message')} and "
            f"{_count(chat.tool_calls.count(), 'tool call')}."
        )
        meta = chat._meta
        try:
            url = reverse(f"admin:{meta.app_label}_{meta.model_name}_change", args=[chat.pk])
        except NoReverseMatch:
            url = f"/admin/{meta.app_label}/{meta.model_name}/{chat.pk}/change/"
        self.stdout.write(self.style.MIGRATE_HEADING("See it in the admin:"))
        self.stdout.write("  python manage.py createsuperuser")
        self.stdout.write("  python manage.py runserver")
        self.stdout.write(f"  then open http://127.0.0.1:8000{url}")


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def _demo_config() -> dict[str, Any]:
    """``AGENTLOOP["DEMO"]`` as a dict (it may name one by import path)."""
    value = agentloop_settings.DEMO
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = load_by_path(value)
        except AgentloopError as exc:
            raise CommandError(f"AGENTLOOP['DEMO']: {exc}") from exc
    if not isinstance(value, Mapping):
        raise CommandError(f"AGENTLOOP['DEMO'] must be a dict or its import path, not {value!r}")
    return dict(value)


class _TranscriptPrinter:
    """Writes the conversation as it happens, from the chat's callbacks and stream."""

    def __init__(self, command: BaseCommand) -> None:
        self.out = command.stdout
        self.style = command.style
        self.streaming = False  # an answer is being written on the current line
        self.streamed_text = False
        self.tool_names: dict[Any, str] = {}

    def end_line(self) -> None:
        if self.streaming:
            self.out.write("")
            self.streaming = False

    def before_message(self) -> None:
        self.streamed_text = False

    def on_chunk(self, chunk: Chunk) -> None:
        if not isinstance(chunk, TextDelta) or not chunk.text:
            return  # tool calls are printed when they start
        if not self.streaming:
            self.out.write(self.style.SUCCESS("Assistant:") + " ", ending="")
            self.streaming = self.streamed_text = True
        self.out.write(chunk.text, ending="")
        self.out.flush()

    def after_message(self, message: Any) -> None:
        if message.role != "assistant":
            return
        if not self.streamed_text and message.content:  # a provider that doesn't stream
            self.out.write(f"{self.style.SUCCESS('Assistant:')} {message.content}")
        self.end_line()

    def before_tool_call(self, tool_call: Any) -> None:
        self.end_line()
        self.tool_names[tool_call.pk] = tool_call.name
        arguments = ", ".join(
            f"{key}={json.dumps(value, ensure_ascii=False)}"
            for key, value in tool_call.arguments.items()
        )
        self.out.write(self.style.NOTICE(f"  -> {tool_call.name}({arguments})"))

    def after_tool_result(self, result: Any) -> None:
        name = self.tool_names.get(result.tool_call_id, "tool")
        text = " ".join(result.content.split())
        if len(text) > RESULT_PREVIEW:
            text = text[: RESULT_PREVIEW - 3] + "..."
        if result.is_error:
            self.out.write(self.style.ERROR(f"  <- {name} error: {text}"))
        else:
            self.out.write(f"  <- {name}: {text}")

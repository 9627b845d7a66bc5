"""``manage.py agentloop <subcommand>``: agentloop's commands in one place.

    manage.py agentloop chat [--agent PATH] [--model M] [--chat ID] [--owner USERNAME]
    manage.py agentloop demo [QUESTION ...] [--model M] [--tool PATH ...] [--instructions TEXT]
                             [--owner USERNAME] [--site URL]
    manage.py agentloop resume [--dry-run]
    manage.py agentloop unlock CHAT_ID [--yes]
    manage.py agentloop batches [--no-poll]
    manage.py agentloop export --owner USER [--output FILE] [--attachments include|reference]
    manage.py agentloop erase --owner USER [--delete-usage] [--wait SECONDS] [--yes]
    manage.py agentloop retention [--days N] [--dry-run]
    manage.py agentloop chats [--model GLOB] [--state S] [--owner U] [--older-than D] ...
                              [--dry-run] cancel | halt REASON | resume | complete-later
                              | with-model MODEL | list
    manage.py agentloop eval set | run | compare | show     (agentloop.management.eval_command)
    manage.py agentloop mcp-serve | mcp-token create | list | revoke  (management/mcp_command.py)
    manage.py agentloop memory list | search QUERY | reindex  (agentloop.management.memory_command)

``chat`` is an interactive chat in the terminal (agentloop.terminal): streamed answers,
tool calls as they run, approvals and questions asked inline, Ctrl-C cancels the run.
``demo`` runs a persisted chat through a few questions and prints the transcript as it
happens. What it asks and which tools it offers come from ``AGENTLOOP["DEMO"]`` (a dict or
the import path of one: ``instructions``, ``tools``, ``questions``, ``title``), or from the
options, which win; the model is ``--model``, else ``AGENTLOOP["DEFAULT_MODEL"]``. agentloop
ships no demo tools of its own: a project names its own, so the command works with any model.
``chat`` starts from the same configuration unless ``--agent`` names an agent (or
``AGENTLOOP["DEMO"]["agent"]`` does). ``chats`` controls many chats at once
(``agentloop.management.chats``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections
from django.urls import NoReverseMatch, reverse

from ... import providers
from ...agents import Agent
from ...batches import poll
from ...conf import agentloop_settings, get_chat_model
from ...evals.batch_rounds import poll as poll_eval_runs
from ...exceptions import AgentloopError
from ...import_paths import load_by_path
from ...models import Batch, Chat, ChatState
from ...runners import runner_name, wait_for_embedded_jobs
from ...runners.sweeper import free_chat, resume_stalled, stalled_chats
from ...terminal import TerminalChat, TranscriptPrinter, family_ids
from ..chats import add_chats_parser, handle_chats
from ..data import add_data_subcommands, data_handlers
from ..eval_command import add_eval_parser, handle_eval
from ..mcp_command import add_mcp_parsers, mcp_handlers
from ..memory_command import add_memory_parser, handle_memory

DEFAULT_INSTRUCTIONS = "You are a helpful assistant. Use the tools you are given when they help."


class Command(BaseCommand):
    help = (
        "agentloop commands: 'chat' (a chat in the terminal), 'demo' (the offline demo), "
        "'resume' (re-enqueue stalled chats), 'unlock' (free a chat by hand), 'batches' "
        "(poll open batches), 'export' and 'erase' (an owner's data), 'retention' (delete "
        "idle chats, expired memories), 'chats' (control many chats at once), 'eval' (evals "
        "of stored chats), 'memory' (list, search, reindex memories), 'mcp-serve' (the agents "
        "over MCP on stdio), 'mcp-token' (their users' tokens)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        subcommands = parser.add_subparsers(
            dest="subcommand", metavar="subcommand", title="subcommands", required=True
        )
        chat = subcommands.add_parser(
            "chat",
            help="Chat in the terminal: streamed answers, tool calls, approvals, Ctrl-C cancels.",
            description=(
                "An interactive chat on a persisted chat, run in this process (no worker or "
                "broker needed). Ctrl-C stops a running answer; at the prompt, Ctrl-C, Ctrl-D "
                "or /quit leaves. /usage prints token and cost totals, /new starts a new chat."
            ),
        )
        chat.add_argument(
            "--agent",
            metavar="IMPORT.PATH",
            help="An agentloop.Agent class; new chats are made with Agent.create() "
            "(default: AGENTLOOP['DEMO']['agent'], else the demo's tools and instructions).",
        )
        chat.add_argument(
            "--input",
            dest="inputs",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="An input of the agent; repeat for more.",
        )
        chat.add_argument(
            "--model",
            help="'provider:model' (default: the agent's, else AGENTLOOP['DEFAULT_MODEL']).",
        )
        chat.add_argument(
            "--chat", dest="chat_id", metavar="ID", help="Continue this chat (by primary key)."
        )
        chat.add_argument(
            "--owner",
            metavar="USERNAME",
            help="The user who owns new chats and whose decisions approvals record.",
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
        demo.add_argument(
            "--owner", metavar="USERNAME", help="The user who owns the demo chat (default: none)."
        )
        demo.add_argument(
            "--site",
            metavar="URL",
            help="Where the site serving the admin runs (e.g. http://127.0.0.1:8000): the "
            "summary links the chat there (default: it says how to start one).",
        )
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
        unlock = subcommands.add_parser(
            "unlock",
            help="Take the lease off a chat by hand (its holder is gone for sure).",
            description=(
                "For a chat held by a process that is certainly gone on another host, before "
                "its lease runs out (a dead holder on the same host is taken over at once "
                "anyway). A running chat is queued for its next step. If the holder still "
                "runs, it writes nothing more, but a tool it is running finishes and its "
                "result is dropped."
            ),
        )
        unlock.add_argument("unlock_id", metavar="CHAT_ID", help="The chat's primary key.")
        unlock.add_argument("--yes", action="store_true", help="Don't ask for confirmation.")
        batches = subcommands.add_parser(
            "batches",
            help="Poll open batches (append the answers of ended ones) and list them.",
            description=(
                "Refreshes every open batch from its provider; an ended batch's answers go "
                "into their chats. The periodic task agentloop.poll_batches does the same."
            ),
        )
        batches.add_argument(
            "--no-poll", action="store_true", help="List the open batches; ask no provider."
        )
        add_data_subcommands(subcommands)  # export, erase, retention (agentloop.management.data)
        add_chats_parser(subcommands)
        add_eval_parser(subcommands)  # eval set | run | compare | show (management/eval_command.py)
        add_mcp_parsers(subcommands)  # mcp-serve, mcp-token (management/mcp_command.py)
        add_memory_parser(subcommands)  # memory list | search | reindex (memory_command.py)

    def handle(self, *args: Any, subcommand: str, **options: Any) -> None:
        handlers = {
            "chat": self.handle_chat,
            "demo": self.handle_demo,
            "resume": self.handle_resume,
            "unlock": self.handle_unlock,
            "batches": self.handle_batches,
            **data_handlers(self),
            "chats": lambda **options: handle_chats(self, options),
            "eval": lambda **options: handle_eval(self, options),
            **mcp_handlers(self),
            "memory": lambda **options: handle_memory(self, options),
        }
        handlers[subcommand](**options)

    # -- chat ------------------------------------------------------------------------------
    def handle_chat(self, **options: Any) -> None:
        owner = _user(options["owner"])
        if options["chat_id"] and (options["agent"] or options["inputs"]):
            raise CommandError("--chat continues a chat; --agent and --input start a new one.")
        new_chat = _chat_factory(options["agent"], options["inputs"], options["model"], owner)
        if options["chat_id"]:
            chat = _take_over(options["chat_id"], options["model"])
        else:
            chat = new_chat()
        TerminalChat(chat, out=self.stdout, style=self.style, new_chat=new_chat, by=owner).run()

    # -- resume ----------------------------------------------------------------------------
    def handle_resume(self, **options: Any) -> None:

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
        if ids and runner_name() == "embedded":
            # No broker: the steps run in this process, so wait for them before exiting.
            wait_for_embedded_jobs()

    # -- unlock ----------------------------------------------------------------------------
    def handle_unlock(self, **options: Any) -> None:
        label = agentloop_settings.CHAT_MODEL
        chat_id = options["unlock_id"]
        found = get_chat_model()._default_manager.filter(pk=chat_id)
        held = found.values_list("lease_holder", "lease_expires_at").first()
        if held is None:
            raise CommandError(f"No chat {chat_id}.")
        self.stderr.write(
            self.style.WARNING(
                f"Chat {chat_id} is held by {held[0] or 'an unknown process'} until {held[1]}. "
                "Unlock it only if that process is gone: if it still runs, a tool it is "
                "running finishes and its result is dropped."
            )
        )
        if not options["yes"] and input("Unlock it? [y/N] ").strip().lower() not in ("y", "yes"):
            raise CommandError("Nothing changed.")
        holder = free_chat(chat_id, label)
        if holder is None:
            self.stdout.write(f"Chat {chat_id} holds no lease; nothing to do.")
            return
        self.stdout.write(self.style.SUCCESS(f"Unlocked chat {chat_id} (held by {holder or '?'})."))
        if runner_name() == "embedded":
            wait_for_embedded_jobs()  # no broker: its next step runs in this process

    # -- batches ---------------------------------------------------------------------------
    def handle_batches(self, **options: Any) -> None:

        polled = not options["no_poll"]
        batches = [*poll(), *poll_eval_runs()] if polled else list(Batch.objects.open())
        noun = "open batch" if len(batches) == 1 else "open batches"
        head = f"{'Polled ' if polled else ''}{len(batches)} {noun}"
        self.stdout.write(head + (":" if batches else "."))
        for batch in batches:
            self.stdout.write(
                f"  #{batch.pk} {batch.provider} {batch.provider_batch_id or '-'} {batch.status}:"
                f" {batch.succeeded_count} succeeded, {batch.failed_count} failed"
                f" of {batch.request_count}" + (f" ({batch.error})" if batch.error else "")
            )

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

        owner = _user(options["owner"])
        try:
            providers.resolve(model)  # an unknown provider fails here, before a chat exists
            tools = [load_by_path(path) for path in tool_paths]
            chat = Chat(title=str(config.get("title") or "agentloop demo"), owner=owner)
            chat.with_model(model)
            chat.with_instructions(instructions or DEFAULT_INSTRUCTIONS)
            chat.with_tools(*tools)
        except AgentloopError as exc:
            raise CommandError(str(exc)) from exc

        transcript = TranscriptPrinter(self.stdout, self.style)
        transcript.attach(chat)

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
        self._print_summary(chat, options["site"])

    def _print_summary(self, chat: Any, site: str | None) -> None:
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
        if site:
            self.stdout.write(self.style.MIGRATE_HEADING("See it in the admin: ") + site + url)
            return
        python = _python()
        self.stdout.write(self.style.MIGRATE_HEADING("See it in the admin:"))
        self.stdout.write(f"  {python} manage.py createsuperuser")
        self.stdout.write(f"  {python} manage.py runserver")
        self.stdout.write(f"  then open http://127.0.0.1:8000{url}")


def _python() -> str:
    """The interpreter running this command, as a user retypes it (relative inside the project)."""
    executable = Path(sys.executable)
    try:
        return str(executable.relative_to(Path.cwd()))
    except ValueError:
        return str(executable)


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


def _user(username: str | None) -> Any:
    if not username:
        return None
    user_model = get_user_model()
    try:
        return user_model._default_manager.get_by_natural_key(username)
    except user_model.DoesNotExist as exc:
        raise CommandError(f"No user {username!r}.") from exc


def _chat_factory(
    agent_path: str | None, inputs: list[str], model: str | None, owner: Any
) -> Callable[[], Any]:
    """What makes each new chat (the first one, and /new): checked before any is made."""
    config = _demo_config()
    agent_path = agent_path or config.get("agent")
    values = {}
    for item in inputs:
        name, equals, value = item.partition("=")
        if not equals:
            raise CommandError(f"--input takes NAME=VALUE, not {item!r}.")
        values[name.strip()] = value
    try:
        if agent_path:
            agent = load_by_path(agent_path)
            if not (isinstance(agent, type) and issubclass(agent, Agent)):
                raise CommandError(f"{agent_path} is not an agentloop.Agent class.")
            agent.render_instructions(values)  # missing or unknown inputs fail here
            providers.resolve(model or agent.model or agentloop_settings.DEFAULT_MODEL)

            def new_agent_chat() -> Any:
                chat = agent.create(owner=owner, **values)
                return chat.with_model(model) if model else chat

            return new_agent_chat
        if values:
            raise CommandError("--input needs --agent.")
        model = model or config.get("model") or agentloop_settings.DEFAULT_MODEL
        providers.resolve(model)
        tools = [load_by_path(path) for path in config.get("tools") or []]
    except AgentloopError as exc:
        raise CommandError(str(exc)) from exc
    instructions = config.get("instructions") or (DEFAULT_INSTRUCTIONS if tools else None)

    def new_chat() -> Any:

        chat = get_chat_model()(title="Terminal chat", owner=owner)
        chat.with_model(model)
        if instructions:
            chat.with_instructions(instructions)
        if tools:
            chat.with_tools(*tools)
        return chat

    return new_chat


def _take_over(chat_id: str, model: str | None) -> Any:
    """The chat to continue, run from now on by this process."""
    chat_model = get_chat_model()
    try:
        chat = chat_model.objects.get(pk=chat_id)
    except (chat_model.DoesNotExist, ValueError) as exc:
        raise CommandError(f"No chat {chat_id!r}.") from exc
    if chat.state in (ChatState.QUEUED, ChatState.RUNNING):
        raise CommandError(
            f"Chat #{chat.pk} is {chat.state} in the background; wait for it, or cancel it first."
        )
    # Decisions made here must not also send the chat (or its subagents) to a worker.
    chat_model.objects.filter(pk__in=family_ids(chat), state=ChatState.WAITING).update(
        state=ChatState.IDLE
    )
    chat.refresh_from_db(fields=["state"])
    if model:
        try:
            providers.resolve(model)
        except AgentloopError as exc:
            raise CommandError(str(exc)) from exc
        chat.with_model(model)
    return chat

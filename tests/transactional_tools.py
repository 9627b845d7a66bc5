"""Transactional tools for the tests (tests/test_transactional_tools*.py), importable by path
so persisted chats in any process (a Celery worker, a driver) can load them.

Each writes its side effect as a ``Note`` row (example_project's model) whose text is the
call's id, with the chat: so a test can tell, for each call, whether the tool's own row
exists, and compare that with whether the call's result row exists. Each run is logged to
``$AGENTLOOP_TEST_RUN_LOG`` as ``<name>:<chat pk>:<call id>`` (one line, fsync'd).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from django.db.models import Exists, OuterRef

from agentloop import NeedsInput, Tool, ToolError, tool
from agentloop.models import Chat, Message, ToolCall
from agentloop.tools import ToolContext
from example_project.models import Note
from tests.kill_points import stop_here

#: threads that ran a transactional tool of this module (in-process concurrency tests).
THREADS: list[str] = []


def _log_run(name: str, context: ToolContext) -> None:
    path = os.environ.get("AGENTLOOP_TEST_RUN_LOG")
    if not path:
        return
    with Path(path).open("a") as handle:
        handle.write(f"{name}:{context.chat.pk}:{context.tool_call.id}\n")
        handle.flush()
        os.fsync(handle.fileno())


def _book(name: str, context: ToolContext) -> Note:
    _log_run(name, context)
    THREADS.append(threading.current_thread().name)
    return Note.objects.create(chat=context.chat, text=context.tool_call.id)


@tool(transactional=True)
def ledger(context: ToolContext) -> str:
    """Writes the call's ledger line; stops where a test armed a point (tests/kill_points.py)."""
    stop_here("before_body", context.chat.pk)
    _book("ledger", context)
    stop_here("mid_body", context.chat.pk)
    return f"booked {context.tool_call.id}"


@tool(transactional=True, requires_approval=True)
def approved_ledger(context: ToolContext) -> str:
    """Writes the call's ledger line once a person approved the call."""
    _book("approved_ledger", context)
    return f"booked {context.tool_call.id}"


@tool(transactional=True)
def ledger_then_refuse(context: ToolContext) -> str:
    """Writes its line, then refuses (a ToolError): the line must not stay."""
    _book("ledger_then_refuse", context)
    raise ToolError("the ledger is closed")


@tool(transactional=True)
def ledger_then_crash(context: ToolContext) -> str:
    """Writes its line, then fails with a bug: the line must not stay."""
    _book("ledger_then_crash", context)
    raise RuntimeError("the ledger broke")


@tool(transactional=True)
def ledger_then_ask(context: ToolContext) -> str:
    """Writes its line, then asks a person instead of answering: the line must not stay."""
    _book("ledger_then_ask", context)
    raise NeedsInput("Which account?")


@tool(transactional=True)
def ledger_for_a_missing_chat(context: ToolContext) -> str:
    """Writes its line, and one for a chat that doesn't exist: a foreign key Django checks
    at the commit (deferred), so the commit fails; none of it may stay."""
    _book("ledger_for_a_missing_chat", context)
    Note.objects.create(chat_id=10**12, text=context.tool_call.id)
    return "booked twice"


@tool
def plain_ledger_then_crash(context: ToolContext) -> str:
    """Not transactional: writes its line, then fails; the line stays (for contrast)."""
    _book("plain_ledger_then_crash", context)
    raise RuntimeError("the ledger broke")


def steal_lease(chat_pk: Any) -> None:
    """Take chat ``chat_pk``'s lease as another process would (a takeover), committed at once
    on a connection of its own (another thread's)."""

    def take() -> None:
        # Function-local: the thread's own connection, closed when it is done.
        from django.db import connection

        try:
            Chat.objects.filter(pk=chat_pk).update(lease_token="thief" * 6)
        finally:
            connection.close()

    thread = threading.Thread(target=take)
    thread.start()
    thread.join()


@tool(transactional=True)
def ledger_then_lose_the_chat(context: ToolContext) -> str:
    """Writes its line; meanwhile another process takes the chat's lease over."""
    _book("ledger_then_lose_the_chat", context)
    steal_lease(context.chat.pk)
    return "booked, but the chat was taken over"


#: the calls whose first run dropped its connection (``ledger_then_drop_connection``).
DROPPED: set[str] = set()


@tool(transactional=True)
def ledger_then_drop_connection(context: ToolContext) -> str:
    """Writes its line, then, on its call's first run only, has PostgreSQL drop the step's
    connection (a server restart, a network cut): the transaction is gone with it."""
    # Function-local: the fault helpers need psycopg, present only on PostgreSQL runs.
    from tests.db_faults import backend_pid, terminate

    _book("ledger_then_drop_connection", context)
    if context.tool_call.id not in DROPPED:
        DROPPED.add(context.tool_call.id)
        terminate(backend_pid())
    return f"booked {context.tool_call.id}"


class Transfer(Tool):
    """Moves an amount: the class form of a transactional tool."""

    transactional = True

    def execute(self) -> str:
        _book("transfer", self.context)
        return f"moved for {self.tool_call.id}"


@tool
def lookup() -> str:
    """An ordinary tool to run beside the transactional ones."""
    THREADS.append(threading.current_thread().name)
    return "looked up"


def ledger_rows(*chat_pks: Any) -> list[tuple[Any, str, bool, bool]]:
    """For every tool call of the chats: ``(chat pk, call id, has its Note, has its result)``,
    read in one statement (one snapshot: a commit can't fall between the two halves)."""
    notes = Note.objects.filter(chat_id=OuterRef("chat_id"), text=OuterRef("call_id"))
    results = Message.objects.filter(tool_call_id=OuterRef("pk"))
    calls = ToolCall.objects.filter(chat_id__in=chat_pks).order_by("chat_id", "id")
    rows = calls.annotate(noted=Exists(notes), answered=Exists(results))
    return list(rows.values_list("chat_id", "call_id", "noted", "answered"))


def notes_of(chat: Chat) -> list[str]:
    """The call ids of the chat's Note rows, in the order they were written."""
    return list(Note.objects.filter(chat=chat).order_by("id").values_list("text", flat=True))

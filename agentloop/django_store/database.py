"""The Django store: a chat's transcript, usage and cancel flag in the database.

``DjangoStore`` is the ``ChatStore`` the engine sees: its parts each own their state and are
handed their collaborators, and the engine calls them directly: ``ChatRow`` (the chat, its
models and database; also its trace names and context, ``store.tracing``), ``Config``
(``store.config``), ``RunControl`` (``store.runs``: the claim and every write under it),
``Transcript`` (``store.transcript`` and ``store.costs``: messages and usage), ``ToolCalls``
(``store.tool_calls``, ``store.handoffs``, ``store.transactions``), ``Stopping`` (cancel,
halt), ``Inbox`` (messages queued while a run holds the chat), ``ChatBudgets`` (the budgets
its model calls count against, :mod:`agentloop.budgets`) and ``Edits`` (``store.edits`` and
``store.forks``: superseded rows, forks).

Queries per verb don't grow with the history: the transcript is one SELECT
(messages joined with their tool calls, no model instances: see ``transcript_rows``), and
each write is a short transaction in the order docs/design.md §2 gives (answer + its tool calls +
usage together; each tool result on its own).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import connections, transaction

from ..budgets.enforcement import ChatBudgets
from ..budgets.limits import budgets_on
from ..engine import ChatStore
from ..engine.rate_limiting import RateLimiter
from ..memory import ChatMemories
from ..process.cancel_notices import listen_locally
from ..rate_limits import fleet_limiter
from .chat_row import ChatRow, transcript_read, transcript_select
from .configuration import Config
from .edits import Edits
from .inbox import Inbox
from .run_control import RunControl
from .stopping import Stopping
from .tool_calls import ToolCalls
from .transcript import Transcript
from .waiting import release_connection

__all__ = ["DjangoStore", "transcript_read", "transcript_select"]

T = TypeVar("T")


class DjangoStore(ChatStore):
    """Keeps one chat row's transcript; the models come from its related managers."""

    runs: RunControl
    config: Config
    transcript: Transcript
    costs: Transcript
    tool_calls: ToolCalls
    handoffs: ToolCalls
    transactions: ToolCalls
    stopping: Stopping
    inbox: Inbox
    edits: Edits
    forks: Edits
    tracing: ChatRow
    budgets: ChatBudgets | None
    memory: ChatMemories

    def __init__(
        self,
        chat: Any,
        *,
        send_next: Callable[[], None] | None = None,
        send_job: Callable[[str, str], None] | None = None,
    ) -> None:
        """``chat``: a row of a model built on ``AbstractChat``. ``send_next`` sends the
        chat's next background job: the store calls it when a verb run in-process (or a
        message queued to a free chat) leaves the chat queued for the background;
        ``send_job(chat model label, chat key)`` sends another chat's, when this one frees
        a place of a chats-in-flight quota that chat waits in line for. The store sends
        nothing itself: its owner knows the runners."""
        self.chat = chat
        self.cancel_notice = listen_locally(chat)
        self.row = ChatRow(chat)
        self.config = Config(self.row)
        budgets = ChatBudgets(chat)
        # The part is absent when no budget counts spend (AGENTLOOP["BUDGETS"] unset): the
        # engine then makes no estimate of a call. The writes still tell ``budgets`` of
        # usage and releases (it does nothing with them then).
        self.budgets = budgets if budgets_on() else None
        self.runs = RunControl(
            self.row, self.config, self.cancel_notice, send_next, budgets, send_job
        )
        self.transcript = self.costs = Transcript(self.row, self.runs, budgets)
        self.tool_calls = self.handoffs = self.transactions = ToolCalls(self.row, self.runs)
        self.stopping = Stopping(self.row, self.runs, self.cancel_notice, budgets)
        self.inbox = Inbox(self.row, self.runs)
        self.edits = self.forks = Edits(self.row, self.runs)
        self.tracing = self.row
        self.memory = ChatMemories(chat)

    @contextmanager
    def atomic(self) -> Iterator[None]:
        # Each write inside keeps its lease guard (a savepoint): a lost lease undoes all. Rolled
        # back, the chat object takes its columns back too, so the run goes on as it was.
        chat = self.chat
        saved = {
            field.attname: getattr(chat, field.attname) for field in chat._meta.concrete_fields
        }
        try:
            with transaction.atomic(using=self.row.db):
                yield
        except BaseException:
            for name, value in saved.items():
                setattr(chat, name, value)
            self.config.forget()
            raise

    def rate_limiter(self) -> RateLimiter | None:
        return fleet_limiter()

    def before_wait(self) -> None:
        # The lease stays (the heartbeat renews it on a connection of its own); the next
        # statement takes a connection again (AGENTLOOP["RELEASE_CONNECTIONS"]).
        release_connection(self.row.db)

    phases_on_a_thread = True

    async def run_phase(self, function: Callable[..., T], *args: Any) -> T:
        # The ORM blocks: on the one thread Django's own async ORM calls use for this
        # context (a request's thread under ASGI), so a phase sees the verb's connection.
        return await sync_to_async(function, thread_sensitive=True)(*args)

    def wrap_thread(self, function: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            try:
                return function()
            finally:
                # A tool thread that used the ORM opened its own connections.
                connections.close_all()

        return run

"""The Django store: a chat's transcript, usage and cancel flag in the database.

``DjangoStore`` is the ``ChatStore`` the engine sees, composed of parts that each own their
state and are handed their collaborators: ``ChatRow`` (the chat, its models and database),
``Config`` (configuration and tools), ``RunControl`` (the claim and every write under it),
``Transcript`` (messages and usage), ``ToolCalls`` (tool-call rows), ``Stopping`` (cancel,
halt), ``Inbox`` (messages queued while a run holds the chat), ``ChatBudgets`` (the
budgets its model calls count against, :mod:`agentloop.budgets`) and ``Edits`` (superseded
rows, forks). Each verb is answered by
its part.

Queries per verb don't grow with the history: the transcript is one SELECT
(messages joined with their tool calls, no model instances: see ``transcript_rows``), and
each write is a short transaction in the order docs/design.md §2 gives (answer + its tool calls +
usage together; each tool result on its own).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from decimal import Decimal
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import connections, transaction

from ..budgets.enforcement import ChatBudgets
from ..engine import ChatConfig, ChatStore, ToolTransaction, UsageRecord
from ..engine.estimates import CallEstimate
from ..engine.rate_limiting import RateLimiter
from ..engine.store import Superseded
from ..messages import Message, ToolCall, ToolCallState
from ..process.cancel_notices import covers, listen_locally
from ..rate_limits import fleet_limiter
from ..tools import Tool
from .chat_row import ChatRow, transcript_select
from .config import Config
from .edits import Edits
from .inbox import Inbox
from .leases import Lease
from .releases import Release
from .run_control import RunControl
from .stopping import Stopping
from .tool_calls import ToolCalls
from .transcript import Transcript
from .waiting import release_connection

__all__ = ["DjangoStore", "transcript_select"]

T = TypeVar("T")


class DjangoStore(ChatStore):
    """Keeps one chat row's transcript; the models come from its related managers."""

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
        self.send_job = send_job
        self.cancel_notice = listen_locally(chat)
        self.row = ChatRow(chat)
        self.config = Config(self.row)
        self.control = RunControl(self.row, self.config, self.cancel_notice, send_next)
        self.budgets = ChatBudgets(chat)
        self.transcript = Transcript(self.row, self.control, self.budgets)
        self.tool_calls = ToolCalls(self.row, self.control)
        self.stopping = Stopping(self.row, self.control, self.cancel_notice, self.budgets)
        self.inbox = Inbox(self.row, self.control)
        self.edits = Edits(self.row, self.control)

    # -- what callers read of the claim (workers, batches) --------------------------------
    @property
    def background(self) -> bool:
        return self.control.background

    @background.setter
    def background(self, value: bool) -> None:
        self.control.background = value

    @property
    def lease(self) -> Lease | None:
        return self.control.lease

    @property
    def last_release(self) -> Release | None:
        return self.control.last_release

    @property
    def send_next(self) -> Callable[[], None] | None:
        return self.control.send_next

    def adopt(self, lease: Lease, transcript: list[Any] | None = None) -> None:
        self.control.adopt(lease, transcript)

    def release_with(self, **fields: Any) -> None:
        self.control.release_with(**fields)

    # -- configuration -------------------------------------------------------------------
    def get_config(self) -> ChatConfig:
        return self.config.get_config()

    def update_config(self, **changes: Any) -> None:
        self.config.update_config(**changes)

    def set_tools(self, tools: list[Any]) -> None:
        self.config.set_tools(tools)

    def get_tools(self) -> list[type[Tool]]:
        return self.config.get_tools()

    def set_guardrails(self, guardrails: list[Any]) -> None:
        self.config.set_guardrails(guardrails)

    def get_guardrails(self) -> list[Any]:
        return self.config.get_guardrails()

    # -- the claim -----------------------------------------------------------------------
    def claim(self) -> bool:
        return self.control.claim()

    def release(self, next_move: str | None, *, failure: BaseException | None = None) -> None:
        self.control.release(next_move, failure=failure)
        released = self.control.last_release
        if released is None or released.state in ("lost", "unreachable"):
            return
        # Places of a chats-in-flight quota it freed (or that freed while it queued for one):
        # the next chats in line go.
        for chat_label, chat_key in self.budgets.released(released.state):
            if self.send_job is not None:
                self.send_job(chat_label, chat_key)

    # -- transcript ----------------------------------------------------------------------
    def load_transcript(self) -> list[Message]:
        return self.transcript.read()

    def read_for_step(self) -> tuple[list[Message], datetime | None]:
        # One query for the transcript; the cancel flag comes from the claim's read of the chat
        # row just before (or from a query of its own when no verb holds the chat).
        return self.transcript.read(), self.stopping.cancel_requested_at()

    def turn_started_at(self, message: Message) -> datetime | None:
        return self.transcript.turn_started_at(message)

    def append_message(self, message: Message) -> Any:
        return self.transcript.append_message(message)

    def save_guardrails(self, message: Message) -> None:
        self.transcript.save_guardrails(message)

    def replace_instructions(self, text: str) -> None:
        self.transcript.replace_instructions(text)

    def save_partial(self, content: str, partial_key: Any, model: str) -> Any:
        return self.transcript.save_partial(content, partial_key, model)

    def fail_partial(self, partial_key: Any) -> None:
        self.transcript.fail_partial(partial_key)

    def save_answer(
        self,
        message: Message,
        usage: UsageRecord,
        partial_key: Any = None,
        *,
        release: str | None = None,
    ) -> Any:
        return self.transcript.save_answer(message, usage, partial_key, release=release)

    def record_usage(self, usage: UsageRecord) -> None:
        self.transcript.record_usage(usage)

    def last_input_tokens(self) -> tuple[Any, int] | None:
        return self.transcript.last_input_tokens()

    def native_message(self, message: Message) -> Any:
        return self.transcript.native_message(message)

    def turn_cost(self, since: datetime) -> Decimal:
        return self.transcript.turn_cost(since)

    # -- budgets and rate limits ---------------------------------------------------------
    def reserve(self, estimate: CallEstimate) -> Any:
        # A background step's chat queues for a chats-in-flight place; a verb in-process
        # can't wait in line (its caller waits for it): it stops.
        return self.budgets.reserve(estimate, wait=self.control.background)

    def rate_limiter(self) -> RateLimiter | None:
        return fleet_limiter()

    def note_waiting(self, reason: str) -> None:
        with self.control.writing():
            self.row.update(waiting_for=reason[:200])

    # -- tool calls ----------------------------------------------------------------------
    def mark_tool_running(self, call: ToolCall) -> bool:
        return self.tool_calls.mark_tool_running(call)

    def save_tool_result(
        self,
        call: ToolCall,
        message: Message,
        state: ToolCallState,
        error: str | None,
        *,
        release: str | None = None,
    ) -> Any:
        return self.tool_calls.save_tool_result(call, message, state, error, release=release)

    def save_tool_guardrails(self, call: ToolCall) -> None:
        self.tool_calls.save_tool_guardrails(call)

    def mark_tool_waiting(self, call: ToolCall, reason: str, question: str | None = None) -> None:
        self.tool_calls.mark_tool_waiting(call, reason, question)

    def record_handoff(self, call: ToolCall, handoff: dict[str, Any]) -> None:
        self.tool_calls.record_handoff(call, handoff)

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

    runs_transactions = True

    def run_in_transaction(
        self, call: ToolCall, work: Callable[[ToolTransaction], T]
    ) -> tuple[T, str]:
        return self.tool_calls.run_in_transaction(call, work)

    def record_decision(
        self, call: ToolCall, decision: str, *, by: Any, reason: str, result: Message | None
    ) -> Any:
        return self.tool_calls.record_decision(call, decision, by=by, reason=reason, result=result)

    def native_tool_call(self, call: ToolCall) -> Any:
        return self.tool_calls.native_tool_call(call)

    # -- edits and forks -----------------------------------------------------------------
    def load_history(self) -> list[Message]:
        return self.edits.load_history()

    def supersede(self, first: Message) -> Superseded:
        return self.edits.supersede(first)

    def superseded_calls(self) -> list[ToolCall]:
        return self.edits.superseded_calls()

    def pending_run(self) -> str:
        return self.edits.pending_run()

    def fork(self, at: Message, open_call_result: str) -> Any:
        return self.edits.fork(at, open_call_result)

    # -- cancels and halts ---------------------------------------------------------------
    def notices_cover(self, since: float) -> bool:
        # A verb heard by its process's Redis subscriber from its claim on (``hear``).
        return covers(self.cancel_notice, since)

    def cancel_requested_at(self) -> datetime | None:
        return self.stopping.cancel_requested_at()

    def request_cancel(self) -> bool:
        return self.stopping.request_cancel()

    def record_cancellation(
        self,
        requested_at: datetime | None,
        *,
        partial: Message | None,
        partial_key: Any,
        usage: UsageRecord | None,
        unanswered: list[ToolCall],
    ) -> None:
        self.stopping.record_cancellation(
            requested_at, partial=partial, partial_key=partial_key, usage=usage,
            unanswered=unanswered,
        )  # fmt: skip

    def cancel_held(self, result: str) -> list[Any] | None:
        return self.stopping.cancel_held(result)

    def record_stop(self, reason: str) -> None:
        self.stopping.record_stop(reason)

    def request_halt(self, reason: str) -> bool:
        return self.stopping.request_halt(reason)

    def halt_requested(self) -> str:
        return self.stopping.halt_requested()

    # -- messages sent while a run holds the chat -----------------------------------------
    def queue_message(self, message: Message) -> None:
        self.inbox.queue_message(message)

    def run_in_progress(self) -> bool:
        return self.inbox.run_in_progress()

    def has_queued(self) -> bool:
        return self.inbox.has_queued()

    def take_queued(self) -> list[Message]:
        return self.inbox.take_queued()

    # -- tracing -------------------------------------------------------------------------
    def trace_names(self) -> tuple[str, str]:
        return self.row.trace_names()

    def trace_context(self) -> dict[str, str]:
        return self.row.trace_context()

    def set_trace_context(self, carrier: dict[str, str]) -> None:
        self.row.set_trace_context(carrier)

    # -- waiting and threads -----------------------------------------------------------------
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

"""The store interface the engine talks to, and the records it passes through it.

A store keeps one chat: its configuration, its transcript, its usage rows and
its cancellation flag. The engine never touches a database itself; the Django
store (:mod:`agentloop.django_store`) and the in-memory store (:mod:`.in_memory_store`) do.

A store is a small core (the hooks around a verb's database work) and parts, each an
interface written once here: ``store.config``, ``store.runs`` (the claim),
``store.transcript``, ``store.tool_calls`` and ``store.stopping`` are always there; the
optional parts (``store.inbox``, ``store.costs``, ``store.tracing``, ``store.handoffs``,
``store.transactions``, ``store.edits``, ``store.forks``, ``store.budgets``,
``store.memory``) are an object or
None, and the engine does without a missing one, or refuses clearly what needs it. The engine
calls the parts directly. Each method that writes says what must happen atomically: that is
what makes a crash at any point resumable.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any, Literal, TypeVar

from ..conf import agentloop_settings
from ..messages import Message, TokenUsage, ToolCall, ToolCallState, checked_cost
from ._chat_config import ChatConfig, MemoryOptions
from .rate_limiting import CallEstimate, RateLimiter, memory_limiter

__all__ = [
    "OPTIONAL_PARTS",
    "SUPERSEDED_DECISION",
    "Budgets",
    "ChatStore",
    "Configuration",
    "Costs",
    "Edits",
    "Forks",
    "Handoffs",
    "Inbox",
    "Memories",
    "Recalled",
    "RunClaim",
    "Stopping",
    "Superseded",
    "ToolCalls",
    "ToolTransaction",
    "Tracing",
    "Transactions",
    "Transcript",
    "UsageRecord",
    "missing_part",
]


#: the decision a call held for a person or a subagent gets when it is superseded.
SUPERSEDED_DECISION = "superseded"


def missing_part(store: Any, part: str, instead: str) -> str:
    """The one-line error for a verb that needs an optional part ``store`` leaves out."""
    return f"{type(store).__name__} leaves out an optional part (store.{part} is None): {instead}."


T = TypeVar("T")
UsageStatus = Literal["succeeded", "failed", "cancelled"]


@dataclass
class UsageRecord:
    """One provider attempt, successful or not."""

    provider: str
    model: str
    status: UsageStatus
    usage: TokenUsage = field(default_factory=TokenUsage)
    cost: Decimal | None = None
    error: str = ""
    duration_ms: int | None = None
    #: what ``Budgets.reserve`` returned for this attempt: the write of this row settles it.
    reservation: Any = None

    def __post_init__(self) -> None:
        # The one place a cost becomes a usage row and a budget's charge: never a credit.
        self.cost = checked_cost(self.cost, self.model)


@dataclass
class Superseded:
    """What :meth:`Edits.supersede` marked: the messages' keys, in order, and the calls
    among them that had no result (now "cancelled"; they never run)."""

    keys: list[Any] = field(default_factory=list)
    open_calls: list[ToolCall] = field(default_factory=list)


@dataclass
class ToolTransaction:
    """The transaction a transactional tool runs in (``Transactions.run_in_transaction``)."""

    #: a context around the tool's body: what it wrote is rolled back when an exception
    #: leaves it (the tool failed; its error result is still written, in the transaction).
    savepoint: Callable[[], AbstractContextManager[Any]] = nullcontext


# -- the parts every store has -------------------------------------------------------------
class Configuration(ABC):
    """``store.config``: the chat's configuration, tools and guardrails."""

    @abstractmethod
    def get_config(self) -> ChatConfig:
        """The chat's configuration."""

    @abstractmethod
    def update_config(self, **changes: Any) -> None:
        """Persist the given ``ChatConfig`` fields."""

    @abstractmethod
    def set_tools(self, tools: list[Any]) -> None:
        """Keep the chat's tools (Tool classes); persisted stores keep import paths."""

    @abstractmethod
    def get_tools(self) -> list[Any]:
        """The chat's Tool classes."""

    @abstractmethod
    def set_guardrails(self, guardrails: list[Any]) -> None:
        """Keep the chat's guardrails (``Guardrail`` objects); persisted stores keep import
        paths."""

    @abstractmethod
    def get_guardrails(self) -> list[Any]:
        """The chat's guardrails (``Guardrail`` objects), in the order they were given."""


class RunClaim(ABC):
    """``store.runs``: the claim, one writer at a time."""

    #: True while a background worker runs the chat (tools may act differently, e.g.
    #: a subagent is enqueued as its own jobs instead of run to completion inline).
    background: bool = False

    @abstractmethod
    def claim(self) -> bool:
        """Make this process the chat's only writer for a verb (one conditional write).

        Returns True when this call took the claim (the verb must :meth:`release` it), False
        when this store already holds it (a nested verb, or a worker's job that took it while
        loading the chat). Raises ``ChatBusyError`` when another process or thread holds it.
        """

    @abstractmethod
    def release(self, next_move: str | None, *, failure: BaseException | None = None) -> None:
        """Give the claim up, recording how the verb ended: ``next_move`` ("done", "wait",
        "tools", "generate") after a verb that went well, else ``failure`` (an error that is
        not a cancel or a limit: the chat is marked failed with a one-line error). A no-op
        when the claim was already released by the verb's last write."""

    def note_waiting(self, reason: str) -> None:
        """A verb waits in place for ``reason`` (a rate limit), or no longer ("")."""
        return None


class Transcript(ABC):
    """``store.transcript``: the chat's messages and usage rows."""

    @abstractmethod
    def load_transcript(self) -> list[Message]:
        """All messages in order, with tool calls, but those superseded by an edit or a
        regenerated answer (the engine never sees them again); a constant number of
        queries."""

    def turn_started_at(self, message: Message) -> datetime | None:
        """When ``message`` (a turn's first) was written; stores may read it on demand."""
        return message.created_at

    @abstractmethod
    def append_message(self, message: Message) -> Any:
        """Add a system or user message. A user message starts a new turn."""

    @abstractmethod
    def save_guardrails(self, message: Message) -> None:
        """Persist what guardrails decided about a stored message (``message.guardrails``),
        with its content and status, which they may have changed (a replaced text, a
        blocked message): one write."""

    @abstractmethod
    def replace_instructions(self, text: str) -> None:
        """Make ``text`` the only system message, keeping the first one's place."""

    @abstractmethod
    def save_partial(self, content: str, partial_key: Any, model: str) -> Any:
        """Write (or update) a streaming answer marked partial; returns its key."""

    @abstractmethod
    def fail_partial(self, partial_key: Any) -> None:
        """Mark a streamed partial answer failed: its model call failed for good, and it
        must not look like an answer still streaming."""

    @abstractmethod
    def save_answer(
        self,
        message: Message,
        usage: UsageRecord,
        partial_key: Any = None,
        *,
        release: str | None = None,
    ) -> Any:
        """Atomically: the assistant message (replacing the partial one, if any), its
        tool calls and the usage row; sets ``key`` on ``message`` and on its calls. With
        ``release`` (the next move), the same transaction also releases the claim."""

    @abstractmethod
    def record_usage(self, usage: UsageRecord) -> None:
        """A usage row for a failed attempt."""

    def last_input_tokens(self) -> tuple[Any, int] | None:
        """The key of the latest answer whose provider reported its input tokens, and that
        count (compaction's estimate starts from it); None: not known."""
        return None

    @abstractmethod
    def native_message(self, message: Message) -> Any:
        """The store's record for a transcript message."""


class ToolCalls(ABC):
    """``store.tool_calls``: the states of the model's tool calls and their results."""

    @abstractmethod
    def mark_tool_running(self, call: ToolCall) -> bool:
        """Claim the call for running: one conditional write moving it from the state it was
        read in (pending, approved, or running after a crash) to running, with what tool
        guardrails decided (``call.guardrails``; arguments one replaced, the model's kept in
        ``call.original_arguments``). False when the call changed meanwhile: it must not
        run."""

    @abstractmethod
    def save_tool_guardrails(self, call: ToolCall) -> None:
        """Persist ``call.guardrails`` for a call that will not run now (a guardrail blocked
        it, or failed): one write."""

    @abstractmethod
    def save_tool_result(
        self,
        call: ToolCall,
        message: Message,
        state: ToolCallState,
        error: str | None,
        *,
        release: str | None = None,
    ) -> Any:
        """Atomically: the tool message answering ``call`` and the call's final state (and,
        with ``release``, the next move, the claim's release). Raises
        ``ConcurrentWriteError`` if the call already has a result."""

    @abstractmethod
    def mark_tool_waiting(self, call: ToolCall, reason: str, question: str | None = None) -> None:
        """Hold the call for a person ("approval", "question"), a subagent or an outside
        result ("deferred"; with what tool guardrails decided, ``call.guardrails``)."""

    @abstractmethod
    def record_decision(
        self, call: ToolCall, decision: str, *, by: Any, reason: str, result: Message | None
    ) -> Any:
        """Atomically, and only if the call still waits (else ``DecisionConflictError``): a
        person's decision (who, when, for which arguments) and, for a denial or an answer,
        the call's result message (returned). An approval with edited arguments
        (``call.original_arguments`` set) also writes ``call.arguments`` and keeps those."""

    @abstractmethod
    def native_tool_call(self, call: ToolCall) -> Any:
        """The store's record for a tool call (no query needed)."""


class Stopping(ABC):
    """``store.stopping``: cancels, halts and why a turn stopped."""

    @abstractmethod
    def cancel_requested_at(self) -> datetime | None:
        """When cancellation was requested, or None. Called at every checkpoint."""

    def notices_cover(self, since: float) -> bool:
        """Whether every cancel requested after ``since`` (``time.monotonic()``) is sure to
        set ``store.cancel_notice`` (a subscription that has stood since then): throttled
        checkpoints then needn't read the flag between forced ones. False: they poll."""
        return False

    @abstractmethod
    def request_cancel(self) -> bool:
        """Ask the run, wherever it runs, to stop (one write); False (and nothing set) when no
        run is in progress, queued or waiting for a person."""

    @abstractmethod
    def record_cancellation(
        self,
        requested_at: datetime | None,
        *,
        partial: Message | None,
        partial_key: Any,
        usage: UsageRecord | None,
        unanswered: list[ToolCall],
    ) -> None:
        """Atomically: clear the flag (if still the one read), keep the partial answer
        marked cancelled, record the cut-short attempt, mark unanswered calls cancelled (one
        still waiting for a person with the decision "cancelled", as a decision: one that
        answered it first stands)."""

    @abstractmethod
    def cancel_held(self, result: str) -> list[Any] | None:
        """Apply a cancel to a chat with a call waiting (or approved meanwhile, not started)
        that no run holds or is queued to run (no run would come back to see the flag),
        atomically: each call of its round without a result that is held for a person (not
        for a subagent) or pending and not started gets the error result ``result`` and the
        state "cancelled", a held one also the decision "cancelled", each only if still
        undecided (a decision that got there first stands; a later one gets
        ``DecisionConflictError``); the flag is cleared; a chat whose state is "waiting"
        becomes "idle". The result records written, in call order; None, with nothing done,
        when no such call is left, or a run holds the chat or is queued to run it (its next
        checkpoint applies the cancel)."""

    @abstractmethod
    def record_stop(self, reason: str) -> None:
        """Remember why the turn stopped (a limit, a halt); a pending halt is cleared."""

    @abstractmethod
    def request_halt(self, reason: str) -> bool:
        """Ask the run to stop before its next model call (one write, or none when this
        store runs the chat); False, and nothing set, when no run is in progress or queued."""

    @abstractmethod
    def halt_requested(self) -> str:
        """The reason of a halt asked for and not yet applied ("" when there is none)."""


# -- the optional parts: None where a store leaves one out ------------------------------------
class Inbox(ABC):
    """``store.inbox``: messages sent while another run holds the chat (double-texting);
    ``if_busy="queue"`` and ``"interrupt"``. Without it ``if_busy`` can only be "reject"."""

    @abstractmethod
    def queue_message(self, message: Message) -> None:
        """Keep a user message sent while another run holds the chat; the run that holds it
        (or the next) adds it once the chat can take it. Makes sure a run will."""

    @abstractmethod
    def has_queued(self) -> bool:
        """Messages wait to be added (as of the claim's read of the chat)."""

    @abstractmethod
    def take_queued(self) -> list[Message]:
        """The waiting messages, oldest first, removed (under the verb's claim)."""

    def run_in_progress(self) -> bool:
        """A background run of this chat is on (as last read), even between two of its jobs."""
        return False


class Costs(ABC):
    """``store.costs``: sums a turn's usage rows. Without it a chat can't have a ``max_cost``
    limit."""

    @abstractmethod
    def turn_cost(self, since: datetime) -> Decimal:
        """Total known cost of usage rows since the turn began."""


class Tracing(ABC):
    """``store.tracing`` (AGENTLOOP["TRACING"], :mod:`agentloop.engine.tracing`): how spans name
    the chat, and a turn's trace context kept across its jobs. Without it each job of a
    background turn starts its own trace."""

    @abstractmethod
    def trace_names(self) -> tuple[str, str]:
        """The chat's id and its agent's name ("" when it has none), as spans show them."""

    @abstractmethod
    def trace_context(self) -> dict[str, str]:
        """The current turn's trace context (W3C ``traceparent``/``tracestate``); {}: none."""

    @abstractmethod
    def set_trace_context(self, carrier: dict[str, str]) -> None:
        """Keep the trace context of the turn that starts (it replaces the last turn's), so
        every later job of the turn joins its trace."""


class Handoffs(ABC):
    """``store.handoffs``: keeps on a tool call the handoff it made, read back with the
    transcript. Without it no handoff is made."""

    @abstractmethod
    def record_handoff(self, call: ToolCall, handoff: dict[str, Any]) -> None:
        """Keep on ``call`` (with a key, read back in the transcript as ``call.handoff``) the
        handoff it made: ``{"from": <agent path or "">, "to": <agent path>, "inputs": {...}}``.
        Written inside :meth:`ChatStore.atomic`, with the configuration it switched and the
        result."""


class Transactions(ABC):
    """``store.transactions``: runs a transactional tool (``Tool.transactional``), its result
    and its call's state in one transaction, in the verb's own database phase. Without it
    (the in-memory store has no database to share) such tools run as others."""

    @abstractmethod
    def run_in_transaction(
        self, call: ToolCall, work: Callable[[ToolTransaction], T]
    ) -> tuple[T, str]:
        """Run ``work`` (a transactional tool's run for ``call``: the tool, then its result or
        its wait, whose claim check comes first) in one transaction: all it writes commits,
        or nothing does. An error ``work`` raises (a lost claim, a failed write) rolls it
        back and goes on up; a connection lost before the commit (nothing committed) has it
        run again on a new one while the claim holds. Returns ``work``'s result and "" once
        it committed, or why the database refused the commit (a deferred constraint the
        tool's writes broke): then nothing of it was kept."""


class Edits(ABC):
    """``store.edits`` (docs/editing.md): superseded messages. Without it ``edit()`` and
    ``regenerate()`` refuse, writing nothing."""

    @abstractmethod
    def supersede(self, first: Message) -> Superseded:
        """Atomically, under the verb's claim: mark ``first`` and every message after it
        superseded, system messages excepted (the instructions are configuration). They
        stay, for the record and the ledger (their usage rows are kept), but are never read
        into the transcript again. Their calls without a result become "cancelled" (one held
        for a person or a subagent also gets the decision "superseded"), so no run, decision
        or sweeper ever acts on them."""

    @abstractmethod
    def superseded_calls(self) -> list[ToolCall]:
        """The calls of superseded messages (id, name and key at least): their ids are never
        given to a new call (a tool's idempotency key must not repeat), and a decision on
        one is told it was superseded. Cheap when nothing was ever superseded."""

    @abstractmethod
    def load_history(self) -> list[Message]:
        """Every message in order, superseded ones included (``superseded`` set): for
        pages and tests that show what was replaced; never sent to a model."""

    def pending_run(self) -> str:
        """Why a run other than the caller's will still write to this chat (a background run
        queued or running, an answer awaited from a provider batch), or "" when none will:
        an edit must not race it."""
        return ""


class Forks(ABC):
    """``store.forks``: copies the chat into a new one. Without it ``fork()`` refuses."""

    @abstractmethod
    def fork(self, at: Message, open_call_result: str) -> Any:
        """A new chat: this chat's configuration, tools and owner, and copies of the
        transcript's messages up to and including ``at`` (partial answers left out; no usage
        rows), linked to this chat and to ``at`` where the store can. A copied call without a
        copied result gets the error result ``open_call_result`` (state "cancelled"), so a
        fork never runs a call its origin may have run; a summary covers the same copied
        rows. Returns the store's record of the new chat (the new chat row), or the new
        store itself when the store has no record of its own (the engine wraps it)."""


class Budgets(ABC):
    """``store.budgets`` (docs/budgets.md): the budgets a chat's model calls count against.
    Without it no budget counts the chat."""

    @abstractmethod
    def reserve(self, estimate: CallEstimate, *, wait: bool = False) -> Any:
        """Before a model call: reserve ``estimate`` against the budgets of the chat's
        subjects, race-free across processes, or raise ``BudgetExceededError`` (nothing
        reserved). ``wait``: a background step, which may queue for a chats-in-flight
        place. The reservation goes on the attempt's usage row (``UsageRecord``), whose
        write settles it to the exact cost; None: no budget counts this call."""


@dataclass
class Recalled:
    """What :meth:`Memories.recall` gives one model call."""

    #: what goes with the instructions (the memories' and the working memory's text, marked
    #: as data, not instructions); "" when there is nothing to give.
    text: str = ""
    #: the memories recalled, ``[{"id": ..., "similarity": ...}]`` nearest first: kept on the
    #: answer (``Message.recall``), so the turn's later calls recall the same ones.
    memories: list[dict[str, Any]] = field(default_factory=list)


class Memories(ABC):
    """``store.memory`` (docs/memory.md): memories recalled before a model call
    (``with_memory``). Without it ``with_memory`` refuses."""

    @abstractmethod
    def recall(self, transcript: list[Message], options: MemoryOptions) -> Recalled:
        """The memories nearest the turn's user message (the latest), within ``options``,
        and the working memory when ``options.working``. The turn's first call embeds the
        message once; its later calls (and other processes continuing the turn) take the
        memories an earlier answer of the turn kept (``Message.recall``) by their ids."""


#: the optional parts, by attribute name.
OPTIONAL_PARTS: dict[str, type] = {
    "inbox": Inbox,
    "costs": Costs,
    "tracing": Tracing,
    "handoffs": Handoffs,
    "transactions": Transactions,
    "edits": Edits,
    "forks": Forks,
    "budgets": Budgets,
    "memory": Memories,
}


class ChatStore(ABC):
    """Where one chat lives: its parts, and the hooks around the database work of a verb.
    Methods returning ``Any`` return the store's own records (Django model instances for the
    Django store), which is what users get back.

    A store sets its parts in ``__init__``; an optional part it leaves out stays None."""

    config: Configuration
    runs: RunClaim
    transcript: Transcript
    tool_calls: ToolCalls
    stopping: Stopping
    inbox: Inbox | None = None
    costs: Costs | None = None
    tracing: Tracing | None = None
    handoffs: Handoffs | None = None
    transactions: Transactions | None = None
    edits: Edits | None = None
    forks: Forks | None = None
    budgets: Budgets | None = None
    memory: Memories | None = None

    #: set when a cancel request is known to have arrived, so throttled checkpoints
    #: read the flag at once instead of at the next poll (None: polling only).
    cancel_notice: threading.Event | None = None

    def atomic(self) -> AbstractContextManager[None]:
        """The writes made inside commit together or not at all (the Django store: one
        transaction); a store whose writes can't fail halfway keeps this default."""
        return nullcontext()

    def rate_limiter(self) -> RateLimiter | None:
        """Where the rate-limit buckets of this chat's calls live; None: no limits. Here
        this process's own (the Django store's are shared by every process)."""
        return memory_limiter() if agentloop_settings.RATE_LIMITS else None

    def before_wait(self) -> None:
        """The verb is about to wait (a model call, a tool run, a backoff): a store that holds
        a database connection may give it back; its next statement takes one again."""
        return None  # nothing held here

    def wrap_thread(self, function: Callable[[], Any]) -> Callable[[], Any]:
        """Wrap work run on a tool thread (the Django store closes its connections)."""
        return function

    #: ``run_phase`` runs off the event loop (on a thread): sync tools may run there too.
    phases_on_a_thread: bool = False

    async def run_phase(self, function: Callable[..., T], *args: Any) -> T:
        """Run a database phase of an async verb (reads, decisions, writes; never network
        I/O). Here in place: a store that blocks (a database) runs it on a thread."""
        return function(*args)

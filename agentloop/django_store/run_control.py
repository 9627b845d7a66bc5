"""The Django store's claim: one writer per chat, for every writing verb in any process.

A verb takes the chat's lease with one conditional UPDATE (``.leases``) unless a
worker's job already took it while loading the chat; it gives it up with one UPDATE that
also records how the verb ended (``.releases``). Every write under the lease renews it in its
first statement (``RunControl.writing``, or ``RunControl.at_once`` for a step's one-statement
write on PostgreSQL), or releases it there with the chat's next state.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from typing import Any

from django.db import connections, transaction
from django.utils import timezone

from ..budgets.enforcement import ChatBudgets
from ..engine.store import RunClaim
from ..exceptions import CancelledError, ChatBusyError, LeaseLostError
from ..messages import ToolCallState
from ..process.cancel_notices import hear, stop_hearing
from .chat_row import ChatRow
from .configuration import Config
from .leases import UNREAD, Lease, attnames, claim_row, heartbeats, renewal
from .reconnect import retried
from .releases import Release, release_fields
from .writes import StepWrites, Values, landed_rows, run_statement, step_writes

__all__ = ["RunControl"]

logger = logging.getLogger("agentloop")

#: columns a run changes; any other column changed elsewhere means the configuration did.
_RUN_COLUMNS = frozenset(
    {
        "lease_token", "lease_expires_at", "state", "updated_at", "error", "error_detail",
        "attempts", "retry_at", "cancel_requested_at", "stop_reason",
    }
)  # fmt: skip


_UNSET: Any = object()


class RunControl(RunClaim):
    """The chat's claim (its lease) and the writes made under it; what a claim read on the
    way (the transcript, the cancel flag) and what the verb saw held for a person."""

    def __init__(
        self,
        row: ChatRow,
        config: Config,
        cancel_notice: threading.Event | None,
        send_next: Callable[[], None] | None,
        budgets: ChatBudgets,
        send_job: Callable[[str, str], None] | None,
    ) -> None:
        """``config`` is told when a claim finds the chat configured elsewhere;
        ``send_next`` sends the chat's next background job, ``send_job`` another chat's
        (see ``DjangoStore``); a release tells ``budgets`` the places it freed."""
        self.row = row
        self.config = config
        self.budgets = budgets
        self.send_job = send_job
        self.cancel_notice = cancel_notice
        self.send_next = send_next
        #: run by a worker's job (set by the job): a release queues the rest for it.
        self.background = False
        self.lease: Lease | None = None
        #: how the last released verb ended (workers read it to schedule what comes next).
        self.last_release: Release | None = None
        self._depth = 0
        #: the transcript, read with the claim (consumed by the verb's first read).
        self._prefetched: list[Any] | None = None
        #: the cancel flag read by the last write's lease renewal (a free checkpoint read).
        self._flag: Any = UNREAD
        #: keys of the calls this verb saw held for a person (read, or marked while it ran): a
        #: release as "waiting" looks at these, to wake the chat if one was decided meanwhile.
        self._held_calls: frozenset[Any] | set[Any] = frozenset()
        #: a transactional tool's transaction is open (``ToolCalls.run_in_transaction``).
        self.in_tool_transaction = False

    # -- what the claim read on the way ----------------------------------------------------
    def take_prefetched(self) -> list[Any] | None:
        """The transcript read with the claim, once (None: read it now)."""
        prefetched, self._prefetched = self._prefetched, None
        return prefetched

    def take_flag(self) -> Any:
        """The cancel flag the last write (or the claim) read, once; ``UNREAD`` if none."""
        flag, self._flag = self._flag, UNREAD
        return flag

    def forget_flag(self) -> None:
        self._flag = UNREAD

    def saw_held(self, keys: frozenset[Any] | set[Any]) -> None:
        """The calls the verb's transcript shows held for a person."""
        self._held_calls = keys

    def holds(self, key: Any) -> None:
        """A call this verb marked as held for a person."""
        self._held_calls = {*self._held_calls, key}

    # -- taking the claim ---------------------------------------------------------------------
    def adopt(self, lease: Lease, transcript: list[Any] | None = None) -> None:
        """Use a lease taken elsewhere (a job took it while loading the chat, and maybe read
        the transcript in the same round trip)."""
        self._prefetched = transcript
        self.lease = lease
        self._depth = 0
        self._taken(lease)

    def claim(self) -> bool:
        chat = self.row.chat
        if self.lease is not None:
            if self.lease.lost.is_set():
                raise LeaseLostError(f"The lease on chat {chat.pk} was lost.")
            if self._depth:
                return False  # a verb inside a verb: the outer one releases
            self._depth = 1
            return True
        row = self.row
        row.saved()
        read = row.transcript_read()
        claimed = claim_row(
            row.chat_model, chat.pk, using=row.db, state=None, prefetch=(read.sql, read.params)
        )
        if claimed is None:
            raise ChatBusyError(
                f"Chat {chat.pk} is busy: another process (a worker's job, another "
                "request) is running it. Try again when it is done, or cancel() its run."
            )
        lease, values, prefetched = claimed
        self._refresh(values)
        self._prefetched = None if prefetched is None else read.messages(prefetched)
        self.lease, self._depth = lease, 1
        self._taken(lease)
        return True

    def _taken(self, lease: Lease) -> None:
        self._held_calls = set()
        # The claim read the chat row a moment ago: its cancel flag serves the start checkpoint.
        self._flag = self.row.chat.cancel_requested_at
        lease.notice = self.cancel_notice
        heartbeats.start(lease)
        if self.cancel_notice is not None:
            hear(self.row.chat, self.cancel_notice)  # a cancel from anywhere sets the notice

    def _refresh(self, values: Any) -> None:
        """The chat as the claim read it: changes made by other processes are seen."""
        chat, configured = self.row.chat, False
        # Loaded columns are in the instance's dict (a deferred one is not: it is set).
        loaded = chat.__dict__
        for name, value in zip(attnames(self.row.chat_model, self.row.db), values, strict=True):
            if loaded.get(name, _UNSET) != value:
                setattr(chat, name, value)
                configured = configured or name not in _RUN_COLUMNS
        if configured:
            self.config.forget()

    # -- writing under the claim -----------------------------------------------------------
    def _lease_for_write(self, keep: bool = False) -> Lease | None:
        """The lease a write is made under; ``keep`` (a computed result's write) goes on
        with a lease given up only because the database was out of reach."""
        lease = self.lease
        if lease is not None and lease.lost.is_set() and not (keep and lease.unreachable):
            raise LeaseLostError(f"The lease on chat {self.row.chat.pk} was lost.")
        self._prefetched = None  # a transcript read with the claim is stale after a write
        return lease

    @contextmanager
    def writing(self, *, release: str | None = None) -> Iterator[None]:
        """A write transaction. Under a lease it first renews the lease (its row lock makes a
        would-be taker wait; a process that lost the chat writes nothing); with ``release``
        (the next move) the same first statement releases it instead."""
        lease = self._lease_for_write()
        with ExitStack() as stack:
            # The lease's statement comes first: a connection that dropped meanwhile (a long
            # tool, a stream) fails there, before anything of the transaction is written,
            # so it opens again on a new connection while the lease is valid.
            released = retried(lease, self.row.db, lambda: self._begin_write(stack, release))
            yield
        if released is not None:
            self._released(*released)

    def _begin_write(
        self, stack: ExitStack, release: str | None
    ) -> tuple[dict[str, Any], Release] | None:
        """Open the write transaction (kept open on ``stack``) and renew or release the lease
        in its first statement; the release's columns and outcome when it released."""
        # Inside a transactional tool's transaction a failed write fails all of it: no
        # savepoint of its own.
        atomic = transaction.atomic(using=self.row.db, savepoint=not self.in_tool_transaction)
        atomic.__enter__()
        try:
            released = self._lease_statement(release)
        except BaseException:
            atomic.__exit__(*sys.exc_info())
            raise
        stack.push(atomic)
        return released

    def _lease_statement(self, release: str | None) -> tuple[dict[str, Any], Release] | None:
        """A write's first statement: renew the lease (reading the cancel flag), or release it
        with the chat's next state; ``LeaseLostError`` when it is no longer ours."""
        lease = self.lease
        if lease is None:
            return None
        if release is None:
            self._flag = lease.ensure()
            return None
        fields, outcome = release_fields(self.row.chat, self.background, release, None)
        status = lease.release_unless_queued(**fields)
        if status == "lost":
            lease.lost.set()
            raise LeaseLostError(f"The lease on chat {self.row.chat.pk} was lost.")
        if status == "queued":  # a message came in meanwhile: answer it next
            fields, outcome = {**fields, "state": "queued"}, Release("queued")
        return fields, outcome

    def renew(self) -> None:
        """Renew the lease in the transaction open now (which its row lock then guards);
        ``LeaseLostError`` when it is no longer ours."""
        self._lease_for_write()
        self._lease_statement(None)

    def step_writes(self) -> StepWrites | None:
        """The one-statement writes, or None: no lease held, or not PostgreSQL."""
        return None if self.lease is None else step_writes(self.row)

    def at_once(
        self,
        writes: StepWrites,
        release: str | None,
        body: Callable[[str, Values], str],
        record: Any,
        *,
        keep: bool = False,
    ) -> list[Any]:
        """Run ``body``'s statement behind the lease's renewal (or release, with ``release``
        the next move); its rows. Raises ``LeaseLostError`` (nothing written) when the lease
        is no longer ours. On a dropped connection it runs again on a new one while the
        lease is valid, unless it committed after all (``record``, its message, is there;
        None: the statement is the same twice, as an UPDATE is). ``keep``, for a computed
        result: tried past the lease's expiry too, as long as no one took the chat
        (``reconnect.retried``); once it lands, the lease is held again."""
        lease = self._lease_for_write(keep)
        assert lease is not None  # noqa: S101 - step_writes checked it
        using = self.row.db
        released: tuple[dict[str, Any], Release] | None = None
        if release is not None:
            fields, outcome = release_fields(self.row.chat, self.background, release, None)
            columns = {"lease_token": "", "lease_expires_at": None, "updated_at": timezone.now()}
            columns.update(fields)
            names = tuple(sorted([name for name in columns if name != "state"]))
            guard = writes.release_sql(names)
            params = [*writes.release_params(names, columns), lease.chat_pk, lease.token]
            released = fields, outcome
        else:
            guard, params = renewal(lease)
        values = Values()
        sql = body(guard, values)
        sent = [time.monotonic()]  # when the try that wrote was sent (the renewal's base)
        connection = connections[using]  # this thread's (the same wrapper after a reconnect)
        if self.in_tool_transaction:
            # A transactional tool's: a failed write fails all of it (it rolls back).
            rows = run_statement(using, sql, params + values.params, connection)
        elif connection.in_atomic_block:
            # Inside a caller's transaction: a failed write must not break it.
            with transaction.atomic(using=using):
                rows = run_statement(using, sql, params + values.params, connection)
        else:  # one statement: its own transaction

            def run() -> list[Any]:
                # A renewal tried again pushes the expiry out from now, not from the first try.
                guard_params = params if released is not None else renewal(lease)[1]
                sent[0] = time.monotonic()
                return run_statement(using, sql, guard_params + values.params, connection)

            def landed() -> list[Any] | None:
                if record is None:
                    return None  # run again: it changes nothing more the second time
                return landed_rows(self.row, record, release is not None)

            rows = retried(lease, using, run, landed=landed, keep=keep)
        if not rows:
            lease.unreachable = False  # reached, and taken over
            lease.lost.set()
            raise LeaseLostError(f"The lease on chat {self.row.chat.pk} was lost.")
        if released is None:
            lease.held_again(sent[0])
            # The renewal read the cancel flag and a halt asked for elsewhere: free checkpoints.
            self._flag = lease.observe(rows[0][0], rows[0][1])
            return rows
        lease.forget()
        fields, outcome = released
        if rows[0][0] == "queued" and fields["state"] != "queued":
            # A message came in meanwhile: answer it next.
            fields, outcome = {**fields, "state": "queued"}, Release("queued")
        self._released(fields, outcome)
        return rows

    # -- giving up the claim ---------------------------------------------------------------
    def release(self, next_move: str | None, *, failure: BaseException | None = None) -> None:
        lease = self.lease
        if lease is not None:
            try:
                self._release(lease, next_move, failure)
            finally:
                if self.lease is lease:  # the release failed: this process lets it go anyway
                    self._forget_lease()
        released = self.last_release
        if released is None or released.state in ("lost", "unreachable"):
            return
        # Places of a chats-in-flight quota it freed (or that freed while it queued for one):
        # the next chats in line go.
        for chat_label, chat_key in self.budgets.released(released.state):
            if self.send_job is not None:
                self.send_job(chat_label, chat_key)

    def note_waiting(self, reason: str) -> None:
        with self.writing():
            self.row.update(waiting_for=reason[:200])

    def _release(self, lease: Lease, next_move: str | None, failure: BaseException | None) -> None:
        if isinstance(failure, LeaseLostError) or lease.lost.is_set():
            self._forget_lease()
            self.last_release = Release("unreachable" if lease.unreachable else "lost")
            return
        chat = self.row.chat
        fields, release = release_fields(chat, self.background, next_move, failure)
        if release.state == "failed" or release.retry_in is not None:
            log = logger.warning if release.state == "queued" else logger.error
            log("Chat %s: %s", chat.pk, release.error, exc_info=failure)
        unless_queued = failure is None or isinstance(failure, CancelledError)

        def give_up() -> str:
            if unless_queued:
                return lease.release_unless_queued(**fields)
            # A failure or a stop stays what it is; queued messages wait for the next run.
            return "released" if lease.release(**fields) else "lost"

        try:
            status = retried(
                lease, self.row.db, give_up, landed=lambda: self._released_after_all(lease, fields)
            )
        except LeaseLostError:
            status = "lost"
        if status == "queued":  # a message came in meanwhile: answer it next
            fields, release = {**fields, "state": "queued"}, replace(release, state="queued")
        if status != "lost":
            self._released(fields, release)
        else:
            self._forget_lease()
            self.last_release = Release("unreachable" if lease.unreachable else "lost")

    def _released_after_all(self, lease: Lease, fields: dict[str, Any]) -> str | None:
        """After a dropped connection: how a release that committed before its answer was
        lost ended ("released", or "queued" when a message came in), read back from the
        chat row; "lost" when another process holds the chat; None when the lease is still
        ours (nothing committed: try again)."""
        row = (
            self.row.chat_model._default_manager.using(self.row.db)
            .filter(pk=self.row.chat.pk)
            .values_list("lease_token", "state")
            .first()
        )
        if row is None or row[0] not in ("", lease.token):
            return "lost"
        if row[0] == lease.token:
            return None
        queued_instead = row[1] == "queued" and fields.get("state") != "queued"
        return "queued" if queued_instead else "released"

    def _released(self, fields: dict[str, Any], release: Release) -> None:
        """After the release's UPDATE: the chat object follows, and nothing is stranded."""
        self._applied(fields)
        self._forget_lease()
        release = self._wake_if_decided(release)
        if not self.background and release.state == "queued" and self.send_next is not None:
            self.send_next()  # handed back to the background (see claims.release_fields)
        self.last_release = release

    def release_with(self, **fields: Any) -> None:
        """End a verb that sets the chat's columns itself (a batch collecting an answer)."""
        lease = self.lease
        if lease is None:
            return
        try:
            if not lease.lost.is_set() and lease.release(**fields):
                self._applied(fields)
        finally:
            self._forget_lease()

    def _applied(self, fields: dict[str, Any]) -> None:
        chat = self.row.chat
        for name, value in fields.items():
            setattr(chat, name, value)
        chat.lease_token, chat.lease_expires_at = "", None

    def _forget_lease(self) -> None:
        if self.lease is not None:
            self.lease.forget()
            stop_hearing(self.cancel_notice)
        self.lease, self._depth = None, 0
        self._flag = UNREAD  # a flag read for this verb says nothing to the next

    def _wake_if_decided(self, release: Release) -> Release:
        """Released as waiting, but a person decided a call while the step ran (their own
        wake-up found the chat still held): queue it now, so the decision isn't stranded.

        Judged by the calls' states, not by comparing times: a decision committed before
        this check is seen here; one committed after it finds the chat released and wakes
        it itself. No clock (the approver's or ours) takes part."""
        if release.state != "waiting" or not self._held_calls:
            return release
        models, using = self.row.models, self.row.db
        decided = models.tool_call_model._default_manager.using(using).filter(
            pk__in=self._held_calls
        )
        if not decided.exclude(state=ToolCallState.WAITING).exists():
            return release
        woken = models.chat_model._default_manager.using(using).filter(
            pk=self.row.chat.pk, state="waiting", lease_token=""
        )
        if woken.update(state="queued", updated_at=timezone.now()):
            self.row.chat.state = "queued"
            return replace(release, state="queued")
        return release

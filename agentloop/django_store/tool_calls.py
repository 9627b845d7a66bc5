"""The Django store's tool-call rows: the conditional claim before a call runs, its result,
its wait for a person or a subagent, a person's decision, and the transaction a
transactional tool runs in (``ToolCalls``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from django.db import IntegrityError, OperationalError, connections, transaction
from django.db.models.functions import Now
from django.utils import timezone

from ..engine import ToolTransaction
from ..engine import store as parts
from ..exceptions import ConcurrentWriteError, DecisionConflictError, LeaseLostError
from ..messages import Message, ToolCall, ToolCallState
from .chat_row import ChatRow, outcomes_json
from .leases import Lease, heartbeats
from .reconnect import CONNECTION_ERRORS, discard, retried, unusable
from .run_control import RunControl
from .writes import GUARD, StepWrites, Values, inserted

__all__ = ["ToolCalls"]

T = TypeVar("T")


class ToolCalls(parts.ToolCalls, parts.Handoffs, parts.Transactions):
    """Writes of tool calls and their results, under ``control``'s claim."""

    def __init__(self, row: ChatRow, control: RunControl) -> None:
        self.row = row
        self.control = control
        self.chat = row.chat
        self.models = row.models

    def mark_tool_running(self, call: ToolCall) -> bool:
        lease = self.control.lease
        if lease is None:  # pragma: no cover - every verb runs under the claim
            raise LeaseLostError("Tool calls run only under the chat's claim.")
        if lease.lost.is_set():
            raise LeaseLostError(f"The lease on chat {self.chat.pk} was lost.")
        started_at = timezone.now()

        statement, values = self.models.start_call, [ToolCallState.RUNNING, started_at]
        if call.guardrails:  # written by the claim itself: no statement of their own
            statement = self.models.start_guarded_call
            values += [call.arguments, outcomes_json(call.guardrails)]

        def start() -> int:
            return int(
                statement.run(
                    self.row.db, values, [call.key, call.state], guard=(self.chat.pk, lease.token)
                )
            )

        def landed() -> int | None:
            # The claim committed before a dropped connection lost its answer: it is ours.
            rows = self.models.tool_call_model._default_manager.using(self.row.db).filter(
                pk=call.key, state=ToolCallState.RUNNING, started_at=started_at
            )
            return 1 if rows.exists() else None

        return bool(retried(lease, self.row.db, start, landed=landed))

    def run_in_transaction(
        self, call: ToolCall, work: Callable[[ToolTransaction], T]
    ) -> tuple[T, str]:
        """A transactional tool's run, on the chat's database (see
        ``Transactions.run_in_transaction``). The result's write renews the lease first, inside
        the transaction: a step whose lease was lost rolls back everything, the tool's writes
        included; one that still holds it locks the chat row until the commit, so no other
        process takes the chat in between."""
        lease = self.control.lease
        if lease is None:  # pragma: no cover - every verb runs under the claim
            raise LeaseLostError("Tool calls run only under the chat's claim.")
        using = self.row.db
        run = ToolTransaction(savepoint=lambda: transaction.atomic(using=using))
        #: the last try's result, standing for the run if its commit's answer was lost.
        done: list[T] = []

        def attempt() -> tuple[T, str]:
            done.clear()
            refused = self._attempt(lease, run, work, done)
            return done[0], refused

        def landed() -> tuple[T, str] | None:
            # The commit went through but its answer was lost: the result is there.
            rows = self.models.message_model._default_manager.using(using)
            if done and rows.filter(tool_call_id=call.key).exists():
                return done[0], ""
            return None

        return retried(lease, using, attempt, landed=landed)

    def _attempt(
        self,
        lease: Lease,
        run: ToolTransaction,
        work: Callable[[ToolTransaction], T],
        done: list[T],
    ) -> str:
        """One try of ``run_in_transaction``: "" when it committed, else why the database
        refused the commit."""
        using = self.row.db
        # SQLite has one writer for the whole file: the transaction takes that lock with the
        # lease's renewal, now, and keeps every other writer out until it ends (no one can
        # take the lease meanwhile). The heartbeat would only wait on that lock: it leaves
        # this lease alone until then. Elsewhere a row lock taken this early would stop the
        # heartbeat (its own connection) for as long as the tool runs: the lease is checked
        # at the end only, with the result.
        whole_file = connections[using].vendor == "sqlite"
        committing = lost = False
        try:
            with transaction.atomic(using=using):
                if whole_file:
                    heartbeats.stop(lease)
                    self.control.renew()
                self.control.in_tool_transaction = True
                try:
                    done.append(work(run))
                except BaseException:
                    # Looked at before the rollback: Django opens a new connection after it.
                    lost = unusable(using)
                    raise
                finally:
                    self.control.in_tool_transaction = False
                committing = True
        except IntegrityError as exc:
            # Constraints Django declares deferred (foreign keys) are checked at the commit: a
            # tool's row that breaks one fails the commit, and everything rolled back with it.
            if not committing:
                raise
            return f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
        except Exception as exc:
            if not lost and not (committing and isinstance(exc, CONNECTION_ERRORS)):
                raise
            # The connection was lost under the transaction (its statements after that fail
            # as a broken transaction), or at its commit, which may have committed or not:
            # closed here, the run is looked for and, if it isn't there, tried again.
            discard(using)
            if isinstance(exc, CONNECTION_ERRORS):
                raise
            raise OperationalError(
                f"The connection was lost during a transactional tool's run: {exc}"
            ) from exc
        finally:
            if whole_file and self.control.lease is lease and not lease.lost.is_set():
                heartbeats.start(lease)
        return ""

    def save_tool_result(
        self,
        call: ToolCall,
        message: Message,
        state: ToolCallState,
        error: str | None,
        *,
        release: str | None = None,
    ) -> Any:
        writes = self.control.step_writes()
        try:
            if writes is not None:
                return self._save_result_at_once(writes, call, message, state, error, release)
            with self.control.writing(release=release):
                record = self._tool_result(call, message, state, error)
        except IntegrityError as exc:
            raise ConcurrentWriteError(
                f"Tool call {call.id!r} ({call.name}) already has a result: "
                "another process answered it first."
            ) from exc
        return record

    def _tool_result(
        self, call: ToolCall, message: Message, state: ToolCallState, error: str | None
    ) -> Any:
        record = self.row.message_row(message, tool_call_id=call.key)
        self.models.message_insert.insert(record, self.row.db)
        self.models.finish_call.run(self.row.db, [state, error or "", timezone.now()], [call.key])
        message.key = record.pk
        return record

    def save_tool_guardrails(self, call: ToolCall) -> None:
        rows = self.models.tool_call_model.objects.filter(pk=call.key)
        judged = {"guardrails": outcomes_json(call.guardrails), "arguments": call.arguments}

        def update() -> None:  # the same twice: tried again as a whole on a dropped connection
            with self.control.writing():
                rows.update(**judged)

        retried(self.control.lease, self.row.db, update)

    def mark_tool_waiting(self, call: ToolCall, reason: str, question: str | None = None) -> None:
        # A decision made before this verb releases the chat wakes it (RunControl sees to it).
        self.control.holds(call.key)
        judged: dict[str, Any] = {}
        if call.guardrails:  # judged before it is held (a deferred call)
            judged = {"guardrails": outcomes_json(call.guardrails), "arguments": call.arguments}
        with self.control.writing():
            self.models.tool_call_model.objects.filter(pk=call.key).update(
                state=ToolCallState.WAITING,
                wait_reason=reason,
                question=question or "",
                waiting_since=Now(),  # the database's clock: the sweeper's timeout uses it
                **judged,
            )

    def record_handoff(self, call: ToolCall, handoff: dict[str, Any]) -> None:
        calls = self.models.tool_call_model._default_manager.using(self.row.db)
        with self.control.writing():
            calls.filter(pk=call.key).update(handoff=handoff)

    def record_decision(
        self, call: ToolCall, decision: str, *, by: Any, reason: str, result: Message | None
    ) -> Any:
        fields: dict[str, Any] = {
            "decision": decision,
            "decision_digest": call.arguments_digest(),
            "decision_reason": reason,
            "decided_by_id": getattr(by, "pk", None),
            "decided_at": timezone.now(),
        }
        if result is None:  # approved: the call runs at the next step
            fields["state"] = ToolCallState.PENDING
        if call.original_arguments is not None:
            # Edited by the approver: these run, bound by the digest; the model's are kept.
            fields.update(arguments=call.arguments, original_arguments=call.original_arguments)
        # Only while the call still waits (for this reason): of two racing decisions exactly
        # one changes the row; the other changes nothing and is told so.
        waiting = self.models.tool_call_model.objects.filter(
            pk=call.key, state=ToolCallState.WAITING, wait_reason=call.wait_reason or ""
        )
        try:
            with transaction.atomic(using=self.row.db):
                if not waiting.update(**fields):
                    raise DecisionConflictError(
                        f"Tool call {call.id!r} ({call.name}) is no longer waiting: another "
                        "decision (or the run) got there first. Nothing was changed."
                    )
                if result is None:
                    return None
                state = ToolCallState.FAILED if result.is_error else ToolCallState.SUCCEEDED
                return self._tool_result(call, result, state, None)
        except IntegrityError as exc:
            raise DecisionConflictError(
                f"Tool call {call.id!r} ({call.name}) already has a result."
            ) from exc

    def native_tool_call(self, call: ToolCall) -> Any:
        rows = self.models.tool_calls
        return rows.new(
            {
                rows.pk: call.key,
                "chat_id": self.chat.pk,
                "call_id": call.id,
                "name": call.name,
                "arguments": call.arguments,
                "state": call.state,
                "wait_reason": call.wait_reason or "",
                "question": call.question or "",
                "decision": call.decision or "",
            }
        )

    def _save_result_at_once(
        self,
        writes: StepWrites,
        call: ToolCall,
        message: Message,
        state: ToolCallState,
        error: str | None,
        release: str | None,
    ) -> Any:
        record = self.row.message_row(message, tool_call_id=call.key)

        def body(guard: str, values: Values) -> str:
            return writes.result(guard, values, record, state, error or "", call.key)

        # A computed result: written when the database comes back, never run again for it.
        rows = self.control.at_once(writes, release, body, record, keep=True)
        inserted(record, rows[0][GUARD], self.row.db)
        message.key = record.pk
        return record

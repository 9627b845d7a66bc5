"""The Django store's claim: one writer per chat, for every writing verb in any process.

A verb takes the chat's lease with one conditional UPDATE (``.leases``) unless a
worker's job already took it while loading the chat; it gives it up with one UPDATE that
also records how the verb ended (the chat's next state, a one-line error, the retry count).
"""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from ..conf import agentloop_settings
from ..engine.retries import backoff
from ..exceptions import (
    CancelledError,
    ChatBusyError,
    ConcurrentWriteError,
    LeaseLostError,
    LimitReachedError,
    PendingToolCallsError,
    ProviderError,
    ToolCallNotWaitingError,
)
from ..messages import ToolCallState
from .leases import UNREAD, Lease, attnames, claim_row, heartbeats
from .reconnect import is_connection_fault, retried

__all__ = ["ClaimMixin", "Release", "one_line"]

logger = logging.getLogger("agentloop")

#: the longest error a chat shows (one line).
_ERROR_CHARS = 500


def one_line(error: BaseException) -> str:
    """What a user may see of ``error``: its class and first line, no traceback or paths."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    line = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return line if len(line) <= _ERROR_CHARS else line[: _ERROR_CHARS - 1] + "…"


@dataclass(frozen=True)
class Release:
    """How the last verb ended: the state it left the chat in, and a retry's delay."""

    state: str
    retry_in: float | None = None
    error: str = ""


#: columns a run changes; any other column changed elsewhere means the configuration did.
_RUN_COLUMNS = frozenset(
    {
        "lease_token", "lease_expires_at", "state", "updated_at", "error", "error_detail",
        "attempts", "retry_at", "cancel_requested_at", "stop_reason",
    }
)  # fmt: skip


class ClaimMixin:
    """Taking and giving up the chat's lease (part of ``DjangoStore``)."""

    chat: Any
    chat_model: Any
    tool_call_model: Any
    background: bool
    _config: Any
    _flag_after_write: Any
    _prefetch: Any

    lease: Lease | None = None
    #: the transcript's raw rows, read with the claim (consumed by the verb's first read).
    _prefetched: list[Any] | None = None
    #: how the last released verb ended (workers read it to schedule what comes next).
    last_release: Release | None = None
    _depth = 0
    #: keys of the calls this verb saw held for a person (read, or marked while it ran): a
    #: release as "waiting" looks at these, to wake the chat if one was decided meanwhile.
    _held_calls: frozenset[Any] | set[Any] = frozenset()
    cancel_notice: Any
    send_next: Callable[[], None] | None

    @property
    def _db(self) -> str:
        return self.chat._state.db or "default"

    def adopt(self, lease: Lease, transcript: list[Any] | None = None) -> None:
        """Use a lease taken elsewhere (a job took it while loading the chat, and maybe read
        the transcript's raw rows in the same round trip)."""
        self._prefetched = transcript
        self.lease = lease
        self._depth = 0
        self._held_calls = set()
        # The claim read the chat row a moment ago: its cancel flag serves the start checkpoint.
        self._flag_after_write = self.chat.cancel_requested_at
        lease.notice = self.cancel_notice
        heartbeats.start(lease)

    def claim(self) -> bool:
        if self.lease is not None:
            if self.lease.lost.is_set():
                raise LeaseLostError(f"The lease on chat {self.chat.pk} was lost.")
            if self._depth:
                return False  # a verb inside a verb: the outer one releases
            self._depth = 1
            return True
        if self.chat.pk is None:
            self.chat.save()
        claimed = claim_row(
            self.chat_model, self.chat.pk, using=self._db, state=None, prefetch=self._prefetch()
        )
        if claimed is None:
            raise ChatBusyError(
                f"Chat {self.chat.pk} is busy: another process (a worker's job, another "
                "request) is running it. Try again when it is done, or cancel() its run."
            )
        lease, row, prefetched = claimed
        self._refresh(row)
        self._prefetched = prefetched
        self.lease, self._depth, self._held_calls = lease, 1, set()
        # The claim read the chat row a moment ago: its cancel flag serves the start checkpoint.
        self._flag_after_write = self.chat.cancel_requested_at
        lease.notice = self.cancel_notice
        heartbeats.start(lease)
        return True

    def _refresh(self, row: Any) -> None:
        """The chat as the claim read it: changes made by other processes are seen."""
        configured = False
        for name, value in zip(attnames(self.chat_model, self._db), row, strict=True):
            if getattr(self.chat, name, None) != value:
                setattr(self.chat, name, value)
                configured = configured or name not in _RUN_COLUMNS
        if configured:
            self._config = None

    def _begin_write(
        self, stack: ExitStack, release: str | None
    ) -> tuple[dict[str, Any], Release] | None:
        """Open the write transaction (kept open on ``stack``) and renew or release the lease
        in its first statement; the release's columns and outcome when it released."""
        atomic = transaction.atomic(using=self._db)
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
            self._flag_after_write = lease.ensure()
            return None
        fields, outcome = self._release_fields(release, None)
        status = lease.release_unless_queued(**fields)
        if status == "lost":
            lease.lost.set()
            raise LeaseLostError(f"The lease on chat {self.chat.pk} was lost.")
        if status == "queued":  # a message came in meanwhile: answer it next
            fields, outcome = {**fields, "state": "queued"}, Release("queued")
        return fields, outcome

    def release(self, next_move: str | None, *, failure: BaseException | None = None) -> None:
        lease = self.lease
        if lease is None:
            return
        try:
            self._release(lease, next_move, failure)
        finally:
            if self.lease is lease:  # the release failed: this process lets the chat go anyway
                self._forget_lease()

    def _release(self, lease: Lease, next_move: str | None, failure: BaseException | None) -> None:
        if isinstance(failure, LeaseLostError) or lease.lost.is_set():
            self._forget_lease()
            self.last_release = Release("unreachable" if lease.unreachable else "lost")
            return
        fields, release = self._release_fields(next_move, failure)
        if release.state == "failed" or release.retry_in is not None:
            log = logger.warning if release.state == "queued" else logger.error
            log("Chat %s: %s", self.chat.pk, release.error, exc_info=failure)
        unless_queued = failure is None or isinstance(failure, CancelledError)

        def give_up() -> str:
            if unless_queued:
                return lease.release_unless_queued(**fields)
            # A failure or a stop stays what it is; queued messages wait for the next run.
            return "released" if lease.release(**fields) else "lost"

        try:
            status = retried(
                lease, self._db, give_up, landed=lambda: self._released_after_all(lease, fields)
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
            self.chat_model._default_manager.using(self._db)
            .filter(pk=self.chat.pk)
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
            self.send_next()  # handed back to the background (see _release_fields)
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

    def _release_fields(
        self, next_move: str | None, failure: BaseException | None
    ) -> tuple[dict[str, Any], Release]:
        """The chat's columns after a verb, and what the worker should do next."""
        background = self.background
        if failure is None:
            # A verb called in-process on a chat queued for the background (its job found it
            # busy and left) hands the rest back to the background.
            handed_back = not background and self.chat.state == "queued"
            state = {
                "done": "idle",
                "wait": "waiting" if background else "idle",
                "tools": "queued" if background or handed_back else "idle",
                "generate": "queued" if background or handed_back else "idle",
            }.get(next_move or "done", "idle")
            fields: dict[str, Any] = {"state": state, "error": "", "attempts": 0}
            if next_move == "done":
                # A cancel that came as the turn finished has nothing left to stop.
                fields["cancel_requested_at"] = None
            return fields, Release(state)
        if isinstance(failure, CancelledError):
            return {"state": "idle", "attempts": 0}, Release("idle")
        if not isinstance(failure, Exception) or isinstance(
            failure, PendingToolCallsError | ConcurrentWriteError | ToolCallNotWaitingError
        ):
            # A refusal before anything was written, or the process being interrupted
            # (Ctrl-C): the chat did not fail; it is only let go.
            state = "idle" if self.chat.state == "running" else self.chat.state
            return {"state": state}, Release(state)
        if isinstance(failure, LimitReachedError):
            reason = failure.reason[:300]
            return {"state": "stopped", "stop_reason": reason, "attempts": 0}, Release("stopped")
        error = one_line(failure)
        detail = "".join(traceback.format_exception(failure))[-8000:]
        attempts = int(self.chat.attempts or 0) + 1
        retries = agentloop_settings.STEP_RETRIES
        # Transient: a provider's retryable error, or a database connection that dropped,
        # was refused or timed out (retried in the step itself while the lease held).
        transient = is_connection_fault(failure) or (
            isinstance(failure, ProviderError) and failure.retryable
        )
        if background and transient and attempts <= retries:
            delay = backoff(attempts - 1, getattr(failure, "retry_after", None))
            fields = {
                "state": "queued",
                "attempts": attempts,
                "retry_at": timezone.now() + timedelta(seconds=delay),
                "error": f"{error} (attempt {attempts} of {retries + 1}; retrying)"[:_ERROR_CHARS],
                "error_detail": detail,
            }
            return fields, Release("queued", retry_in=delay, error=fields["error"])
        if background and transient:
            error = f"Gave up after {attempts} attempts: {error}"[:_ERROR_CHARS]
        fields = {"state": "failed", "error": error, "error_detail": detail, "attempts": 0}
        return fields, Release("failed", error=error)

    def _applied(self, fields: dict[str, Any]) -> None:
        for name, value in fields.items():
            setattr(self.chat, name, value)
        self.chat.lease_token, self.chat.lease_expires_at = "", None

    def _forget_lease(self) -> None:
        if self.lease is not None:
            self.lease.forget()
        self.lease, self._depth = None, 0
        self._flag_after_write = UNREAD  # a flag read for this verb says nothing to the next

    def _wake_if_decided(self, release: Release) -> Release:
        """Released as waiting, but a person decided a call while the step ran (their own
        wake-up found the chat still held): queue it now, so the decision isn't stranded.

        Judged by the calls' states, not by comparing times: a decision committed before
        this check is seen here; one committed after it finds the chat released and wakes
        it itself. No clock (the approver's or ours) takes part."""
        if release.state != "waiting" or not self._held_calls:
            return release
        decided = self.tool_call_model._default_manager.using(self._db).filter(
            pk__in=self._held_calls
        )
        if not decided.exclude(state=ToolCallState.WAITING).exists():
            return release
        woken = self.chat_model._default_manager.using(self._db).filter(
            pk=self.chat.pk, state="waiting", lease_token=""
        )
        if woken.update(state="queued", updated_at=timezone.now()):
            self.chat.state = "queued"
            return replace(release, state="queued")
        return release

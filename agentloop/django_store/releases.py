"""How a verb ends: the chat's columns its release sets (the next state, a one-line error, the
retry count) and what the worker does next (``Release``). ``RunControl`` (``.run_control``)
takes and gives up the claim with them."""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.utils import timezone

from ..conf import agentloop_settings
from ..engine._effects import backoff
from ..exceptions import (
    CancelledError,
    ChatStoppedError,
    ConcurrentWriteError,
    EditError,
    PendingToolCallsError,
    PlaceWaiting,
    ProviderError,
    RateLimitWaiting,
    ToolCallNotWaitingError,
)
from .reconnect import is_connection_fault

__all__ = ["IN_LINE", "Release", "one_line", "release_fields"]

#: how ``waiting_for`` ends for a chat in line for a place of a chats-in-flight quota.
IN_LINE = "(waiting for a place)"
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


def release_fields(
    chat: Any, background: bool, next_move: str | None, failure: BaseException | None
) -> tuple[dict[str, Any], Release]:
    """The chat's columns after a verb (``background``: run by a worker's job), and what the
    worker should do next."""
    fields, release = _release_fields(chat, background, next_move, failure)
    if getattr(chat, "waiting_for", "") and "waiting_for" not in fields:
        fields["waiting_for"] = ""  # what it waited for came (or the run ended)
    return fields, release


def _release_fields(
    chat: Any, background: bool, next_move: str | None, failure: BaseException | None
) -> tuple[dict[str, Any], Release]:
    if isinstance(failure, RateLimitWaiting) and background:
        # Not a failure: the step comes back once the limit has room (no attempt counted).
        waiting: dict[str, Any] = {
            "state": "queued",
            "retry_at": timezone.now() + timedelta(seconds=failure.seconds),
            "waiting_for": failure.reason[:200],
            "error": "",
        }
        return waiting, Release("queued", retry_in=failure.seconds)
    if isinstance(failure, PlaceWaiting) and background:
        # Not a failure: in line for a place of a chats-in-flight quota, with no job in
        # flight; the chat that frees a place sends its job (agentloop.budgets.slots).
        in_line = {"state": "queued", "retry_at": None, "error": "",
                   "waiting_for": f"{failure.reason[:170]} {IN_LINE}"}  # fmt: skip
        return in_line, Release("queued")
    if failure is None:
        # A verb called in-process on a chat queued for the background (its job found it
        # busy and left) hands the rest back to the background.
        handed_back = not background and chat.state == "queued"
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
        failure,
        PendingToolCallsError | ConcurrentWriteError | ToolCallNotWaitingError | EditError,
    ):
        # A refusal before anything was written, or the process being interrupted
        # (Ctrl-C): the chat did not fail; it is only let go. A job's claim made it running;
        # an in-process verb's claim left the state as it was (a background run's included).
        state = "idle" if background and chat.state == "running" else chat.state
        return {"state": state}, Release(state)
    if isinstance(failure, ChatStoppedError):  # a limit, a guardrail's block
        reason = failure.reason[:300]
        return {"state": "stopped", "stop_reason": reason, "attempts": 0}, Release("stopped")
    error = one_line(failure)
    detail = "".join(traceback.format_exception(failure))[-8000:]
    attempts = int(chat.attempts or 0) + 1
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

"""One background job: take the chat's lease, run one ``step()``, say what comes next.

This is the logic of ``agentloop.tasks.step_chat`` (and of the embedded thread pool);
the task itself only turns the outcome into a re-enqueue or a retry.
"""

from __future__ import annotations

import logging
import random
import traceback
from dataclasses import dataclass
from typing import Any, Literal

from django.apps import apps

from ._cancel_notices import RedisCancelListener
from ._leases import Heartbeat, Lease
from .conf import agentloop_settings
from .engine.transcript import next_move
from .exceptions import (
    CancelledError,
    LeaseLostError,
    LimitReachedError,
    ProviderError,
)

__all__ = ["StepOutcome", "run_step"]

logger = logging.getLogger(__name__)

Action = Literal[
    "again",  # more to do: enqueue the next step
    "done",  # complete
    "waiting",  # held by a person or a subagent
    "busy",  # another worker holds the lease; it carries on
    "retry",  # transient provider error: try the same step later
    "failed",  # permanent error stored on the chat
    "cancelled",
    "stopped",  # a limit
    "lost",  # our lease was taken over mid-step; nothing was written after that
    "missing",  # the chat no longer exists
]


@dataclass(frozen=True)
class StepOutcome:
    """What one job did and what should happen next."""

    action: Action
    retry_in: float | None = None
    error: str = ""

    @property
    def enqueue_next(self) -> bool:
        return self.action == "again"


def _backoff(attempt: int, error: ProviderError) -> float:
    if error.retry_after is not None:
        return float(error.retry_after)
    base = float(agentloop_settings.RETRY_BACKOFF) * (2**attempt)
    return min(random.uniform(base / 2, base), float(agentloop_settings.RETRY_BACKOFF_MAX))  # noqa: S311


def _work_left(chat: Any) -> bool:
    return next_move(chat.conversation.store.load_transcript()) in ("tools", "generate")


def run_step(chat_id: Any, model_label: str = "agentloop.Chat", attempt: int = 0) -> StepOutcome:
    """Run one step of chat ``chat_id`` under its lease."""
    chat_model: Any = apps.get_model(model_label)
    lease = Lease.take(chat_model, chat_id)
    if lease is None:
        if not chat_model.objects.filter(pk=chat_id).exists():
            return StepOutcome("missing")
        return StepOutcome("busy")
    try:
        chat = chat_model.objects.get(pk=chat_id)
    except chat_model.DoesNotExist:  # deleted between the UPDATE and here
        return StepOutcome("missing")
    chat.conversation.store.lease = lease
    chat.conversation.store.background = True
    try:
        with Heartbeat(lease), RedisCancelListener(chat, chat.conversation.store.cancel_notice):
            chat.step(stream=_publisher(chat))
            transcript, requested_at = chat.conversation.store.read_for_step()
            move = next_move(transcript)
            action: Action = "done" if move == "done" else "waiting" if move == "wait" else "again"
            if action == "done":
                # As complete() does: a cancel that came as the turn finished is dropped.
                chat.conversation.drop_cancel_request(requested_at)
            outcome = StepOutcome(action)
    except LeaseLostError:
        logger.warning("Chat %s: lease lost mid-step; another worker continues", chat_id)
        return StepOutcome("lost")
    except CancelledError:
        lease.release(state="idle")
        return StepOutcome("cancelled")
    except LimitReachedError as exc:
        lease.release(state="stopped", stop_reason=exc.reason[:300])
        return StepOutcome("stopped", error=exc.reason)
    except ProviderError as exc:
        if exc.retryable:
            lease.release(state="queued", error=str(exc))
            return StepOutcome("retry", retry_in=_backoff(attempt, exc), error=str(exc))
        lease.release(state="failed", error=f"{type(exc).__name__}: {exc}")
        return StepOutcome("failed", error=str(exc))
    except Exception as exc:
        # Anything else (a bad tool path, a bug) fails the chat visibly instead of looping.
        logger.exception("Chat %s: step failed", chat_id)
        lease.release(state="failed", error="".join(traceback.format_exception(exc))[-4000:])
        return StepOutcome("failed", error=f"{type(exc).__name__}: {exc}")

    state = {"done": "idle", "waiting": "waiting", "again": "queued"}[outcome.action]
    if not lease.release(state=state, error=""):
        return StepOutcome("lost")
    if outcome.action != "again" and _work_left(chat):
        # A message arrived between our last read and the release (its own job found us
        # busy and left): carry on so it is not stranded.
        chat_model.objects.filter(pk=chat_id, lease_token="").update(state="queued")
        return StepOutcome("again")
    return outcome


def _publisher(chat: Any) -> Any:
    """The stream callback that forwards chunks to live pages (see agentloop.events)."""
    from .events import publish_chunk

    def forward(chunk: Any) -> None:
        publish_chunk(chat, chunk)

    return forward

"""The one job body: take the chat's lease and load it, run one step, send what comes next.

Every runner's worker calls :func:`run_job` (the Celery task ``agentloop.step_chat``, the
django.tasks task, the embedded thread pool). The job path is short by design: one statement
takes the lease and returns the chat row, one reads the transcript (with the cancel flag),
the step writes its rows, and its last write transaction releases the lease with the chat's
next state. The step's result says what comes next: no second read.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from django.apps import apps
from django.db import router

from ..conf import agentloop_settings
from ..django_store.database import transcript_read
from ..django_store.leases import claim
from ..django_store.reconnect import CONNECTION_ERRORS, discard
from ..django_store.releases import one_line
from ..engine._effects import backoff
from ..exceptions import CancelledError, ChatStoppedError, LeaseLostError, PlaceWaiting
from ..live_events import publish_chunk
from .enqueueing import send
from .runner import Job

__all__ = ["StepOutcome", "next_job", "run_job", "run_step"]

logger = logging.getLogger(__name__)

Action = Literal[
    "again",  # more to do: enqueue the next step
    "done",  # complete
    "waiting",  # held by a person or a subagent, or in line for a chats-in-flight place
    "busy",  # another process holds the lease; it carries on
    "retry",  # transient provider error: try the same step later (the chat counts attempts)
    "failed",  # permanent error (or too many attempts) stored on the chat
    "cancelled",
    "stopped",  # a limit
    "lost",  # our lease was taken over mid-step; nothing was written after that
    "missing",  # the chat no longer exists
    # the database could not be reached (at the start, or until the lease ran out): nothing
    # more was written; the job tries again later, counting in its own retries
    "unreachable",
    "skipped",  # the chat isn't queued any more (a duplicate job): nothing done
]

_BY_STATE: dict[str, Action] = {
    "idle": "done",
    "waiting": "waiting",
    "queued": "again",
    "stopped": "stopped",
    "failed": "failed",
    "lost": "lost",
    "unreachable": "unreachable",
}


@dataclass(frozen=True)
class StepOutcome:
    """What one job did and what should happen next."""

    action: Action
    retry_in: float | None = None
    error: str = ""

    @property
    def enqueue_next(self) -> bool:
        return self.action == "again"


def run_job(job: Job) -> StepOutcome:
    """One job: a step under the lease, then the next job sent (or this one again, later)."""
    outcome = run_step(*job.args)
    following = next_job(job, outcome)
    if following is not None:
        send(following)
    return outcome


def next_job(job: Job, outcome: StepOutcome) -> Job | None:
    """What a finished job sends: the next step, or a retry of this one (the chat counts
    its attempts and fails once ``STEP_RETRIES`` are used up). When the database could not
    be reached the job counts (``attempt``): after ``STEP_RETRIES`` such tries it stops and
    the sweeper finds the chat later."""
    chat_id, model_label = job.chat_id, job.model_label
    if outcome.enqueue_next:
        return Job(chat_id, model_label)
    if outcome.action == "retry":
        return Job(chat_id, model_label, countdown=outcome.retry_in)
    if outcome.action != "unreachable":
        return None
    if job.attempt < agentloop_settings.STEP_RETRIES:
        return Job(chat_id, model_label, countdown=outcome.retry_in, attempt=job.attempt + 1)
    logger.error(
        "Chat %s: the database could not be reached in %d tries (%s); the job stops "
        "and the sweeper (resume_stalled_chats) enqueues the chat again",
        chat_id, job.attempt + 1, outcome.error,
    )  # fmt: skip
    return None


def run_step(chat_id: Any, model_label: str = "agentloop.Chat", attempt: int = 0) -> StepOutcome:
    """Run one step of chat ``chat_id`` under its lease; what happened (nothing is sent).

    ``attempt`` counts this job's tries after the database could not be reached (the chat
    row can't count those); other retries are counted on the chat row, so re-enqueues (the
    sweeper's too) can't reset them.
    """
    chat_model: Any = apps.get_model(model_label)
    using = router.db_for_write(chat_model)
    try:
        # The transcript is read in the claim's round trip where the database allows it.
        read = transcript_read(chat_model, using, chat_id)
        prefetch = (read.sql, read.params)
        claimed = claim(chat_model, chat_id, using=using, prefetch=prefetch, in_flight=True)
        if claimed is None:
            state = chat_model._default_manager.filter(pk=chat_id).values_list("state", flat=True)
            found = state.first()
            if found is None:
                return StepOutcome("missing")
            return StepOutcome("busy" if found in ("queued", "running") else "skipped")
    except CONNECTION_ERRORS as exc:
        # Refused, dropped, or no connection from the pool in time: nothing was taken.
        discard(using)
        logger.warning("Chat %s: the database could not be reached to start a step: %s",
                       chat_id, one_line(exc))  # fmt: skip
        wait = backoff(attempt, outage=True)
        return StepOutcome("unreachable", retry_in=wait, error=one_line(exc))
    lease, chat, fetched = claimed
    transcript = None if fetched is None else read.messages(fetched)
    outcome = _advance(chat, lease, transcript, chat.updated_at)
    if outcome.action == "unreachable":
        # Given up before the lease ran out: the next job can take the chat once it has.
        wait = max(backoff(attempt, outage=True), lease.remaining + 0.1)
        return StepOutcome("unreachable", retry_in=wait, error=outcome.error)
    return outcome


def _advance(chat: Any, lease: Any, transcript: Any, claimed_at: Any) -> StepOutcome:
    """The step itself, on the chat and lease the job's claim took (at ``claimed_at``, the
    ``updated_at`` the claim wrote)."""
    conversation = chat.conversation
    store = conversation.store
    store.runs.background = True
    store.runs.adopt(lease, transcript)
    try:
        return _advanced(chat, store, conversation, claimed_at)
    finally:
        # However the step ended (its release failed too, say), its lease is not renewed
        # any more: it expires, or was released.
        lease.forget()


def _advanced(chat: Any, store: Any, conversation: Any, claimed_at: Any) -> StepOutcome:
    """What the step's end means for the job (the store recorded it on the chat)."""
    chat_id = chat.pk
    try:
        # The store hears the chat's cancels from its claim on (``cancel_notices.hear``).
        result = conversation.advance(stream=_publisher(chat))
    except LeaseLostError:
        if store.runs.last_release is not None and store.runs.last_release.state == "unreachable":
            logger.warning("Chat %s: the database could not be reached in time; the step "
                           "wrote nothing more and is tried again", chat_id)  # fmt: skip
            return StepOutcome("unreachable")
        return _after_a_lost_lease(type(chat), chat_id, claimed_at)
    except CancelledError:
        release = store.runs.last_release
        if release is not None and release.state == "queued":
            return StepOutcome("again")  # a message queued to interrupt it is answered next
        return StepOutcome("cancelled")
    except ChatStoppedError as exc:  # a limit, a guardrail's block
        return StepOutcome("stopped", error=exc.reason)
    except PlaceWaiting:
        # In line for a chats-in-flight place: no job until one frees (its holder sends it).
        return StepOutcome("waiting")
    except Exception:
        # The store released the chat as failed (or queued for a retry) with a one-line
        # error; the traceback went to the log.
        release = store.runs.last_release
        if release is None:  # pragma: no cover - a failure before the claim was adopted
            raise
        action = _BY_STATE.get(release.state, "failed")
        if action == "again":
            return StepOutcome("retry", retry_in=release.retry_in, error=release.error)
        return StepOutcome(action, error=release.error)
    release = store.runs.last_release
    if release is None:  # pragma: no cover - every verb releases what it claimed
        return StepOutcome("again" if result.next_move in ("tools", "generate") else "done")
    if release.state == "lost":
        return _after_a_lost_lease(type(chat), chat_id, claimed_at)
    return StepOutcome(_BY_STATE.get(release.state, "done"))


def _after_a_lost_lease(chat_model: Any, chat_id: Any, claimed_at: Any) -> StepOutcome:
    """Our lease is gone and this job wrote nothing after that. Usually another worker took
    the chat over, or a person freed it (``agentloop unlock``), and its next job carries on.
    But a claim the database lost (a crash before its commit reached the disk) leaves the
    chat in flight with no lease at all: send its next job now rather than leave it to the
    sweeper.

    Told apart by the row's ``updated_at``: a lost claim leaves it no newer than the one
    the claim wrote (``claimed_at``); a release, a takeover or an unlock since writes a
    newer one (an unlock, and every claim on PostgreSQL, by the database's clock)."""
    try:
        orphaned = chat_model._default_manager.filter(
            pk=chat_id,
            lease_token="",
            state__in=("queued", "running"),
            # A microsecond on: SQLite compares the stored text, which the claim wrote
            # with its time zone and the ORM without.
            updated_at__lt=claimed_at + timedelta(microseconds=1),
        ).exists()
    except CONNECTION_ERRORS:
        orphaned = False  # the sweeper finds it if so
    if orphaned:
        logger.warning(
            "Chat %s: the database lost this job's claim; sending its step again", chat_id
        )
        return StepOutcome("again")
    logger.warning(
        "Chat %s: lease lost mid-step (taken over, or freed by hand); this job writes "
        "nothing more and the chat's next job carries on",
        chat_id,
    )
    return StepOutcome("lost")


def _publisher(chat: Any) -> Any:
    """The stream callback that forwards chunks to live pages (see agentloop.live_events)."""

    def forward(chunk: Any) -> None:
        publish_chunk(chat, chunk)

    return forward

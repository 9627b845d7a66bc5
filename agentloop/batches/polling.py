"""Polling: refreshing open batches, cancelling them, and putting each result into its chat."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from django.db import transaction
from django.utils import timezone

from ..django_store.leases import claim
from ..django_store.releases import one_line
from ..engine._transcript_reading import next_move
from ..engine.store import UsageRecord
from ..exceptions import (
    BatchError,
    BatchItemNotRunError,
    CancelledError,
    LeaseLostError,
    ProviderError,
)
from ..messages import ModelResponse
from ..models import Batch, BatchItem, BatchItemStatus, BatchStatus, Chat, ChatState
from ..providers.batch_apis import BatchAPI, BatchInfo, batch_api
from . import records, submitting

__all__ = ["cancel", "poll", "refresh"]

logger = logging.getLogger(__name__)


# -- polling ---------------------------------------------------------------------------------
def poll() -> list[Batch]:
    """Refresh every open batch of chats (the periodic task and the management command call
    this; an eval run's batches are ``agentloop.evals.batch_rounds.poll``'s)."""
    batches = Batch.objects.open().filter(eval_run__isnull=True).order_by("created_at")
    return records.refresh_each(batches, refresh)


def refresh(batch: Batch) -> Batch:
    """Poll the provider for ``batch``; collect its results once it has ended.

    Does nothing while another process holds the batch (it is polling it). An eval run's
    batch is refused (``agentloop.evals.batch_rounds.refresh`` collects it into its cases).
    """
    if batch.eval_run_id is not None:
        raise BatchError(
            f"Batch #{batch.pk} holds eval run {batch.eval_run_id}'s requests: "
            "agentloop.evals.batch_rounds.refresh polls it."
        )
    return records.poll(batch, resend=_resend, collect=_collect, before=_release_cancelled_chats)


def cancel(batch: Batch) -> Batch:
    """Ask the provider to stop ``batch``. Requests it never ran are marked ``not_run`` when
    the batch is collected; their chats stay as they were, awaiting the model."""
    if batch.collected_at is not None or batch.status in (
        BatchStatus.CANCELLING,
        BatchStatus.CANCELLED,
    ):
        return batch
    if batch.status == BatchStatus.CREATED:
        if records.claim(batch):
            try:
                records.update(batch, status=BatchStatus.CANCELLED, collected_at=timezone.now())
                batch.items.filter(status=BatchItemStatus.PENDING).update(
                    status=BatchItemStatus.NOT_RUN,
                    error="The batch was cancelled before it was sent.",
                    finished_at=timezone.now(),
                )
            finally:
                records.release(batch)
        return batch
    info = records.api_of(batch).cancel(batch.provider_batch_id)
    if info is not None:
        records.update(batch, **records.counts(info))
    else:
        records.update(batch, status=BatchStatus.CANCELLING)
    return batch


def _resend(batch: Batch, api: BatchAPI) -> None:
    """Send a batch recorded but not sent, with the chats still awaiting that call."""
    _release_cancelled_chats(batch, api, sent=False)
    batch.items.filter(status=BatchItemStatus.PENDING, cancelled_at__isnull=False).update(
        status=BatchItemStatus.CANCELLED,
        error="The chat was cancelled before the batch was sent.",
        finished_at=timezone.now(),
    )
    pairs = []
    for item in batch.items.filter(status=BatchItemStatus.PENDING).select_related("chat"):
        chat = item.chat
        transcript = chat.conversation.store.transcript.load_transcript()
        latest = transcript[-1].key if transcript else None
        if next_move(transcript) != "generate" or latest != item.after_message_id:
            records.finish(
                item, BatchItemStatus.DISCARDED, "The chat moved on before the batch was sent."
            )
            continue
        prepared = chat.conversation.prepare_model_call(transcript, check_limits=False)
        pairs.append((item, submitting.Call(chat, prepared, latest)))
    if not pairs:
        records.update(batch, status=BatchStatus.CANCELLED, collected_at=timezone.now())
        return
    submitting.send_or_leave(batch, api, pairs)


# -- cancelled chats -------------------------------------------------------------------------
def _release_cancelled_chats(batch: Batch, api: BatchAPI, *, sent: bool = True) -> None:
    """Chats cancelled while their request waits are released now: the cancel is recorded
    (as a run's checkpoint would) and their answer will be discarded when it comes."""
    waiting = batch.items.filter(
        status=BatchItemStatus.PENDING,
        cancelled_at__isnull=True,
        chat__cancel_requested_at__isnull=False,
    ).select_related("chat")
    for item in waiting:
        _release_cancelled_chat(item)
    still_wanted = batch.items.filter(status=BatchItemStatus.PENDING, cancelled_at__isnull=True)
    if sent and waiting and not still_wanted.exists():
        # Nobody waits for any answer of this batch any more: stop paying for it.
        info = api.cancel(batch.provider_batch_id)
        records.update(
            batch, **(records.counts(info) if info else {"status": BatchStatus.CANCELLING})
        )


def _release_cancelled_chat(item: BatchItem) -> None:
    prior = item.chat.state
    chat = _claim(item)
    if chat is None:
        return  # a run holds the chat and sees the cancel itself; we try again next poll
    conversation = chat.conversation
    try:
        requested_at = conversation.store.stopping.cancel_requested_at()
        if requested_at is None:
            return
        with transaction.atomic():
            marked = BatchItem.objects.filter(pk=item.pk, cancelled_at__isnull=True).update(
                cancelled_at=timezone.now()
            )
            if marked:
                conversation.record_cancel(CancelledError(requested_at=requested_at))
    finally:
        conversation.store.runs.release_with(
            state=prior if prior != ChatState.RUNNING else ChatState.IDLE
        )


def _claim(item: BatchItem) -> Any:
    """The item's chat, loaded by taking its lease (one statement), or None while a run
    holds it. Collecting is one verb: what runs inside it (tools) nests in its claim."""
    claimed = claim(type(item.chat), item.chat_id)
    if claimed is None:
        return None
    lease, chat, _ = claimed
    store = chat.conversation.store
    store.runs.adopt(lease)
    store.runs.claim()
    return chat


# -- collecting ------------------------------------------------------------------------------
def _collect(batch: Batch, api: BatchAPI, info: BatchInfo) -> None:
    """Put each result into its chat; chats that asked for tools run them and go on."""
    pending = list(batch.items.filter(status=BatchItemStatus.PENDING).select_related("chat"))
    results = records.outcomes(batch, api, info, (item.custom_id for item in pending))
    continuing: list[int] = []
    left = 0
    for item in pending:
        outcome = _apply(batch, api, item, results[item.custom_id])
        if outcome is None:
            left += 1
        elif outcome == "continue":
            continuing.append(item.chat_id)
    if not left:
        records.update(batch, collected_at=timezone.now())
    if continuing:
        _continue(batch, continuing)


def _apply(batch: Batch, api: BatchAPI, item: BatchItem, result: Any) -> str | None:
    """One result into its chat. Returns "continue" when the chat goes into the next batch,
    "done" otherwise, None when its chat is busy (the item stays pending for the next poll)."""
    if item.cancelled_at is not None:
        # Its chat was released when it was cancelled: the answer is only accounted for.
        if records.finish(item, BatchItemStatus.CANCELLED, "The chat was cancelled in the batch."):
            _record_discarded(batch, api, item, item.chat, result, "the chat was cancelled")
        return "done"
    prior = item.chat.state
    chat = _claim(item)
    if chat is None:
        return None
    conversation = chat.conversation
    store = conversation.store
    release: dict[str, Any] = {"state": prior if prior != ChatState.RUNNING else ChatState.IDLE}
    then = "done"
    try:
        transcript = store.transcript.load_transcript()
        requested_at = store.stopping.cancel_requested_at()
        latest = transcript[-1].key if transcript else None
        if requested_at is not None:
            with transaction.atomic():
                if records.finish(
                    item,
                    BatchItemStatus.CANCELLED,
                    "The chat was cancelled in the batch.",
                    cancelled_at=timezone.now(),
                ):
                    usage = _discarded_usage(batch, api, item, result, "the chat was cancelled")
                    conversation.record_cancel(
                        CancelledError(requested_at=requested_at), usage=usage
                    )
        elif next_move(transcript) != "generate" or latest != item.after_message_id:
            if records.finish(
                item, BatchItemStatus.DISCARDED, "The chat moved on before the answer."
            ):
                _record_discarded(batch, api, item, chat, result, "the chat moved on")
        elif isinstance(result, BatchItemNotRunError):
            records.finish(item, BatchItemStatus.NOT_RUN, str(result))
        elif isinstance(result, ProviderError):
            text = f"{type(result).__name__}: {result}"
            with transaction.atomic():
                if records.finish(item, BatchItemStatus.FAILED, text):
                    store.transcript.record_usage(
                        UsageRecord(batch.provider, item.model, "failed", error=text)
                    )
                    release = {"state": ChatState.FAILED, "error": f"Batch #{batch.pk}: {text}"}
        else:
            then = _answer(batch, api, item, chat, transcript, result)
            state = ChatState.WAITING if then == "wait" else ChatState.IDLE
            release = {"state": state, "error": ""}
    except LeaseLostError:
        logger.warning("Chat %s: lease lost while collecting batch %s", item.chat_id, batch.pk)
        return "done"
    except CancelledError:
        then = "done"  # cancelled while its tools ran: recorded by the engine
    except Exception as exc:
        logger.exception("Chat %s: collecting its batch answer failed", item.chat_id)
        release = {"state": ChatState.FAILED, "error": one_line(exc)}
        then = "done"
    finally:
        store.runs.release_with(**release)
    if then == "complete_later":
        chat.complete_later()
    return "continue" if then == "continue" else "done"


def _answer(
    batch: Batch,
    api: BatchAPI,
    item: BatchItem,
    chat: Any,
    transcript: list[Any],
    response: ModelResponse,
) -> str:
    """Append the answer as generate() does; run the tools it asks for; say what's next."""
    conversation = chat.conversation
    prepared = replace(
        conversation.prepare_model_call(transcript, check_limits=False),
        provider=api.provider,
        provider_name=batch.provider,
        model_id=item.model,
    )
    waited = timezone.now() - (batch.submitted_at or item.created_at)
    with transaction.atomic():
        if not records.finish(item, BatchItemStatus.SUCCEEDED):
            return "done"
        record = conversation.accept_response(
            prepared,
            response,
            cost=api.cost(item.model, response.usage),
            duration_ms=int(waited.total_seconds() * 1000),
        )
        BatchItem.objects.filter(pk=item.pk).update(message=record)
    move = next_move(transcript)
    if move == "tools":
        chat.run_tools()  # nested in the collection's claim (its heartbeat keeps the lease)
        move = next_move(conversation.store.transcript.load_transcript())
    if move == "wait":
        return "wait"
    if move == "generate":
        return "continue" if batch.auto_continue else "complete_later"
    return "done"


def _discarded_usage(
    batch: Batch, api: BatchAPI, item: BatchItem, result: Any, why: str
) -> UsageRecord | None:
    """The usage row of an answer that is not appended (the tokens were spent all the same)."""
    if not isinstance(result, ModelResponse):
        return None
    return UsageRecord(
        provider=batch.provider,
        model=item.model,
        status="cancelled",
        usage=result.usage,
        cost=api.cost(item.model, result.usage),
        error=f"Batch #{batch.pk}: answer discarded, {why}.",
    )


def _record_discarded(
    batch: Batch, api: BatchAPI, item: BatchItem, chat: Any, result: Any, why: str
) -> None:
    usage = _discarded_usage(batch, api, item, result, why)
    if usage is not None:
        chat.conversation.store.transcript.record_usage(usage)


# -- the next round --------------------------------------------------------------------------
def _continue(batch: Batch, chat_ids: list[int]) -> None:
    """Chats whose tools ran go into the next batch (one per provider, and per model where
    the provider's batches hold one); a provider error leaves it to the next poll."""
    calls, problems = submitting.prepare(list(Chat.objects.filter(pk__in=chat_ids).order_by("pk")))
    for chat, reason in problems:
        logger.info("Chat %s does not go into the next batch: it %s", chat.pk, reason)
    for group in submitting.grouped(calls, lambda call: call.prepared.provider_name).values():
        api = batch_api(group[0].prepared.provider)
        if api is None:
            for call in group:
                call.chat.complete_later()
            continue
        rounds = [group] if api.mixed_models else list(submitting.grouped(group, _model).values())
        for calls_of_round in rounds:
            _send_next(batch, api, calls_of_round)


def _model(call: submitting.Call) -> str:
    return call.prepared.model_id


def _send_next(previous: Batch, api: BatchAPI, calls: list[submitting.Call]) -> None:
    batch, items = submitting.create(calls, auto_continue=True, previous=previous)
    try:
        submitting.send_or_leave(batch, api, list(zip(items, calls, strict=True)))
    finally:
        records.release(batch)

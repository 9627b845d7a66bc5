"""Batches: the next model call of many chats as one provider batch (DESIGN §8).

``submit(chats)`` (``agentloop.batch``) builds each chat's request exactly as ``generate()``
would (``Conversation.prepare_model_call``), sends them as one batch and records it as a
:class:`~agentloop.models.Batch` with one :class:`~agentloop.models.BatchItem` per chat.
``poll()`` (the ``agentloop.poll_batches`` task, ``manage.py agentloop batches``) refreshes
every open batch; once the provider has ended one, each answer is appended to its chat as
``generate()`` appends it (``Conversation.accept_response``: same message rows, callbacks,
signals, a usage row priced at the batch price). Then, per chat:

- an answer that asks for tools: the tools run here (``run_tools()``), and the chat goes
  into the next batch (``auto_continue=True``) or back to the normal loop
  (``complete_later()``);
- a failed request: a failed usage row, and the chat is marked failed with the error;
- a chat cancelled while its request waited: it is released at the next poll (the cancel is
  recorded as usual) and its answer, when it comes, is only accounted for, never appended;
- a chat that moved on meanwhile (another answer came first): the answer is discarded.

Writes to a chat happen under its lease (one writer per chat), and each item moves out of
``pending`` with a conditional UPDATE in the transaction that writes its outcome, so two
pollers never append the same answer twice.
"""

from __future__ import annotations

import logging
import secrets
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from . import providers
from .engine.conversation import PreparedCall
from .engine.store import UsageRecord
from .engine.transcript import next_move
from .exceptions import (
    BatchError,
    BatchItemNotRunError,
    CancelledError,
    ConfigurationError,
    LeaseLostError,
    LimitReachedError,
    ProviderError,
)
from .leases import Heartbeat, Lease
from .messages import ModelResponse
from .models import Batch, BatchItem, BatchItemStatus, BatchStatus, Chat, ChatState
from .providers.batches import CANCELLED, EXPIRED, FAILED, BatchAPI, BatchInfo, batch_api

__all__ = ["CLAIM_SECONDS", "cancel", "poll", "refresh", "submit"]

logger = logging.getLogger(__name__)

#: how long one poller may hold a batch before another may take it over.
CLAIM_SECONDS = 600

_NOT_AWAITING = {
    "done": "is not awaiting the model: its last answer asked for nothing more",
    "tools": "is not awaiting the model: it has tool calls to run first (run_tools())",
    "wait": "is not awaiting the model: it waits for a person or a subagent",
}


@dataclass
class _Call:
    """A chat ready to go into a batch: its prepared call and its latest message."""

    chat: Any
    prepared: PreparedCall
    after_message_id: Any


# -- submitting ------------------------------------------------------------------------------
def submit(chats: Iterable[Any], *, auto_continue: bool = False) -> Batch:
    """Send the next model call of ``chats`` as one provider batch; returns its ``Batch``.

    Every chat must be a saved ``Chat`` awaiting the model (its last message is from the
    user or a tool), not running in the background, not in another open batch and without a
    pending cancel; all must use one provider, and one model unless the provider's batches
    mix models (Anthropic's do). Otherwise :class:`~agentloop.exceptions.BatchError` names
    the chats and why, and nothing is sent. A provider error while sending is raised after
    the batch is recorded as failed.
    """
    chats = list(chats)
    if not chats:
        raise BatchError("No chats to batch.")
    calls, problems = _prepare(chats)
    if problems:
        lines = "\n".join(f"- chat {_label(chat)} {reason}" for chat, reason in problems)
        raise BatchError(f"{len(problems)} chat(s) can't go into a batch:\n{lines}")
    api = _check_one_batch(calls)
    batch, items = _create(calls, auto_continue=auto_continue, previous=None)
    try:
        _send(batch, api, [(item, call) for item, call in zip(items, calls, strict=True)])
    except Exception as exc:
        _fail_unsent(batch, exc)
        raise
    finally:
        _release(batch)
    return batch


def _label(chat: Any) -> str:
    pk = getattr(chat, "pk", None)
    return f"#{pk}" if pk is not None else repr(chat)


def _prepare(chats: list[Any]) -> tuple[list[_Call], list[tuple[Any, str]]]:
    """Each chat's prepared call, or why it can't go into a batch (limits are checked here:
    a chat at its limit is recorded as stopped, as ``generate()`` would)."""
    saved = [chat for chat in chats if isinstance(chat, Chat) and chat.pk is not None]
    ids = [chat.pk for chat in saved]
    fresh = {pk: (state, cancel) for pk, state, cancel in Chat.objects.filter(pk__in=ids)
             .values_list("pk", "state", "cancel_requested_at")}  # fmt: skip
    in_batches = dict(
        BatchItem.objects.filter(
            chat_id__in=ids, status=BatchItemStatus.PENDING, cancelled_at__isnull=True
        ).values_list("chat_id", "batch_id")
    )
    calls: list[_Call] = []
    problems: list[tuple[Any, str]] = []
    for chat in chats:
        if not isinstance(chat, Chat):
            problems.append((chat, "is not a persisted agentloop.models.Chat"))
            continue
        if chat.pk is None or chat.pk not in fresh:
            problems.append((chat, "is not saved"))
            continue
        state, cancel_requested_at = fresh[chat.pk]
        if chat.pk in in_batches:
            problems.append((chat, f"is already in batch #{in_batches[chat.pk]}"))
            continue
        if cancel_requested_at is not None:
            problems.append((chat, "has a cancel request pending"))
            continue
        if state in (ChatState.QUEUED, ChatState.RUNNING):
            problems.append((chat, f"is {state} in the background"))
            continue
        conversation = chat.conversation
        transcript = conversation.store.load_transcript()
        move = next_move(transcript)
        if move != "generate":
            problems.append((chat, _NOT_AWAITING[move]))
            continue
        try:
            prepared = conversation.prepare_model_call(transcript)
        except LimitReachedError as exc:
            problems.append((chat, f"is stopped by a limit: {exc.reason}"))
            continue
        except ConfigurationError as exc:
            problems.append((chat, f"can't make its request: {exc}"))
            continue
        calls.append(_Call(chat, prepared, transcript[-1].key if transcript else None))
    return calls, problems


def _chat_list(calls: list[_Call]) -> str:
    ids = ", ".join(_label(call.chat) for call in calls)
    return f"chat {ids}" if len(calls) == 1 else f"chats {ids}"


def _by(calls: list[_Call], key: Any) -> dict[str, list[_Call]]:
    groups: dict[str, list[_Call]] = defaultdict(list)
    for call in calls:
        groups[key(call)].append(call)
    return groups


def _check_one_batch(calls: list[_Call]) -> BatchAPI:
    """The provider's batch API, when the calls can be one batch of it; else BatchError."""
    by_provider = _by(calls, lambda call: call.prepared.provider_name)
    if len(by_provider) > 1:
        found = "; ".join(f"{name} ({_chat_list(group)})" for name, group in by_provider.items())
        raise BatchError(f"One provider per batch; these chats use {found}.")
    first = calls[0].prepared
    api = batch_api(first.provider)
    if api is None:
        raise BatchError(
            f"Provider {first.provider_name!r} has no batch API (the OpenAI, Anthropic and "
            "Gemini providers have one)."
        )
    by_model = _by(calls, lambda call: call.prepared.model_id)
    if len(by_model) > 1 and not api.mixed_models:
        found = "; ".join(f"{model} ({_chat_list(group)})" for model, group in by_model.items())
        raise BatchError(
            f"A {first.provider_name} batch holds one model; these chats use {found}. "
            "Send one batch per model."
        )
    by_headers = _by(calls, lambda call: repr(sorted(call.prepared.request.headers.items())))
    if len(by_headers) > 1:
        raise BatchError(
            "The chats of one batch must send the same headers (with_headers); these differ: "
            + "; ".join(_chat_list(group) for group in by_headers.values())
        )
    return api


def _create(
    calls: list[_Call], *, auto_continue: bool, previous: Batch | None
) -> tuple[Batch, list[BatchItem]]:
    """The batch and its items, claimed by this process until they are sent."""
    models = {call.prepared.model_id for call in calls}
    now = timezone.now()
    with transaction.atomic():
        batch = Batch.objects.create(
            provider=calls[0].prepared.provider_name,
            model=models.pop() if len(models) == 1 else "",
            auto_continue=auto_continue,
            previous=previous,
            request_count=len(calls),
            claim_token=secrets.token_hex(16),
            claimed_until=now + timedelta(seconds=CLAIM_SECONDS),
        )
        items = BatchItem.objects.bulk_create(
            [
                BatchItem(
                    batch=batch,
                    chat_id=call.chat.pk,
                    custom_id=str(index),  # positional ids fit every vendor's rules
                    model=call.prepared.model_id,
                    after_message_id=call.after_message_id,
                )
                for index, call in enumerate(calls)
            ]
        )
    return batch, items


def _send(batch: Batch, api: BatchAPI, pairs: list[tuple[BatchItem, _Call]]) -> None:
    info = api.submit(
        [(item.custom_id, call.prepared.request) for item, call in pairs],
        display_name=f"agentloop-batch-{batch.pk}",
    )
    _update(batch, provider_batch_id=info.id, submitted_at=timezone.now(), **_counts(info))
    for _, call in pairs:
        # The model call has started, as generate() says before its request.
        call.chat.conversation._emit("before_message")


def _counts(info: BatchInfo) -> dict[str, Any]:
    return {
        "status": info.status,
        "request_count": info.request_count,
        "processing_count": info.processing_count,
        "succeeded_count": info.succeeded_count,
        "failed_count": info.failed_count,
        "error": info.error,
        "provider_data": info.data,
    }


def _update(batch: Batch, **fields: Any) -> None:
    """One UPDATE of ``fields`` (the claim columns are left to their owner)."""
    fields["updated_at"] = timezone.now()
    Batch.objects.filter(pk=batch.pk).update(**fields)
    for name, value in fields.items():
        setattr(batch, name, value)


def _fail_unsent(batch: Batch, error: Exception, *, fail_chats: bool = False) -> None:
    """The provider refused the batch: nothing was sent, so there is nothing to collect."""
    text = f"{type(error).__name__}: {error}"
    now = timezone.now()
    _update(batch, status=BatchStatus.FAILED, error=text, collected_at=now)
    pending = batch.items.filter(status=BatchItemStatus.PENDING)
    chat_ids = list(pending.values_list("chat_id", flat=True))
    pending.update(status=BatchItemStatus.FAILED, error=text, finished_at=now)
    if fail_chats:
        Chat.objects.filter(pk__in=chat_ids, lease_token="").update(
            state=ChatState.FAILED, error=f"Batch #{batch.pk} could not be sent: {text}"
        )


# -- claims ----------------------------------------------------------------------------------
def _claim(batch: Batch) -> bool:
    now = timezone.now()
    token = secrets.token_hex(16)
    taken = (
        Batch.objects.filter(pk=batch.pk)
        .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
        .update(claim_token=token, claimed_until=now + timedelta(seconds=CLAIM_SECONDS))
    )
    if taken:
        batch.claim_token = token
    return bool(taken)


def _release(batch: Batch) -> None:
    Batch.objects.filter(pk=batch.pk, claim_token=batch.claim_token).update(
        claim_token="", claimed_until=None
    )
    batch.claim_token = ""
    batch.claimed_until = None


# -- polling ---------------------------------------------------------------------------------
def poll() -> list[Batch]:
    """Refresh every open batch (the periodic task and the management command call this)."""
    polled = []
    for batch in Batch.objects.open().order_by("created_at"):
        try:
            refresh(batch)
        except Exception as exc:  # one batch's trouble must not stop the others
            logger.exception("Polling batch %s failed", batch.pk)
            _update(batch, error=f"Polling failed: {type(exc).__name__}: {exc}"[:2000])
        polled.append(batch)
    return polled


def refresh(batch: Batch) -> Batch:
    """Poll the provider for ``batch``; collect its results once it has ended.

    Does nothing while another process holds the batch (it is polling it).
    """
    if batch.collected_at is not None or not _claim(batch):
        return batch
    try:
        api = _api(batch)
        if batch.status == BatchStatus.CREATED:
            _resend(batch, api)  # its sender was interrupted, or the provider was busy
            return batch
        _release_cancelled_chats(batch, api)
        info = api.status(batch.provider_batch_id)
        _update(batch, polled_at=timezone.now(), **_counts(info))
        if info.finished:
            if batch.ended_at is None:
                _update(batch, ended_at=timezone.now())
            _collect(batch, api, info)
    finally:
        _release(batch)
    return batch


def cancel(batch: Batch) -> Batch:
    """Ask the provider to stop ``batch``. Requests it never ran are marked ``not_run`` when
    the batch is collected; their chats stay as they were, awaiting the model."""
    if batch.collected_at is not None or batch.status in (
        BatchStatus.CANCELLING,
        BatchStatus.CANCELLED,
    ):
        return batch
    if batch.status == BatchStatus.CREATED:
        if _claim(batch):
            try:
                _update(batch, status=BatchStatus.CANCELLED, collected_at=timezone.now())
                batch.items.filter(status=BatchItemStatus.PENDING).update(
                    status=BatchItemStatus.NOT_RUN,
                    error="The batch was cancelled before it was sent.",
                    finished_at=timezone.now(),
                )
            finally:
                _release(batch)
        return batch
    info = _api(batch).cancel(batch.provider_batch_id)
    if info is not None:
        _update(batch, **_counts(info))
    else:
        _update(batch, status=BatchStatus.CANCELLING)
    return batch


def _api(batch: Batch) -> BatchAPI:
    provider = providers.get(batch.provider)
    api = batch_api(provider)
    if api is None:
        raise BatchError(f"Provider {batch.provider!r} has no batch API.")
    return api


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
        transcript = chat.conversation.store.load_transcript()
        latest = transcript[-1].key if transcript else None
        if next_move(transcript) != "generate" or latest != item.after_message_id:
            _finish(item, BatchItemStatus.DISCARDED, "The chat moved on before the batch was sent.")
            continue
        prepared = chat.conversation.prepare_model_call(transcript, check_limits=False)
        pairs.append((item, _Call(chat, prepared, latest)))
    if not pairs:
        _update(batch, status=BatchStatus.CANCELLED, collected_at=timezone.now())
        return
    _send_or_leave(batch, api, pairs)


def _send_or_leave(batch: Batch, api: BatchAPI, pairs: list[tuple[BatchItem, _Call]]) -> None:
    """Send a batch made by a poller: a transient error leaves it to the next poll, any other
    fails it and its chats (nobody is there to see an exception)."""
    try:
        _send(batch, api, pairs)
    except ProviderError as exc:
        if not exc.retryable:
            _fail_unsent(batch, exc, fail_chats=True)
        else:  # recorded, not sent: the next poll sends it
            _update(batch, error=f"Not sent yet: {type(exc).__name__}: {exc}"[:2000])
    except Exception as exc:
        logger.exception("Sending batch %s failed", batch.pk)
        _fail_unsent(batch, exc, fail_chats=True)


def _finish(item: BatchItem, status: str, error: str = "", **fields: Any) -> bool:
    """Move ``item`` out of pending; False when another process already did."""
    return bool(
        BatchItem.objects.filter(pk=item.pk, status=BatchItemStatus.PENDING).update(
            status=status, error=error, finished_at=timezone.now(), **fields
        )
    )


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
        _update(batch, **(_counts(info) if info else {"status": BatchStatus.CANCELLING}))


def _release_cancelled_chat(item: BatchItem) -> None:
    chat_model: Any = type(item.chat)
    prior = item.chat.state
    lease = Lease.take(chat_model, item.chat_id)
    if lease is None:
        return  # a run holds the chat and sees the cancel itself; we try again next poll
    try:
        chat = chat_model.objects.get(pk=item.chat_id)
        conversation = chat.conversation
        conversation.store.lease = lease
        requested_at = conversation.store.cancel_requested_at()
        if requested_at is None:
            return
        with transaction.atomic():
            marked = BatchItem.objects.filter(pk=item.pk, cancelled_at__isnull=True).update(
                cancelled_at=timezone.now()
            )
            if marked:
                conversation._record_cancel(CancelledError(requested_at=requested_at))
    finally:
        lease.release(state=prior if prior != ChatState.RUNNING else ChatState.IDLE)


# -- collecting ------------------------------------------------------------------------------
def _collect(batch: Batch, api: BatchAPI, info: BatchInfo) -> None:
    """Put each result into its chat; chats that asked for tools run them and go on."""
    pending = list(batch.items.filter(status=BatchItemStatus.PENDING).select_related("chat"))
    results = {} if info.status == FAILED or not pending else api.results(batch.provider_batch_id)
    continuing: list[int] = []
    left = 0
    for item in pending:
        result = results.get(item.custom_id)
        outcome = _apply(batch, api, item, result if result is not None else _missing(info))
        if outcome is None:
            left += 1
        elif outcome == "continue":
            continuing.append(item.chat_id)
    if not left:
        _update(batch, collected_at=timezone.now())
    if continuing:
        _continue(batch, continuing)


def _missing(info: BatchInfo) -> ProviderError:
    """The outcome of a request the provider gave no result for."""
    if info.status in (CANCELLED, EXPIRED):
        return BatchItemNotRunError(f"The batch was {info.status} before this request ran.")
    if info.status == FAILED:
        return ProviderError(f"The batch failed: {info.error or 'no reason given'}")
    return ProviderError("The batch ended without a result for this request.")


def _apply(batch: Batch, api: BatchAPI, item: BatchItem, result: Any) -> str | None:
    """One result into its chat. Returns "continue" when the chat goes into the next batch,
    "done" otherwise, None when its chat is busy (the item stays pending for the next poll)."""
    if item.cancelled_at is not None:
        # Its chat was released when it was cancelled: the answer is only accounted for.
        if _finish(item, BatchItemStatus.CANCELLED, "The chat was cancelled in the batch."):
            _record_discarded(batch, api, item, item.chat, result, "the chat was cancelled")
        return "done"
    chat_model: Any = type(item.chat)
    prior = item.chat.state
    lease = Lease.take(chat_model, item.chat_id)
    if lease is None:
        return None
    chat = chat_model.objects.get(pk=item.chat_id)
    conversation = chat.conversation
    store = conversation.store
    store.lease = lease
    release: dict[str, Any] = {"state": prior if prior != ChatState.RUNNING else ChatState.IDLE}
    then = "done"
    try:
        transcript = store.load_transcript()
        requested_at = store.cancel_requested_at()
        latest = transcript[-1].key if transcript else None
        if requested_at is not None:
            with transaction.atomic():
                if _finish(
                    item,
                    BatchItemStatus.CANCELLED,
                    "The chat was cancelled in the batch.",
                    cancelled_at=timezone.now(),
                ):
                    usage = _discarded_usage(batch, api, item, result, "the chat was cancelled")
                    conversation._record_cancel(
                        CancelledError(requested_at=requested_at), usage=usage
                    )
        elif next_move(transcript) != "generate" or latest != item.after_message_id:
            if _finish(item, BatchItemStatus.DISCARDED, "The chat moved on before the answer."):
                _record_discarded(batch, api, item, chat, result, "the chat moved on")
        elif isinstance(result, BatchItemNotRunError):
            _finish(item, BatchItemStatus.NOT_RUN, str(result))
        elif isinstance(result, ProviderError):
            text = f"{type(result).__name__}: {result}"
            with transaction.atomic():
                if _finish(item, BatchItemStatus.FAILED, text):
                    store.record_usage(
                        UsageRecord(batch.provider, item.model, "failed", error=text)
                    )
                    release = {"state": ChatState.FAILED, "error": f"Batch #{batch.pk}: {text}"}
        else:
            then = _answer(batch, api, item, chat, lease, transcript, result)
            state = ChatState.WAITING if then == "wait" else ChatState.IDLE
            release = {"state": state, "error": ""}
    except LeaseLostError:
        logger.warning("Chat %s: lease lost while collecting batch %s", item.chat_id, batch.pk)
        return "done"
    except CancelledError:
        then = "done"  # cancelled while its tools ran: recorded by the engine
    except Exception as exc:
        logger.exception("Chat %s: collecting its batch answer failed", item.chat_id)
        release = {"state": ChatState.FAILED, "error": f"{type(exc).__name__}: {exc}"[:4000]}
        then = "done"
    finally:
        lease.release(**release)
    if then == "complete_later":
        chat.complete_later()
    return "continue" if then == "continue" else "done"


def _answer(
    batch: Batch,
    api: BatchAPI,
    item: BatchItem,
    chat: Any,
    lease: Lease,
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
        if not _finish(item, BatchItemStatus.SUCCEEDED):
            return "done"
        record = conversation.accept_response(
            prepared,
            response,
            cost=api.cost(item.model, response.usage),
            duration_ms=int(waited.total_seconds() * 1000),
        )
        BatchItem.objects.filter(pk=item.pk).update(message=record)
    move = next_move(conversation.store.load_transcript())
    if move == "tools":
        with Heartbeat(lease):
            chat.run_tools()
        move = next_move(conversation.store.load_transcript())
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
        chat.conversation.store.record_usage(usage)


# -- the next round --------------------------------------------------------------------------
def _continue(batch: Batch, chat_ids: list[int]) -> None:
    """Chats whose tools ran go into the next batch (one per provider, and per model where
    the provider's batches hold one); a provider error leaves it to the next poll."""
    calls, problems = _prepare(list(Chat.objects.filter(pk__in=chat_ids).order_by("pk")))
    for chat, reason in problems:
        logger.info("Chat %s does not go into the next batch: it %s", chat.pk, reason)
    for group in _by(calls, lambda call: call.prepared.provider_name).values():
        api = batch_api(group[0].prepared.provider)
        if api is None:
            for call in group:
                call.chat.complete_later()
            continue
        rounds = [group] if api.mixed_models else list(_by(group, _model).values())
        for calls_of_round in rounds:
            _send_next(batch, api, calls_of_round)


def _model(call: _Call) -> str:
    return call.prepared.model_id


def _send_next(previous: Batch, api: BatchAPI, calls: list[_Call]) -> None:
    batch, items = _create(calls, auto_continue=True, previous=previous)
    try:
        _send_or_leave(batch, api, list(zip(items, calls, strict=True)))
    finally:
        _release(batch)

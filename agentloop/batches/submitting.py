"""Sending: checking that chats can go into one batch, recording it and its items, sending it."""

from __future__ import annotations

import logging
import secrets
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from ..engine._model_calls import PreparedCall
from ..engine._transcript_reading import next_move
from ..exceptions import BatchError, ConfigurationError, LimitReachedError, ProviderError
from ..models import Batch, BatchItem, BatchItemStatus, BatchStatus, Chat, ChatState
from ..providers.batch_apis import BatchAPI, batch_api
from . import records

__all__ = ["Call", "create", "grouped", "prepare", "send_or_leave", "submit"]

logger = logging.getLogger(__name__)

_NOT_AWAITING = {
    "done": "is not awaiting the model: its last answer asked for nothing more",
    "tools": "is not awaiting the model: it has tool calls to run first (run_tools())",
    "wait": "is not awaiting the model: it waits for a person or a subagent",
}


@dataclass
class Call:
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
    calls, problems = prepare(chats)
    if problems:
        lines = "\n".join(f"- chat {_label(chat)} {reason}" for chat, reason in problems)
        raise BatchError(f"{len(problems)} chat(s) can't go into a batch:\n{lines}")
    api = _check_one_batch(calls)
    batch, items = create(calls, auto_continue=auto_continue, previous=None)
    try:
        _send(batch, api, [(item, call) for item, call in zip(items, calls, strict=True)])
    except Exception as exc:
        _fail_unsent(batch, exc)
        raise
    finally:
        records.release(batch)
    return batch


def _label(chat: Any) -> str:
    pk = getattr(chat, "pk", None)
    return f"#{pk}" if pk is not None else repr(chat)


def prepare(chats: list[Any]) -> tuple[list[Call], list[tuple[Any, str]]]:
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
    calls: list[Call] = []
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
        if chat.guardrails:
            # A batch's answers come back without the steps that judge them: fail closed.
            problems.append((chat, "has guardrails, which a batch does not run (step it instead)"))
            continue
        conversation = chat.conversation
        transcript = conversation.store.transcript.load_transcript()
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
        calls.append(Call(chat, prepared, transcript[-1].key if transcript else None))
    return calls, problems


def _chat_list(calls: list[Call]) -> str:
    ids = ", ".join(_label(call.chat) for call in calls)
    return f"chat {ids}" if len(calls) == 1 else f"chats {ids}"


def grouped(calls: list[Call], key: Any) -> dict[str, list[Call]]:
    groups: dict[str, list[Call]] = defaultdict(list)
    for call in calls:
        groups[key(call)].append(call)
    return groups


def _check_one_batch(calls: list[Call]) -> BatchAPI:
    """The provider's batch API, when the calls can be one batch of it; else BatchError."""
    by_provider = grouped(calls, lambda call: call.prepared.provider_name)
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
    by_model = grouped(calls, lambda call: call.prepared.model_id)
    if len(by_model) > 1 and not api.mixed_models:
        found = "; ".join(f"{model} ({_chat_list(group)})" for model, group in by_model.items())
        raise BatchError(
            f"A {first.provider_name} batch holds one model; these chats use {found}. "
            "Send one batch per model."
        )
    by_headers = grouped(calls, lambda call: repr(sorted(call.prepared.request.headers.items())))
    if len(by_headers) > 1:
        raise BatchError(
            "The chats of one batch must send the same headers (with_headers); these differ: "
            + "; ".join(_chat_list(group) for group in by_headers.values())
        )
    return api


def create(
    calls: list[Call], *, auto_continue: bool, previous: Batch | None
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
            claimed_until=now + timedelta(seconds=records.CLAIM_SECONDS),
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


def _send(batch: Batch, api: BatchAPI, pairs: list[tuple[BatchItem, Call]]) -> None:
    info = api.submit(
        [(item.custom_id, call.prepared.request) for item, call in pairs],
        display_name=f"agentloop-batch-{batch.pk}",
    )
    records.update(
        batch, provider_batch_id=info.id, submitted_at=timezone.now(), **records.counts(info)
    )
    for _, call in pairs:
        # The model call has started, as generate() says before its request.
        call.chat.conversation.emit("before_message")


def _fail_unsent(batch: Batch, error: Exception, *, fail_chats: bool = False) -> None:
    """The provider refused the batch: nothing was sent, so there is nothing to collect."""
    text = f"{type(error).__name__}: {error}"
    now = timezone.now()
    records.update(batch, status=BatchStatus.FAILED, error=text, collected_at=now)
    pending = batch.items.filter(status=BatchItemStatus.PENDING)
    chat_ids = list(pending.values_list("chat_id", flat=True))
    pending.update(status=BatchItemStatus.FAILED, error=text, finished_at=now)
    if fail_chats:
        Chat.objects.filter(pk__in=chat_ids, lease_token="").update(
            state=ChatState.FAILED, error=f"Batch #{batch.pk} could not be sent: {text}"
        )


def send_or_leave(batch: Batch, api: BatchAPI, pairs: list[tuple[BatchItem, Call]]) -> None:
    """Send a batch made by a poller: a transient error leaves it to the next poll, any other
    fails it and its chats (nobody is there to see an exception)."""
    try:
        _send(batch, api, pairs)
    except ProviderError as exc:
        if not exc.retryable:
            _fail_unsent(batch, exc, fail_chats=True)
        else:  # recorded, not sent: the next poll sends it
            records.update(batch, error=f"Not sent yet: {type(exc).__name__}: {exc}"[:2000])
    except Exception as exc:
        logger.exception("Sending batch %s failed", batch.pk)
        _fail_unsent(batch, exc, fail_chats=True)

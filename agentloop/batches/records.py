"""A batch's rows: the provider's counts, one UPDATE at a time, the poller's claim and one
poll under it, the results of an ended batch, and items moving out of pending."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

from django.db.models import Q
from django.utils import timezone

from .. import providers
from ..exceptions import BatchError, BatchItemNotRunError, ProviderError
from ..models import Batch, BatchItem, BatchItemStatus, BatchStatus
from ..providers.batch_apis import (
    CANCELLED,
    EXPIRED,
    FAILED,
    BatchAPI,
    BatchInfo,
    BatchResult,
    batch_api,
)

__all__ = [
    "CLAIM_SECONDS",
    "api_of",
    "claim",
    "counts",
    "finish",
    "outcomes",
    "poll",
    "refresh_each",
    "release",
    "update",
]

logger = logging.getLogger(__name__)

#: how long one poller may hold a batch before another may take it over.
CLAIM_SECONDS = 600


def counts(info: BatchInfo) -> dict[str, Any]:
    """The batch's fields as the provider reports them in ``info``."""
    return {
        "status": info.status,
        "request_count": info.request_count,
        "processing_count": info.processing_count,
        "succeeded_count": info.succeeded_count,
        "failed_count": info.failed_count,
        "error": info.error,
        "provider_data": info.data,
    }


def update(batch: Batch, **fields: Any) -> None:
    """One UPDATE of ``fields`` (the claim columns are left to their owner)."""
    fields["updated_at"] = timezone.now()
    Batch.objects.filter(pk=batch.pk).update(**fields)
    for name, value in fields.items():
        setattr(batch, name, value)


def api_of(batch: Batch) -> BatchAPI:
    """The batch API of ``batch``'s provider (``BatchError`` when it has none)."""
    api = batch_api(providers.get(batch.provider))
    if api is None:
        raise BatchError(f"Provider {batch.provider!r} has no batch API.")
    return api


def poll(
    batch: Batch,
    *,
    resend: Callable[[Batch, BatchAPI], None],
    collect: Callable[[Batch, BatchAPI, BatchInfo], None],
    before: Callable[[Batch, BatchAPI], None] | None = None,
) -> Batch:
    """One poll of ``batch`` under this process's claim (nothing while another holds it, or
    once it was collected): a batch never sent is sent again (``resend``); else ``before``
    runs, the provider's counts are kept, and an ended batch is ``collect``-ed."""
    if batch.collected_at is not None or not claim(batch):
        return batch
    try:
        api = api_of(batch)
        if batch.status == BatchStatus.CREATED:
            resend(batch, api)  # its sender was interrupted, or the provider was busy
            return batch
        if before is not None:
            before(batch, api)
        info = api.status(batch.provider_batch_id)
        update(batch, polled_at=timezone.now(), **counts(info))
        if info.finished:
            if batch.ended_at is None:
                update(batch, ended_at=timezone.now())
            collect(batch, api, info)
    finally:
        release(batch)
    return batch


def outcomes(
    batch: Batch, api: BatchAPI, info: BatchInfo, custom_ids: Iterable[str]
) -> dict[str, BatchResult]:
    """The outcome of each of ``custom_ids`` in an ended batch: its result, else the error of
    a request the provider gave no result for. The provider is asked only when there is
    something to collect from a batch that did not fail as a whole."""
    wanted = list(custom_ids)
    results = {} if info.status == FAILED or not wanted else api.results(batch.provider_batch_id)
    return {
        custom_id: found if (found := results.get(custom_id)) is not None else _missing(info)
        for custom_id in wanted
    }


def _missing(info: BatchInfo) -> ProviderError:
    """The outcome of a request the provider gave no result for."""
    if info.status in (CANCELLED, EXPIRED):
        return BatchItemNotRunError(f"The batch was {info.status} before this request ran.")
    if info.status == FAILED:
        return ProviderError(f"The batch failed: {info.error or 'no reason given'}")
    return ProviderError("The batch ended without a result for this request.")


def refresh_each(batches: Iterable[Batch], refresh: Callable[[Batch], Batch]) -> list[Batch]:
    """``refresh`` each of ``batches`` in turn; a batch whose poll fails is logged and keeps
    the failure as its ``error``, and the others are polled all the same. Returns them."""
    polled = []
    for batch in batches:
        try:
            refresh(batch)
        except Exception as exc:  # one batch's trouble must not stop the others
            logger.exception("Polling batch %s failed", batch.pk)
            update(batch, error=f"Polling failed: {type(exc).__name__}: {exc}"[:2000])
        polled.append(batch)
    return polled


# -- claims ----------------------------------------------------------------------------------
def claim(batch: Batch) -> bool:
    """Take ``batch`` for this process; False while another holds an unexpired claim."""
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


def release(batch: Batch) -> None:
    """Give up this process's claim on ``batch``."""
    Batch.objects.filter(pk=batch.pk, claim_token=batch.claim_token).update(
        claim_token="", claimed_until=None
    )
    batch.claim_token = ""
    batch.claimed_until = None


def finish(item: BatchItem, status: str, error: str = "", **fields: Any) -> bool:
    """Move ``item`` out of pending; False when another process already did."""
    return bool(
        BatchItem.objects.filter(pk=item.pk, status=BatchItemStatus.PENDING).update(
            status=status, error=error, finished_at=timezone.now(), **fields
        )
    )

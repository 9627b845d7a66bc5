"""Gemini batch mode: ``POST /{version}/models/{model}:batchGenerateContent`` with inline
requests; the batch is a long-running operation whose ``response`` holds the answers."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from ...exceptions import BatchError, InvalidResponseError
from ...messages import ModelRequest
from ..gemini import GeminiProvider
from .base import (
    CANCELLED,
    ENDED,
    EXPIRED,
    FAILED,
    IN_PROGRESS,
    BatchInfo,
    BatchResult,
    HTTPBatchAPI,
    count_of,
)

__all__ = ["GeminiBatchAPI"]

_GEMINI_STATE = {
    "PENDING": IN_PROGRESS,
    "RUNNING": IN_PROGRESS,
    "SUCCEEDED": ENDED,
    "FAILED": FAILED,
    "CANCELLED": CANCELLED,
    "EXPIRED": EXPIRED,
}


class GeminiBatchAPI(HTTPBatchAPI):
    """Gemini batch mode with inline requests; the batch is a long-running operation."""

    provider: GeminiProvider

    def submit(
        self, items: Sequence[tuple[str, ModelRequest]], *, display_name: str | None = None
    ) -> BatchInfo:
        models = {request.model for _, request in items}
        if len(models) != 1:
            raise BatchError(f"A Gemini batch holds one model, not {', '.join(sorted(models))}.")
        first = items[0][1]
        # The model's generateContent URL, with the batch action instead.
        action = self.provider.endpoint(first, stream=False).rsplit(":", 1)[0]
        resource = action.split("/", 2)[2]  # "models/gemini-2.5-flash"
        requests = [
            {
                "request": {**self.provider.build_body(request, stream=False), "model": resource},
                "metadata": {"custom_id": custom_id},
            }
            for custom_id, request in items
        ]
        body = {
            "batch": {
                "displayName": display_name or f"agentloop-{uuid.uuid4().hex[:12]}",
                "inputConfig": {"requests": {"requests": requests}},
            }
        }
        headers = self.common_headers(items)
        return self._info(
            self.send_json("POST", f"{action}:batchGenerateContent", headers=headers, json=body)
        )

    def _url(self, batch_id: str) -> str:
        return f"/{self.provider.api_version}/{batch_id}"

    def status(self, batch_id: str) -> BatchInfo:
        return self._info(self.send_json("GET", self._url(batch_id)))

    def results(self, batch_id: str) -> dict[str, BatchResult]:
        operation = self.send_json("GET", self._url(batch_id))
        batch = operation.get("metadata") or {}
        output = operation.get("response") or batch.get("output") or {}
        if output.get("responsesFile") and not output.get("inlinedResponses"):
            raise InvalidResponseError(
                f"{self.name} put the results of batch {batch_id} in a file; agentloop sends "
                "requests inline and reads inline results only."
            )
        inlined = (output.get("inlinedResponses") or {}).get("inlinedResponses") or []
        results: dict[str, BatchResult] = {}
        for index, item in enumerate(inlined):
            # The metadata we sent comes back with each answer; the order is the requests'.
            custom_id = str((item.get("metadata") or {}).get("custom_id") or index)
            if isinstance(item.get("error"), dict):
                results[custom_id] = self.provider.error_from_body(None, {"error": item["error"]})
            else:
                results[custom_id] = self.parsed(item.get("response") or {})
        return results

    def cancel(self, batch_id: str) -> None:
        self.send("POST", f"{self._url(batch_id)}:cancel")

    def _info(self, operation: Mapping[str, Any]) -> BatchInfo:
        batch = operation.get("metadata") or operation
        raw = str(batch.get("state") or "")
        stats = batch.get("batchStats") or {}
        error = operation.get("error") or {}
        return BatchInfo(
            id=str(operation.get("name") or batch.get("name")),
            status=_GEMINI_STATE.get(raw.rpartition("_STATE_")[2], IN_PROGRESS),
            request_count=count_of(stats.get("requestCount")),
            processing_count=count_of(stats.get("pendingRequestCount")),
            succeeded_count=count_of(stats.get("successfulRequestCount")),
            failed_count=count_of(stats.get("failedRequestCount")),
            error=str(error.get("message") or "") if isinstance(error, dict) else "",
            data={"state": raw, "model": batch.get("model")},
        )

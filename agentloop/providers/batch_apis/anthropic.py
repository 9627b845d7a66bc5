"""Anthropic's Message Batches: ``POST /v1/messages/batches``; results as JSONL; one batch
may mix models."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...exceptions import BatchItemNotRunError
from ...messages import ModelRequest
from ..anthropic import AnthropicProvider
from .base import (
    CANCELLED,
    CANCELLING,
    ENDED,
    IN_PROGRESS,
    BatchInfo,
    BatchResult,
    HTTPBatchAPI,
    count_of,
)

__all__ = ["AnthropicBatchAPI"]


class AnthropicBatchAPI(HTTPBatchAPI):
    """Anthropic's Message Batches (``/v1/messages/batches``); one batch may mix models."""

    mixed_models = True
    provider: AnthropicProvider
    path = "/v1/messages/batches"

    def submit(
        self, items: Sequence[tuple[str, ModelRequest]], *, display_name: str | None = None
    ) -> BatchInfo:
        requests = [
            {"custom_id": custom_id, "params": self.provider.build_body(request, stream=False)}
            for custom_id, request in items
        ]
        return self._info(
            self.send_json(
                "POST", self.path, headers=self.common_headers(items), json={"requests": requests}
            )
        )

    def status(self, batch_id: str) -> BatchInfo:
        return self._info(self.send_json("GET", f"{self.path}/{batch_id}"))

    def results(self, batch_id: str) -> dict[str, BatchResult]:
        text = self.send("GET", f"{self.path}/{batch_id}/results").text
        return self.results_of(text, self._result)

    def cancel(self, batch_id: str) -> BatchInfo:
        return self._info(self.send_json("POST", f"{self.path}/{batch_id}/cancel", json={}))

    def _result(self, line: Mapping[str, Any]) -> BatchResult:
        result = line.get("result") or {}
        kind = result.get("type")
        if kind == "succeeded":
            return self.parsed(result.get("message"))
        if kind == "errored":
            return self.provider.error_from_body(None, result.get("error") or {})
        return BatchItemNotRunError(f"{self.name}: the request was {kind or 'not run'}")

    def _info(self, data: Mapping[str, Any]) -> BatchInfo:
        counts = {key: count_of(value) for key, value in (data.get("request_counts") or {}).items()}
        raw = str(data.get("processing_status") or "")
        status = {"in_progress": IN_PROGRESS, "canceling": CANCELLING, "ended": ENDED}.get(
            raw, IN_PROGRESS
        )
        if status == ENDED and data.get("cancel_initiated_at"):
            status = CANCELLED
        failed = counts.get("errored", 0) + counts.get("canceled", 0) + counts.get("expired", 0)
        return BatchInfo(
            id=str(data["id"]),
            status=status,
            request_count=sum(counts.values()),
            processing_count=counts.get("processing", 0),
            succeeded_count=counts.get("succeeded", 0),
            failed_count=failed,
            data={
                "status": raw,
                "results_url": data.get("results_url"),
                "expires_at": data.get("expires_at"),
            },
        )

"""OpenAI's Batch API (Chat Completions and Responses): a JSONL file uploaded to ``/files``
(purpose ``batch``), ``POST /batches``; results in the output and error files."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlparse

from ...exceptions import BatchItemNotRunError
from ...messages import ModelRequest
from ..openai import OpenAIProvider
from ..openai_responses import OpenAIResponsesProvider
from .base import (
    CANCELLED,
    CANCELLING,
    ENDED,
    EXPIRED,
    FAILED,
    IN_PROGRESS,
    BatchInfo,
    BatchResult,
    HTTPBatchAPI,
    count_of,
)

__all__ = ["OpenAIBatchAPI"]

_OPENAI_STATUS = {
    "validating": IN_PROGRESS,
    "in_progress": IN_PROGRESS,
    "finalizing": IN_PROGRESS,
    "completed": ENDED,
    "failed": FAILED,
    "expired": EXPIRED,
    "cancelling": CANCELLING,
    "cancelled": CANCELLED,
}
# Error codes of requests the Batch API never ran.
_OPENAI_NOT_RUN = {"batch_expired", "batch_cancelled"}


class OpenAIBatchAPI(HTTPBatchAPI):
    """OpenAI's Batch API for Chat Completions or Responses requests."""

    provider: OpenAIProvider | OpenAIResponsesProvider

    def __init__(self, provider: OpenAIProvider | OpenAIResponsesProvider, endpoint: str) -> None:
        super().__init__(provider)
        #: the endpoint each line goes to, below the API's base path ("/responses").
        self.endpoint = endpoint

    @property
    def url(self) -> str:
        """The endpoint as the batch names it ("/v1/responses")."""
        return urlparse(self.provider.base_url).path.rstrip("/") + self.endpoint

    def submit(
        self, items: Sequence[tuple[str, ModelRequest]], *, display_name: str | None = None
    ) -> BatchInfo:
        headers = self.common_headers(items)
        lines = []
        for custom_id, request in items:
            body = self.provider.build_body(request, stream=False)
            # Batched requests never stream; the field is left out as the API's examples do.
            body.pop("stream", None)
            body.pop("stream_options", None)
            line = {"custom_id": custom_id, "method": "POST", "url": self.url, "body": body}
            lines.append(json.dumps(line, separators=(",", ":"), ensure_ascii=False))
        content = ("\n".join(lines) + "\n").encode("utf-8")
        upload = self.send_json(
            "POST",
            "/files",
            headers=headers,
            files={"file": ("agentloop_batch.jsonl", content, "application/jsonl")},
            data={"purpose": "batch"},
        )
        created = self.send_json(
            "POST",
            "/batches",
            headers=headers,
            json={"input_file_id": upload["id"], "endpoint": self.url, "completion_window": "24h"},
        )
        return self._info(created)

    def status(self, batch_id: str) -> BatchInfo:
        return self._info(self.send_json("GET", f"/batches/{batch_id}"))

    def results(self, batch_id: str) -> dict[str, BatchResult]:
        info = self.status(batch_id)
        results: dict[str, BatchResult] = {}
        for key in ("output_file_id", "error_file_id"):
            file_id = info.data.get(key)
            if not file_id:
                continue
            text = self.send("GET", f"/files/{file_id}/content").text
            results.update(self.results_of(text, self._result))
        return results

    def cancel(self, batch_id: str) -> BatchInfo:
        return self._info(self.send_json("POST", f"/batches/{batch_id}/cancel"))

    def _result(self, line: Mapping[str, Any]) -> BatchResult:
        response = line.get("response") or {}
        status = count_of(response.get("status_code"))
        if response and 200 <= status < 300:
            return self.parsed(response.get("body"))
        error = line.get("error")
        if isinstance(error, dict):
            code = str(error.get("code") or "")
            if code in _OPENAI_NOT_RUN:
                return BatchItemNotRunError(f"{self.name}: {error.get('message') or code}")
            return self.provider.error_from_body(status or None, {"error": error})
        return self.provider.error_from_body(status or 500, response.get("body") or line)

    def _info(self, data: Mapping[str, Any]) -> BatchInfo:
        counts = data.get("request_counts") or {}
        total, done, failed = (count_of(counts.get(k)) for k in ("total", "completed", "failed"))
        errors = (data.get("errors") or {}).get("data") or []
        raw = str(data.get("status") or "")
        return BatchInfo(
            id=str(data["id"]),
            status=_OPENAI_STATUS.get(raw, IN_PROGRESS),
            request_count=total,
            processing_count=max(total - done - failed, 0),
            succeeded_count=done,
            failed_count=failed,
            error="; ".join(
                str(e.get("message") or e.get("code")) for e in errors if isinstance(e, dict)
            ),
            data={
                "status": raw,
                "endpoint": data.get("endpoint"),
                "input_file_id": data.get("input_file_id"),
                "output_file_id": data.get("output_file_id"),
                "error_file_id": data.get("error_file_id"),
            },
        )

"""Provider batch APIs: many requests sent at once, answered within a day, at about half price.

A :class:`BatchAPI` has four methods: ``submit`` a list of ``(custom_id, ModelRequest)``,
read a batch's ``status``, fetch its ``results`` (``{custom_id: ModelResponse |
ProviderError}``) once it has ended, and ``cancel`` it. Each request body is built by the
provider's own ``build_body`` and each answer parsed by its own ``parse_response``, so a
batched call maps exactly like a direct one. :func:`batch_api` finds a provider's:

- OpenAI Batch API (Chat Completions and Responses): a JSONL file uploaded to ``/files``
  (purpose ``batch``), ``POST /batches``; results in the output and error files;
- Anthropic Message Batches: ``POST /v1/messages/batches``; results as JSONL; one batch
  may mix models;
- Gemini batch mode: ``POST /{version}/models/{model}:batchGenerateContent`` with inline
  requests; the batch is a long-running operation whose ``response`` holds the answers.

A provider of your own can offer batches with a ``batch_api()`` method returning a
:class:`BatchAPI`. Vendors don't report a price per batched request: :meth:`BatchAPI.cost`
is the catalog price times :attr:`BatchAPI.price_factor` (one half, the vendors' batch
discount).
"""

from __future__ import annotations

import json
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, ClassVar
from urllib.parse import urlparse

import httpx

from ..exceptions import BatchError, BatchItemNotRunError, InvalidResponseError, ProviderError
from ..messages import ModelRequest, ModelResponse, TokenUsage
from .anthropic import AnthropicProvider
from .base import Provider
from .errors import redact
from .gemini import GeminiProvider
from .http import HTTPProvider
from .openai import OllamaProvider, OpenAIProvider, OpenRouterProvider
from .openai_responses import OpenAIResponsesProvider

__all__ = [
    "CANCELLED",
    "CANCELLING",
    "ENDED",
    "EXPIRED",
    "FAILED",
    "FINISHED",
    "IN_PROGRESS",
    "AnthropicBatchAPI",
    "BatchAPI",
    "BatchInfo",
    "BatchResult",
    "GeminiBatchAPI",
    "HTTPBatchAPI",
    "OpenAIBatchAPI",
    "batch_api",
]

# A batch's status, the same words for every vendor.
IN_PROGRESS = "in_progress"  # accepted; validating, queued or running
CANCELLING = "cancelling"
ENDED = "ended"  # every request has its outcome
CANCELLED = "cancelled"  # ended after a cancel: requests not run yet never will be
EXPIRED = "expired"  # ended by the vendor's deadline (24 hours)
FAILED = "failed"  # the whole batch was refused (e.g. an invalid input file)
#: statuses after which nothing changes: the results can be collected.
FINISHED = frozenset({ENDED, CANCELLED, EXPIRED, FAILED})

#: what one request of a batch came to.
BatchResult = ModelResponse | ProviderError


@dataclass(frozen=True)
class BatchInfo:
    """A batch as the vendor reports it."""

    id: str
    status: str
    request_count: int = 0
    #: requests not finished yet.
    processing_count: int = 0
    succeeded_count: int = 0
    #: requests that errored, expired or were cancelled.
    failed_count: int = 0
    #: why the whole batch failed, when it did.
    error: str = ""
    #: the vendor's own status and the few fields needed later (file ids, results URL).
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.status in FINISHED


class BatchAPI(ABC):
    """A provider's batch API."""

    #: whether one batch may hold requests for different models.
    mixed_models: ClassVar[bool] = False
    #: the batch price as a fraction of the catalog price.
    price_factor: ClassVar[Decimal] = Decimal("0.5")

    def __init__(self, provider: Provider) -> None:
        self.provider = provider

    @abstractmethod
    def submit(
        self, items: Sequence[tuple[str, ModelRequest]], *, display_name: str | None = None
    ) -> BatchInfo:
        """Send the requests as one batch; ``custom_id`` names each one's result."""

    @abstractmethod
    def status(self, batch_id: str) -> BatchInfo:
        """The batch's status and counts."""

    @abstractmethod
    def results(self, batch_id: str) -> dict[str, BatchResult]:
        """Each finished request's answer, or its error, by custom id (call once finished).

        Requests the vendor never ran (the batch was cancelled or expired first) come back
        as :class:`~agentloop.exceptions.BatchItemNotRunError`.
        """

    @abstractmethod
    def cancel(self, batch_id: str) -> BatchInfo | None:
        """Ask the vendor to stop the batch (requests already answered keep their answers)."""

    def cost(self, model: str, usage: TokenUsage) -> Decimal | None:
        """The batch price of ``usage``: the catalog price times ``price_factor``."""
        full = self.provider.cost(model, usage)
        if full is None:
            return None
        return (full * self.price_factor).quantize(Decimal("0.00000001"))


class HTTPBatchAPI(BatchAPI):
    """A batch API spoken to with an :class:`~.http.HTTPProvider`'s client, key and errors."""

    provider: HTTPProvider

    def __init__(self, provider: HTTPProvider) -> None:
        super().__init__(provider)

    @property
    def name(self) -> str:
        return self.provider.name

    def send(
        self, method: str, url: str, *, headers: Mapping[str, str] | None = None, **kwargs: Any
    ) -> httpx.Response:
        """One HTTP call with the provider's key, headers, timeouts and error mapping."""
        provider = self.provider
        sent = provider.auth_headers(provider.api_key())
        sent.update(provider._setting("headers") or {})
        sent.update(provider._headers)
        sent.update(headers or {})
        with provider._translate_errors():
            response = provider.client.request(method, url, headers=sent, **kwargs)
        provider._raise_for_status(response)
        return response

    def json(self, response: httpx.Response) -> Any:
        try:
            return response.json()
        except ValueError as exc:
            raise InvalidResponseError(
                f"{self.name} answered with invalid JSON",
                status=response.status_code,
                body=redact(response.text[:2000], self.provider._secrets()),
            ) from exc

    def parsed(self, data: Any) -> BatchResult:
        """One answer through the provider's own parser; its error as a value."""
        try:
            return self.provider._parse(data)
        except ProviderError as exc:
            return exc

    @staticmethod
    def common_headers(items: Sequence[tuple[str, ModelRequest]]) -> dict[str, str]:
        """The requests' own headers, sent with the batch: they must agree."""
        headers = [dict(request.headers) for _, request in items]
        if any(other != headers[0] for other in headers[1:]):
            raise BatchError("The requests of one batch must send the same headers.")
        return headers[0] if headers else {}

    @staticmethod
    def lines(text: str) -> list[dict[str, Any]]:
        return [json.loads(line) for line in text.splitlines() if line.strip()]


def _count(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


# -- OpenAI ---------------------------------------------------------------------------------
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
        upload = self.json(
            self.send(
                "POST",
                "/files",
                headers=headers,
                files={"file": ("agentloop_batch.jsonl", content, "application/jsonl")},
                data={"purpose": "batch"},
            )
        )
        created = self.send(
            "POST",
            "/batches",
            headers=headers,
            json={"input_file_id": upload["id"], "endpoint": self.url, "completion_window": "24h"},
        )
        return self._info(self.json(created))

    def status(self, batch_id: str) -> BatchInfo:
        return self._info(self.json(self.send("GET", f"/batches/{batch_id}")))

    def results(self, batch_id: str) -> dict[str, BatchResult]:
        info = self.status(batch_id)
        results: dict[str, BatchResult] = {}
        for key in ("output_file_id", "error_file_id"):
            file_id = info.data.get(key)
            if not file_id:
                continue
            text = self.send("GET", f"/files/{file_id}/content").text
            for line in self.lines(text):
                results[str(line.get("custom_id"))] = self._result(line)
        return results

    def cancel(self, batch_id: str) -> BatchInfo:
        return self._info(self.json(self.send("POST", f"/batches/{batch_id}/cancel")))

    def _result(self, line: Mapping[str, Any]) -> BatchResult:
        response = line.get("response") or {}
        status = _count(response.get("status_code"))
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
        total, done, failed = (_count(counts.get(k)) for k in ("total", "completed", "failed"))
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


# -- Anthropic ------------------------------------------------------------------------------
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
        response = self.send(
            "POST", self.path, headers=self.common_headers(items), json={"requests": requests}
        )
        return self._info(self.json(response))

    def status(self, batch_id: str) -> BatchInfo:
        return self._info(self.json(self.send("GET", f"{self.path}/{batch_id}")))

    def results(self, batch_id: str) -> dict[str, BatchResult]:
        text = self.send("GET", f"{self.path}/{batch_id}/results").text
        return {str(line.get("custom_id")): self._result(line) for line in self.lines(text)}

    def cancel(self, batch_id: str) -> BatchInfo:
        return self._info(self.json(self.send("POST", f"{self.path}/{batch_id}/cancel", json={})))

    def _result(self, line: Mapping[str, Any]) -> BatchResult:
        result = line.get("result") or {}
        kind = result.get("type")
        if kind == "succeeded":
            return self.parsed(result.get("message"))
        if kind == "errored":
            return self.provider.error_from_body(None, result.get("error") or {})
        return BatchItemNotRunError(f"{self.name}: the request was {kind or 'not run'}")

    def _info(self, data: Mapping[str, Any]) -> BatchInfo:
        counts = {key: _count(value) for key, value in (data.get("request_counts") or {}).items()}
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


# -- Gemini ---------------------------------------------------------------------------------
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
        response = self.send(
            "POST", f"{action}:batchGenerateContent", headers=self.common_headers(items), json=body
        )
        return self._info(self.json(response))

    def _url(self, batch_id: str) -> str:
        return f"/{self.provider.api_version}/{batch_id}"

    def status(self, batch_id: str) -> BatchInfo:
        return self._info(self.json(self.send("GET", self._url(batch_id))))

    def results(self, batch_id: str) -> dict[str, BatchResult]:
        operation = self.json(self.send("GET", self._url(batch_id)))
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
            request_count=_count(stats.get("requestCount")),
            processing_count=_count(stats.get("pendingRequestCount")),
            succeeded_count=_count(stats.get("successfulRequestCount")),
            failed_count=_count(stats.get("failedRequestCount")),
            error=str(error.get("message") or "") if isinstance(error, dict) else "",
            data={"state": raw, "model": batch.get("model")},
        )


# -- lookup ---------------------------------------------------------------------------------
def batch_api(provider: Provider) -> BatchAPI | None:
    """``provider``'s batch API, or None when it has none.

    A provider's own ``batch_api()`` method wins; the built-in providers of OpenAI (both
    APIs), Anthropic and Gemini have one; OpenRouter, Ollama and other OpenAI-compatible
    servers don't, unless ``AGENTLOOP["PROVIDERS"][name]["batches"]`` is True.
    """
    hook = getattr(provider, "batch_api", None)
    if callable(hook):
        found: BatchAPI | None = hook()
        return found
    if isinstance(provider, OpenAIResponsesProvider):
        return OpenAIBatchAPI(provider, "/responses")
    if isinstance(provider, OpenRouterProvider | OllamaProvider):
        return None
    if isinstance(provider, OpenAIProvider):
        # Compatible servers (vLLM, LM Studio...) have no Batch API: api.openai.com does, and
        # a server that copies it says so with AGENTLOOP["PROVIDERS"][name]["batches"] = True.
        offered = provider._setting("batches")
        if offered is None:
            offered = urlparse(provider.base_url).hostname == "api.openai.com"
        return OpenAIBatchAPI(provider, "/chat/completions") if offered else None
    if isinstance(provider, AnthropicProvider):
        return AnthropicBatchAPI(provider)
    if isinstance(provider, GeminiProvider):
        return GeminiBatchAPI(provider)
    return None

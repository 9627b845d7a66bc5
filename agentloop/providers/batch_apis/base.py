"""What every batch API shares: the statuses, ``BatchInfo``, ``BatchAPI`` and ``HTTPBatchAPI``."""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, ClassVar

import httpx

from ...exceptions import BatchError, InvalidResponseError, ProviderError
from ...messages import ModelRequest, ModelResponse, TokenUsage
from ..base import Provider
from ..errors import call_errors
from ..http import HTTPProvider

__all__ = [
    "CANCELLED",
    "CANCELLING",
    "ENDED",
    "EXPIRED",
    "FAILED",
    "FINISHED",
    "IN_PROGRESS",
    "BatchAPI",
    "BatchInfo",
    "BatchResult",
    "HTTPBatchAPI",
    "count_of",
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
        with call_errors(provider.name, provider._secrets) as sending:
            sending({"url": url, "headers": sent})
            response = provider.client.request(method, url, headers=sent, **kwargs)
            provider._raise_for_status(response)
        return response

    def send_json(self, method: str, url: str, **kwargs: Any) -> Any:
        """:meth:`send`, and the answer's JSON (InvalidResponseError when it is not JSON)."""
        return self.provider._json_of(self.send(method, url, **kwargs))

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

    def results_of(
        self, text: str, result: Callable[[Mapping[str, Any]], BatchResult]
    ) -> dict[str, BatchResult]:
        """A JSONL results file as results by custom id, one line at a time: a line that is
        not valid JSON, or that ``result`` can't read, fails only its own request (named
        when its custom id can be found), never the whole batch."""
        results: dict[str, BatchResult] = {}
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
                if not isinstance(data, dict):
                    raise ValueError("not a JSON object")
                custom_id = str(data.get("custom_id"))
                results[custom_id] = result(data)
            except Exception as exc:  # one bad line must not hold back the others
                found = _CUSTOM_ID.search(line)
                problem = InvalidResponseError(
                    f"{self.name}: line {number} of the batch results can't be read "
                    f"({type(exc).__name__}: {str(exc)[:200]})"
                )
                if found:
                    results[found.group(1)] = problem
        return results


#: a custom id in a line too broken to parse as JSON.
_CUSTOM_ID = re.compile(r'"custom_id"\s*:\s*"([^"\\]{1,200})"')


def count_of(value: Any) -> int:
    """A count from a vendor's JSON: 0 when it is missing or not a number."""
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0

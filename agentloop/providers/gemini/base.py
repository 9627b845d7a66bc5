"""``GeminiBase``: what the Gemini API and Vertex AI share, over HTTP: the request body,
the answers (JSON and SSE) and Google's error envelope. The subclasses say where a request
goes and how it is authorised (``GeminiProvider``: an API key; ``VertexAIProvider``: OAuth).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import httpx

from ...exceptions import (
    AuthenticationError,
    BadRequestError,
    InvalidResponseError,
    ProviderError,
    StreamInterruptedError,
)
from ...messages import ModelRequest, ModelResponse
from ..base import ChunkCallback
from ..errors import error_for_status
from ..http import HTTPProvider, StreamParser
from ..redaction import redact
from .mapping import Answer, request_body

__all__ = ["GeminiBase"]

# google.rpc status names, for error objects that carry no HTTP code.
_RPC_STATUS = {
    "INVALID_ARGUMENT": 400,
    "FAILED_PRECONDITION": 400,
    "OUT_OF_RANGE": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "RESOURCE_EXHAUSTED": 429,
    "CANCELLED": 499,
    "INTERNAL": 500,
    "UNKNOWN": 500,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
}


class GeminiBase(HTTPProvider):
    """Gemini's ``generateContent`` wire format, wherever it is served.

    Subclasses provide ``endpoint`` (and ``auth_headers``); ``default_api_version`` is the
    version used unless the ``api_version`` argument or setting says another.
    """

    parses_json_text = True
    #: the API version in the path, unless ``api_version`` says another.
    default_api_version = "v1beta"

    def __init__(self, *, api_version: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._api_version = api_version

    @property
    def api_version(self) -> str:
        return str(self._api_version or self._setting("api_version") or self.default_api_version)

    @staticmethod
    def action(stream: bool) -> str:
        """The method part of the URL (``:generateContent``, or the SSE stream's)."""
        return "streamGenerateContent?alt=sse" if stream else "generateContent"

    # -- the request body --------------------------------------------------------------------
    def build_body(self, request: ModelRequest, stream: bool) -> dict[str, Any]:
        return request_body(request, self.name)

    # -- the answer --------------------------------------------------------------------------
    def parse_response(self, data: Any) -> ModelResponse:
        if isinstance(data, dict) and isinstance(data.get("error"), dict):
            raise self.error_from_body(None, data)
        answer = Answer(self.name)
        answer.add(data, None)
        if not answer.seen_candidate and answer.blocked is None:
            raise InvalidResponseError(f"{self.name} answered without candidates")
        return answer.response()

    def stream_parser(self, on_chunk: ChunkCallback) -> StreamParser:
        answer = Answer(self.name)
        while (event := (yield)) is not None:
            if not event.data.strip():
                continue
            data = json.loads(event.data)
            if isinstance(data, dict) and isinstance(data.get("error"), dict):
                raise self.error_from_body(None, data)
            answer.add(data, on_chunk)
        if not answer.finished:
            raise StreamInterruptedError(f"{self.name} stream ended before a finishReason")
        return answer.response()

    # -- errors -------------------------------------------------------------------------------
    def _raise_for_status(self, response: httpx.Response) -> None:
        if response.status_code >= 400:
            raise self._error(response.status_code, response.text, response.headers)

    def _error(
        self, status: int, text: str, headers: Mapping[str, str] | None = None
    ) -> ProviderError:
        """error_for_status, knowing Google's envelope: a bad key is a 400 with reason
        API_KEY_INVALID, and a 429 says when to retry in a RetryInfo detail."""
        found = error_for_status(self.name, status, text, headers or {}, self._secrets())
        error = _envelope(text)
        details = [d for d in error.get("details") or () if isinstance(d, dict)]
        reasons = {str(d.get("reason") or "") for d in details}
        if isinstance(found, BadRequestError) and (
            any(reason.startswith("API_KEY_") for reason in reasons)
            or error.get("status") in ("UNAUTHENTICATED", "PERMISSION_DENIED")
        ):
            found = AuthenticationError(
                str(found), status=found.status, body=found.body, retry_after=found.retry_after
            )
        if found.retry_after is None:
            found.retry_after = _retry_delay(details)
        return found

    def error_from_body(self, status: int | None, data: Any) -> ProviderError:
        """Google's ``{"error": {...}}`` in place of an answer, mid-stream or as a batched
        request's outcome: without a status, its ``code`` (else its RPC status) says one."""
        error: Mapping[str, Any] = data["error"]
        code = error.get("code")
        status = status or (code if isinstance(code, int) and 400 <= code < 600 else None)
        status = status or _RPC_STATUS.get(str(error.get("status") or ""), 500)
        found = self._error(status, json.dumps({"error": dict(error)}))
        detail = redact(str(error.get("message") or ""), self._secrets())[:300]
        return type(found)(
            f"{self.name} reported an error ({error.get('status') or status}): {detail}",
            status=found.status,
            body=found.body,
            retry_after=found.retry_after,
        )


def _envelope(text: str) -> dict[str, Any]:
    """The ``error`` object of a Google API error body (empty when it isn't one)."""
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    if isinstance(data, list) and data:
        data = data[0]
    error = data.get("error") if isinstance(data, dict) else None
    return error if isinstance(error, dict) else {}


def _retry_delay(details: list[dict[str, Any]]) -> float | None:
    """Seconds from a ``google.rpc.RetryInfo`` detail (``"retryDelay": "48s"``)."""
    for detail in details:
        if not str(detail.get("@type") or "").endswith("google.rpc.RetryInfo"):
            continue
        delay = detail.get("retryDelay")
        if isinstance(delay, str) and delay.endswith("s"):
            try:
                return max(0.0, float(delay[:-1]))
            except ValueError:
                return None
        if isinstance(delay, dict):  # the proto form {"seconds": ..., "nanos": ...}
            return max(0.0, float(delay.get("seconds") or 0) + float(delay.get("nanos") or 0) / 1e9)
    return None

"""Turning HTTP failures into the ProviderError taxonomy, with secrets removed."""

from __future__ import annotations

import email.utils
import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import httpx

from ..exceptions import (
    AuthenticationError,
    BadRequestError,
    ContextLengthError,
    ProviderError,
    ProviderTimeout,
    RateLimitError,
    ServerError,
    StreamInterruptedError,
)
from .redaction import hide_url_credentials_in_logs, redact, redact_error, secrets_sent

__all__ = ["Sent", "call_errors", "error_for_status", "parse_retry_after", "status_of_error"]

#: given a request's arguments (``url``, ``headers``) as they go out, returns them: the
#: credentials they carry are then redacted from the call's errors (:func:`call_errors`).
Sent = Callable[[dict[str, Any]], dict[str, Any]]

# Phrases vendors use when the conversation doesn't fit the model.
_CONTEXT_MARKERS = (
    "context_length_exceeded",
    "context length",
    "context window",
    "prompt is too long",
    "too many tokens",
    "maximum context",
    "input token count",
    "exceeds the maximum number of tokens",
)

_MAX_BODY = 2000


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from ``retry-after-ms``, ``retry-after`` (seconds or an HTTP date)."""
    lowered = {key.lower(): value for key, value in headers.items()}
    if "retry-after-ms" in lowered:
        try:
            return max(0.0, float(lowered["retry-after-ms"]) / 1000)
        except ValueError:
            pass
    value = lowered.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        parsed = email.utils.parsedate_to_datetime(value) if value else None
        if parsed is None:
            return None
        return max(0.0, parsed.timestamp() - time.time())


def _error_message(body: str) -> str:
    """The vendor's own error message when the body is the usual JSON envelope."""
    try:
        data = json.loads(body)
    except ValueError:
        return body.strip()[:300]
    if isinstance(data, list) and data:
        data = data[0]
    if isinstance(data, dict):
        error = data.get("error", data)
        if isinstance(error, dict):
            return str(error.get("message") or error.get("type") or error)[:300]
        if isinstance(error, str):
            return error[:300]
    return body.strip()[:300]


def status_of_error(error: Any) -> int:
    """An HTTP status for an error object that came without one (with status 200, inside a
    stream, or as a batched request's outcome): its numeric ``code``, else its kind."""
    if not isinstance(error, dict):
        return 500
    code = error.get("code")
    if isinstance(code, int) and 400 <= code < 600:
        return code
    if isinstance(code, str) and code.isdigit() and 400 <= int(code) < 600:
        return int(code)
    kind = f"{error.get('type') or ''} {code or ''}".lower()
    if "rate_limit" in kind:
        return 429
    if "auth" in kind or "api_key" in kind or "permission" in kind:
        return 401
    if "context_length" in kind or "invalid_request" in kind:
        return 400
    return 500


def error_for_status(
    provider: str,
    status: int,
    body: str,
    headers: Mapping[str, str] | None = None,
    secrets: tuple[str, ...] = (),
) -> ProviderError:
    """The ProviderError for an HTTP error response (never raised here, returned), its
    body and message redacted (:func:`.redaction.redact`, with ``secrets``)."""
    body = redact(body, secrets)[:_MAX_BODY]
    detail = _error_message(body)
    message = f"{provider} returned HTTP {status}: {detail}"
    retry_after = parse_retry_after(headers or {})
    kind: type[ProviderError]
    lowered = body.lower()
    if status == 429:
        kind = RateLimitError
    elif status in (401, 403):
        kind = AuthenticationError
    elif status in (408, 504):
        kind = ProviderTimeout
    elif status >= 500:
        kind = ServerError  # 500, 502, 503 and Anthropic's 529 "overloaded"
    elif any(marker in lowered for marker in _CONTEXT_MARKERS):
        kind = ContextLengthError
    else:
        kind = BadRequestError
    return kind(message, status=status, body=body, retry_after=retry_after)


@contextmanager
def call_errors(provider: str, secrets: Callable[[], Iterable[str]]) -> Iterator[Sent]:
    """The boundary a provider call's errors leave by: httpx's errors become ProviderErrors,
    and every ProviderError (its message, body and the exceptions it was raised from) is
    redacted with ``secrets()`` and the credentials of each request given to the ``sent``
    it yields, whichever family and code path built it."""
    hide_url_credentials_in_logs()  # httpx logs each URL, an endpoint's password included
    posts: list[dict[str, Any]] = []

    def sent(post: dict[str, Any]) -> dict[str, Any]:
        posts.append(post)
        return post

    try:
        try:
            yield sent
        except httpx.TimeoutException as exc:
            raise ProviderTimeout(
                f"{provider} did not answer in time ({type(exc).__name__})"
            ) from exc
        except httpx.RemoteProtocolError as exc:
            raise StreamInterruptedError(f"{provider} closed the connection early: {exc}") from exc
        except httpx.TransportError as exc:
            raise ServerError(f"Could not reach {provider}: {exc}") from exc
    except ProviderError as error:
        carried = (
            secret
            for post in posts
            for secret in secrets_sent(post.get("headers") or {}, str(post.get("url") or ""))
        )
        redact_error(error, (*secrets(), *carried))
        raise

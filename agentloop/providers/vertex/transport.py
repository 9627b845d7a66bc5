"""google-auth's HTTP interface (``google.auth.transport.Request``) over an httpx client.

google-auth makes its own HTTP calls to refresh a token (the OAuth token endpoint, the
metadata server, the security token service of workload identity federation). They go
through the provider's httpx client, so they share its timeouts, transport and proxy, and
a test's ``httpx.MockTransport`` serves them like any other request.

This module imports google-auth when it is imported: ``credentials`` imports it only when
credentials are first needed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import google.auth.exceptions
import google.auth.transport
import httpx

__all__ = ["HTTPXRequest"]


class _Response(google.auth.transport.Response):
    """An httpx response as google-auth reads one."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response

    @property
    def status(self) -> int:
        return self._response.status_code

    @property
    def headers(self) -> Mapping[str, str]:
        return self._response.headers

    @property
    def data(self) -> bytes:
        return self._response.content


class HTTPXRequest(google.auth.transport.Request):
    """Makes google-auth's requests with ``client`` (the provider's httpx client)."""

    def __init__(self, client: httpx.Client) -> None:
        self.client = client

    def __call__(
        self,
        url: str,
        method: str = "GET",
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> _Response:
        try:
            response = self.client.request(
                method,
                url,
                content=body,
                headers=dict(headers or {}),
                timeout=httpx.USE_CLIENT_DEFAULT if timeout is None else timeout,
            )
        except httpx.HTTPError as exc:
            # google-auth retries or reports a TransportError; its message names no secret.
            raise google.auth.exceptions.TransportError(
                f"{type(exc).__name__} reaching {httpx.URL(url).host}"
            ) from exc
        return _Response(response)

"""The cap on an answer's size (``AGENTLOOP["MAX_RESPONSE_BYTES"]``), for HTTP providers.

:func:`cap_response` is applied to a response before its body is read: a declared length
over the cap fails at once, and the body, plain or streamed, is counted as it arrives, so a
runaway answer fails early and is never held whole in memory.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx

from ..conf import agentloop_settings
from ..exceptions import ResponseTooLargeError

__all__ = ["cap_response"]


class _Budget:
    """Counts a body's bytes as received (before any content decoding), as they arrive,
    and raises ResponseTooLargeError past ``limit``: a runaway answer fails early and is
    never held whole in memory."""

    def __init__(self, limit: int, provider: str) -> None:
        self.limit = limit
        self.provider = provider
        self.received = 0

    def take(self, chunk: bytes) -> bytes:
        self.received += len(chunk)
        if self.received > self.limit:
            raise _too_large(self.provider, self.limit)
        return chunk


class _CappedStream(httpx.SyncByteStream):
    """A response body read through a :class:`_Budget`."""

    def __init__(self, stream: httpx.SyncByteStream, budget: _Budget) -> None:
        self.stream = stream
        self.budget = budget

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.stream:
            yield self.budget.take(chunk)

    def close(self) -> None:
        self.stream.close()


class _AsyncCappedStream(httpx.AsyncByteStream):
    """An async response body read through a :class:`_Budget`."""

    def __init__(self, stream: httpx.AsyncByteStream, budget: _Budget) -> None:
        self.stream = stream
        self.budget = budget

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.stream:
            yield self.budget.take(chunk)

    async def aclose(self) -> None:
        await self.stream.aclose()


def _too_large(provider: str, limit: int) -> ResponseTooLargeError:
    return ResponseTooLargeError(
        f"{provider} answered with more than MAX_RESPONSE_BYTES ({limit} bytes): "
        "the answer was refused"
    )


def cap_response(response: httpx.Response, provider: str) -> None:
    """Apply ``MAX_RESPONSE_BYTES`` to ``response`` before its body is read."""
    limit = agentloop_settings.MAX_RESPONSE_BYTES
    if limit is None:
        return
    limit = int(limit)
    length = response.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise _too_large(provider, limit)  # said up front: not a byte of it is read
    if isinstance(response.stream, httpx.SyncByteStream):
        response.stream = _CappedStream(response.stream, _Budget(limit, provider))
    elif isinstance(response.stream, httpx.AsyncByteStream):
        response.stream = _AsyncCappedStream(response.stream, _Budget(limit, provider))

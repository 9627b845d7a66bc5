"""ConverseStream's body: ``application/vnd.amazon.eventstream`` frames, decoded by botocore's
``EventStreamBuffer``, and its exception events."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...exceptions import InvalidResponseError
from ..http import StreamDecoder
from .answer import payload
from .signing import require_botocore

__all__ = ["EXCEPTION_STATUS", "Event", "event_decoder"]

#: the HTTP status each Bedrock exception has as a response (the API reference), for the
#: exceptions a stream reports as events: they map to the same ProviderError subclass.
EXCEPTION_STATUS = {
    "validationexception": 400,
    "servicequotaexceededexception": 400,
    "accessdeniedexception": 403,
    "unrecognizedclientexception": 403,
    "expiredtokenexception": 403,
    "resourcenotfoundexception": 404,
    "modeltimeoutexception": 408,
    "throttlingexception": 429,
    "modelerrorexception": 500,
    "modelstreamerrorexception": 500,
    "internalserverexception": 500,
    "serviceunavailableexception": 503,
}


@dataclass(frozen=True)
class Event:
    """One decoded frame: its ``:message-type`` ("event", "exception" or "error"), its kind
    (the event, exception or error type) and its JSON payload."""

    message_type: str
    kind: str
    payload: dict[str, Any]


def event_decoder(provider: str) -> StreamDecoder:
    """A decoder of one stream: fed the body's pieces, it returns the frames completed."""
    eventstream = require_botocore().eventstream
    buffer = eventstream.EventStreamBuffer()

    def decode(piece: bytes) -> list[Event]:
        buffer.add_data(piece)
        try:
            messages = list(buffer)
        except eventstream.ParserError as exc:
            raise InvalidResponseError(
                f"{provider} streamed an event-stream frame that could not be read "
                f"({type(exc).__name__}: {exc})"
            ) from exc
        return [_event(provider, message) for message in messages]

    return decode


def _event(provider: str, message: Any) -> Event:
    headers = message.headers
    message_type = str(headers.get(":message-type") or "event")
    if message_type == "error":  # a protocol-level error: its code and message in headers
        kind = str(headers.get(":error-code") or "InternalServerException")
        return Event("error", kind, {"message": str(headers.get(":error-message") or kind)})
    kind = headers.get(":exception-type" if message_type == "exception" else ":event-type")
    return Event(message_type, str(kind or ""), payload(provider, message.payload))

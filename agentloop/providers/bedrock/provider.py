"""``BedrockProvider``: Converse over HTTP, SigV4-signed, its errors and its prices."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping
from decimal import Decimal
from typing import Any
from urllib.parse import quote

import httpx

from ...exceptions import ConfigurationError, ContextLengthError, ProviderError
from ...exceptions import StreamInterruptedError as Interrupted
from ...messages import ModelRequest, ModelResponse, TokenUsage
from ..base import ChunkCallback
from ..catalog import price_of
from ..common import json_text
from ..errors import error_for_status
from ..http import HTTPProvider, StreamDecoder, StreamParser
from ..redaction import redact
from .answer import Answer
from .mapping import request_body
from .signing import AWSAuth, require_botocore
from .stream import EXCEPTION_STATUS, Event, event_decoder

__all__ = ["BedrockProvider", "base_model"]

# How Bedrock says the conversation doesn't fit the model (a ValidationException): Nova,
# Claude ("prompt is too long", also caught by the shared markers) and others.
_CONTEXT_MESSAGES = re.compile(
    r"input tokens? exceed|too many input tokens|input is too long|prompt is too long"
    r"|exceeds? the (?:maximum )?context|context (?:length|window)",
    re.IGNORECASE,
)
# A geographic cross-region inference profile: the base model's id after the prefix, at
# the base model's price (global profiles are priced apart, so they are not stripped).
_GEO_PROFILE = re.compile(r"^(?:us|eu|apac|jp|au|ca|us-gov)\.(?=[a-z0-9-]+\.)")


def base_model(model: str) -> str:
    """The model id a geographic inference profile (``us.amazon.nova-2-lite-v1:0``) runs."""
    return _GEO_PROFILE.sub("", model)


class BedrockProvider(HTTPProvider):
    """Models on AWS Bedrock through the Converse API, signed with the AWS credentials chain.

    Settings (``AGENTLOOP["PROVIDERS"]["bedrock"]``): ``region`` (else ``AWS_REGION``,
    ``AWS_DEFAULT_REGION`` or the profile's region), ``profile`` (a named AWS profile),
    ``endpoint_url`` (instead of ``https://bedrock-runtime.{region}.amazonaws.com``: a VPC
    endpoint or a gateway), ``timeout``, ``headers``. A Bedrock API key (``api_key``, else
    ``AWS_BEARER_TOKEN_BEDROCK``) is sent as a bearer token instead of signing.
    """

    name = "bedrock"
    api_key_env = ("AWS_BEARER_TOKEN_BEDROCK",)
    requires_key = False  # the AWS credentials chain signs instead
    parses_json_text = True

    def __init__(
        self,
        *,
        region: str | None = None,
        profile: str | None = None,
        session: Any = None,
        **kwargs: Any,
    ) -> None:
        require_botocore()
        super().__init__(**kwargs)
        self._region = region
        self._profile = profile
        self._session = session
        self._auth: AWSAuth | None = None
        self._auth_lock = threading.Lock()  # not _lock: ``client`` holds it to read base_url

    def __repr__(self) -> str:  # never resolves anything (nor fails)
        return f"<{type(self).__name__} name={self.name!r} region={self._region!r}>"

    # -- configuration -----------------------------------------------------------------------
    @property
    def auth(self) -> AWSAuth:
        """Where credentials and the region come from (made on first use)."""
        with self._auth_lock:
            if self._auth is None:
                self._auth = AWSAuth(
                    region=self._region or self._setting("region"),
                    profile=self._profile or self._setting("profile"),
                    session=self._session,
                )
            return self._auth

    def region(self) -> str:
        """The region requests go to and are signed for, or ConfigurationError."""
        region = self.auth.region()
        if not region:
            raise ConfigurationError(
                f"No AWS region for provider {self.name!r}: set "
                f"AGENTLOOP['PROVIDERS'][{self.name!r}]['region'], AWS_REGION or "
                "AWS_DEFAULT_REGION, or a region in the AWS profile."
            )
        return region

    @property
    def base_url(self) -> str:
        explicit = self._configured_url()  # checked, as every HTTP provider's
        if explicit:
            return explicit.rstrip("/")
        return f"https://bedrock-runtime.{self.region()}.amazonaws.com"

    def credential_secrets(self) -> tuple[str, ...]:
        """The AWS secret key and session token, once a request was signed with them (never
        resolving the credentials chain for an error; the SigV4 headers a request carried
        are redacted from its errors as sent)."""
        auth = self._auth
        if auth is None or not auth.signed:
            return ()
        try:
            credentials = auth.credentials()
        except ProviderError:
            return ()
        found = (credentials.secret_key or "", credentials.token or "")
        return tuple(secret for secret in found if secret)

    # -- HTTP --------------------------------------------------------------------------------
    def endpoint(self, request: ModelRequest, stream: bool) -> str:
        # Percent-encoded as AWS's SDKs send it (":" of versions, "/" of ARNs): the path
        # signed is the path the service reads.
        action = "converse-stream" if stream else "converse"
        return f"/model/{quote(request.model, safe='')}/{action}"

    def sign(self, post: dict[str, Any]) -> dict[str, Any]:
        """The body as bytes, signed with SigV4 (unless a Bedrock API key is sent)."""
        headers = dict(post["headers"])
        if any(key.lower() == "authorization" for key in headers):
            return post  # a bearer API key
        content = json_text(post.pop("json")).encode("utf-8")
        headers["Content-Type"] = "application/json"
        url = self.base_url + post["url"]
        post["headers"] = self.auth.sign(url, content, headers, self.region())
        post["content"] = content
        return post

    def build_body(self, request: ModelRequest, stream: bool) -> dict[str, Any]:
        return request_body(request, self.name)

    # -- the answer ------------------------------------------------------------------------------
    def parse_response(self, data: Any) -> ModelResponse:
        return Answer.of(self.name, data).response()

    def stream_decoder(self) -> StreamDecoder:
        return event_decoder(self.name)

    def stream_parser(self, on_chunk: ChunkCallback) -> StreamParser:
        answer = Answer(self.name, on_chunk)
        while (event := (yield)) is not None:
            if not isinstance(event, Event):
                raise TypeError(f"not a Bedrock stream event: {event!r}")
            if event.message_type != "event":
                raise self._stream_error(event)
            answer.event(event.kind, event.payload)
            if event.kind == "metadata" and answer.stopped:
                return answer.response()  # the last event of a stream
        if not answer.stopped:
            raise Interrupted(f"{self.name} stream ended before messageStop")
        return answer.response()

    # -- errors ----------------------------------------------------------------------------------
    def _raise_for_status(self, response: httpx.Response) -> None:
        if response.status_code >= 400:
            kind = response.headers.get("x-amzn-errortype", "").partition(":")[0]
            raise self._error(response.status_code, kind, response.text, response.headers)

    def _error(
        self, status: int, kind: str, text: str, headers: Mapping[str, str] | None = None
    ) -> ProviderError:
        """error_for_status, knowing Bedrock's exception names: a ValidationException that
        says the input is too long is a ContextLengthError (compaction's cue)."""
        found = error_for_status(self.name, status, text, headers or {}, self._secrets())
        if kind:
            detail = str(found).partition(": ")[2]
            message = f"{self.name} returned HTTP {status} ({kind}): {detail}"
            found = type(found)(
                message, status=status, body=found.body, retry_after=found.retry_after
            )
        if (
            kind.lower() in ("", "validationexception")
            and status == 400
            and _CONTEXT_MESSAGES.search(found.body or "")
            and not isinstance(found, ContextLengthError)
        ):
            found = ContextLengthError(
                str(found), status=status, body=found.body, retry_after=found.retry_after
            )
        return found

    def _stream_error(self, event: Event) -> ProviderError:
        """An exception event mid-stream, as the error the same exception is as a response."""
        status = EXCEPTION_STATUS.get(event.kind.lower(), 500)
        found = self._error(status, event.kind, json.dumps(event.payload))
        detail = redact(str(event.payload.get("message") or event.kind), self._secrets())[:300]
        return type(found)(
            f"{self.name} reported an error mid-stream ({event.kind}): {detail}",
            status=status,
            body=found.body,
            retry_after=found.retry_after,
        )

    def error_from_body(self, status: int | None, data: Any) -> ProviderError:
        """Bedrock's ``{"message": ...}`` error body, with its exception name when given."""
        kind = str(data.get("__type") or data.get("code") or "") if isinstance(data, dict) else ""
        kind = kind.rpartition("#")[2]
        status = status or EXCEPTION_STATUS.get(kind.lower(), 500)
        return self._error(status, kind, json.dumps(data))

    # -- prices ------------------------------------------------------------------------------------
    def cost(self, model: str, usage: TokenUsage) -> Decimal | None:
        """The model's price (``AGENTLOOP["PRICES"]``, the catalog, genai-prices: see
        ``price_of``); a geographic profile without one takes its base model's."""
        kind, name = type(self).name, self.name
        found = price_of(model, usage, provider=kind, configured=name)
        if found is None:
            found = price_of(base_model(model), usage, provider=kind, configured=name)
        return found

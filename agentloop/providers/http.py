"""The base of providers spoken to over HTTP: keys, clients, errors, SSE streams.

Subclasses say how a request becomes a body (``build_body``), where it goes
(``endpoint``), how a JSON answer parses (``parse_response``) and how a stream of
server-sent events parses (``parse_stream``). Everything else lives here once,
including the cap on an answer's size (``AGENTLOOP["MAX_RESPONSE_BYTES"]``, applied by
:mod:`.response_cap`).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from decimal import Decimal
from typing import Any, cast, final

import httpx
from httpx_sse import ServerSentEvent, aconnect_sse, connect_sse

from ..conf import agentloop_settings
from ..exceptions import ConfigurationError, InvalidResponseError, ProviderError
from ..messages import Chunk, ModelRequest, ModelResponse, TokenUsage
from . import watchdog
from .base import AsyncChunkCallback, ChunkCallback, Provider
from .catalog import price_of
from .client_pool import Lanes, read_to_the_end, tls_context
from .common import with_parsed_json
from .endpoints import configured_url, proxy_url, shown_address
from .errors import call_errors, error_for_status, status_of_error
from .redaction import redact, secrets_sent, url_secrets
from .response_cap import cap_response

__all__ = ["HTTPProvider", "StreamDecoder", "StreamParser"]

_DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=10.0)

#: a push parser of a stream: sent each server-sent event, then None at the end of the
#: stream; it returns the answer (``StopIteration.value``), possibly before the end.
StreamParser = Generator[None, ServerSentEvent | None, ModelResponse]

#: sent each piece of a non-SSE streamed body, returns the events completed (for the parser).
StreamDecoder = Callable[[bytes], Iterable[Any]]


def _feed(parser: StreamParser, event: ServerSentEvent | None) -> ModelResponse | None:
    """Push one event (None: the stream ended) into ``parser``; its answer once it has one."""
    try:
        parser.send(event)
    except StopIteration as stop:
        answer: ModelResponse = stop.value
        return answer
    return None


class HTTPProvider(Provider):
    """A provider reached over HTTP with an API key.

    Configuration, first found wins: the constructor's arguments, then
    ``settings.AGENTLOOP["PROVIDERS"][name]`` (``api_key``, ``endpoint_url`` or its older
    name ``base_url``, ``proxy``, ``timeout``, ``headers``), then the environment variables
    in ``api_key_env``. The key and a proxy's password are never stored on the chat,
    logged, or shown in errors and reprs.
    """

    #: default base URL of the vendor's API.
    default_base_url: str = ""
    #: environment variables that may hold the key, in order.
    api_key_env: tuple[str, ...] = ()
    #: False for local servers that need no key (Ollama, vLLM).
    requires_key: bool = True
    #: the vendor sends structured output as JSON text only: ``parsed`` is set from the
    #: answer's text when the request has an ``output_schema``.
    parses_json_text: bool = False

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        endpoint_url: str | None = None,
        proxy: str | None = None,
        timeout: float | httpx.Timeout | None = None,
        headers: Mapping[str, str] | None = None,
        name: str | None = None,
        transport: httpx.BaseTransport | None = None,
        requires_key: bool | None = None,
    ) -> None:
        if name:
            self.name = name
        if requires_key is not None:
            self.requires_key = requires_key
        self._api_key = api_key
        self._base_url = base_url
        self._endpoint_url = endpoint_url
        self._proxy = proxy
        self._timeout = timeout
        self._headers = dict(headers or {})
        self._transport = transport
        self._client: httpx.Client | None = None
        self._lanes: Lanes | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        where = shown_address(lambda: self.base_url, self._proxy or self._setting("proxy"))
        return f"<{type(self).__name__} name={self.name!r} {where}>"

    # -- configuration -------------------------------------------------------------------
    def _setting(self, key: str) -> Any:
        configured = agentloop_settings.PROVIDERS.get(self.name) or {}
        return configured.get(key)

    @property
    def base_url(self) -> str:
        """Where requests go: ``endpoint_url`` (or ``base_url``), else the vendor's URL."""
        return (self._configured_url() or self.default_base_url).rstrip("/")

    def _configured_url(self) -> str | None:
        """The constructor's ``endpoint_url``/``base_url``, else the settings' (checked)."""
        return configured_url(
            self.name,
            (self._endpoint_url, self._base_url),
            (self._setting("endpoint_url"), self._setting("base_url")),
        )

    def proxy(self) -> str | None:
        """The proxy URL every request goes through (``proxy``), checked; None: none (httpx
        still honours the ``HTTPS_PROXY``-style environment variables)."""
        return proxy_url(self.name, self._proxy or self._setting("proxy"))

    def api_key(self) -> str | None:
        """The key, or ConfigurationError naming where to set it when one is required."""
        key = self._api_key or self._setting("api_key")
        for variable in self.api_key_env:
            key = key or os.environ.get(variable)
        if not key and self.requires_key:
            places = " or ".join(
                f"the {variable} environment variable" for variable in self.api_key_env
            )
            raise ConfigurationError(
                f"No API key for provider {self.name!r}: set "
                f"AGENTLOOP['PROVIDERS'][{self.name!r}]['api_key']"
                + (f" or {places}" if places else "")
                + "."
            )
        return key or None

    @final
    def _secrets(self) -> tuple[str, ...]:
        """What no error may repeat (see :mod:`.redaction`): the key, the endpoint's and the
        proxy's credentials, those in the ``headers`` setting, and the family's own
        (:meth:`credential_secrets`). Final, so no family can leave one out."""
        try:
            key = self.api_key()
        except ConfigurationError:
            key = None
        try:
            endpoint = self.base_url
        except ConfigurationError:
            endpoint = ""
        configured = {**(self._setting("headers") or {}), **self._headers}
        found = (
            key or "",
            *url_secrets(self._proxy or self._setting("proxy")),
            *url_secrets(endpoint),
            *secrets_sent(configured),
            *self.credential_secrets(),
        )
        return tuple(dict.fromkeys(secret for secret in found if secret))

    def credential_secrets(self) -> tuple[str, ...]:
        """The family's secrets an error could repeat beyond those (an OAuth token, AWS
        keys), as already fetched, never raising; none here."""
        return ()

    def _timeout_setting(self) -> httpx.Timeout:
        timeout = self._timeout or self._setting("timeout") or _DEFAULT_TIMEOUT
        return timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)

    @property
    def client(self) -> httpx.Client:
        """One pooled client per provider instance, made on first use."""
        with self._lock:
            if self._client is None:
                self._client = httpx.Client(
                    base_url=self.base_url,
                    timeout=self._timeout_setting(),
                    transport=self._transport,
                    limits=self._limits(),
                    proxy=self.proxy(),
                    verify=tls_context(),
                )
            return self._client

    def _call_lanes(self) -> Lanes | None:
        """The model calls' clients, one connection each (``client_pool.py``); None with a
        transport of the caller's (one object: the client is made over it)."""
        if self._transport is not None:
            return None
        with self._lock:
            if self._lanes is None:
                limits = self._limits()
                self._lanes = Lanes(
                    limits, base_url=self.base_url, timeout=self._timeout_setting(),
                    proxy=self.proxy(),
                )  # fmt: skip
            return self._lanes

    @contextmanager
    def _calling(self, post: dict[str, Any]) -> Iterator[httpx.Client]:
        """The client one model call is sent through (and read from, inside the block)."""
        lanes = self._call_lanes()
        if lanes is None:
            yield self.client
            return
        timeout = post.get("timeout") or self._timeout_setting()
        with lanes.lane(timeout.pool) as client:
            yield client

    def _limits(self) -> httpx.Limits:
        """``PROVIDERS[name]["max_connections"]``: the connections one process keeps open to
        the provider (httpx's default, 100, caps the calls in flight of a gevent worker)."""
        size = self._setting("max_connections")
        if size is None:
            return httpx.Limits(max_connections=100, max_keepalive_connections=20)
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigurationError(
                f"AGENTLOOP['PROVIDERS'][{self.name!r}]['max_connections'] must be a whole "
                f"number of at least 1, not {size!r}"
            )
        return httpx.Limits(max_connections=size, max_keepalive_connections=size)

    @asynccontextmanager
    async def _async_calling(self, post: dict[str, Any]) -> AsyncIterator[httpx.AsyncClient]:
        """``_calling`` for an async call (a caller's transport is async here: ``arequest``)."""
        lanes = self._call_lanes()
        if lanes is not None:
            timeout = post.get("timeout") or self._timeout_setting()
            async with lanes.alane(timeout.pool) as client:
                yield client
            return
        transport = cast(httpx.AsyncBaseTransport, self._transport)
        async with httpx.AsyncClient(
            base_url=self.base_url, timeout=self._timeout_setting(), transport=transport,
            proxy=self.proxy(), verify=tls_context(),
        ) as client:  # fmt: skip
            yield client

    def close(self) -> None:
        """Close the HTTP clients (new ones are made if the provider is used again)."""
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None
            if self._lanes is not None:
                self._lanes.close()
                self._lanes = None

    # -- what subclasses provide -------------------------------------------------------------
    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        """Headers carrying the key (default: ``Authorization: Bearer``)."""
        return {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def endpoint(self, request: ModelRequest, stream: bool) -> str:
        """The path (or URL) to POST to."""
        raise NotImplementedError

    def build_body(self, request: ModelRequest, stream: bool) -> dict[str, Any]:
        """The JSON body for ``request``."""
        raise NotImplementedError

    def parse_response(self, data: Any) -> ModelResponse:
        """A ModelResponse from a JSON answer."""
        raise NotImplementedError

    def sign(self, post: dict[str, Any]) -> dict[str, Any]:
        """The POST's arguments as sent, on every attempt (AWS SigV4 signs here): unchanged."""
        return post

    def stream_decoder(self) -> StreamDecoder | None:
        """A decoder of streamed bodies, new for each stream; None: server-sent events."""
        return None

    def stream_parser(self, on_chunk: ChunkCallback) -> StreamParser:
        """A push parser of the SSE stream (a generator: see :data:`StreamParser`), calling
        ``on_chunk`` as pieces arrive. Both the sync and the async requests feed it."""
        raise NotImplementedError

    def parse_stream(
        self, events: Iterator[ServerSentEvent], on_chunk: ChunkCallback
    ) -> ModelResponse:
        """A ModelResponse from SSE events, calling ``on_chunk`` as pieces arrive (feeds
        :meth:`stream_parser`; a subclass may override this instead, sync requests only)."""
        parser = self.stream_parser(on_chunk)
        next(parser)
        for event in events:
            answer = _feed(parser, event)
            if answer is not None:
                return answer
        return self._last_answer(parser)

    async def _aparse_stream(
        self, events: AsyncIterator[ServerSentEvent], on_chunk: AsyncChunkCallback
    ) -> ModelResponse:
        """:meth:`parse_stream` over an async stream: each event's chunks are awaited
        before the next event is read."""
        chunks: list[Chunk] = []
        parser = self.stream_parser(chunks.append)
        next(parser)
        async for event in events:
            answer = _feed(parser, event)
            for chunk in chunks:
                await on_chunk(chunk)
            chunks.clear()
            if answer is not None:
                return answer
        answer = self._last_answer(parser)
        for chunk in chunks:
            await on_chunk(chunk)
        return answer

    def _last_answer(self, parser: StreamParser) -> ModelResponse:
        answer = _feed(parser, None)
        if answer is None:
            raise InvalidResponseError(f"{self.name}: the stream parser gave no answer at its end")
        return answer

    def error_from_body(self, status: int | None, data: Any) -> ProviderError:
        """The ProviderError for an error body the vendor sent instead of an answer: with
        HTTP 200, mid-stream, or as one batched request's outcome.

        ``status`` is the HTTP status when there was one. Default: the usual
        ``{"error": {...}}`` envelope, without a status mapped by the error object's code or
        kind. Vendors whose error objects say more override this.
        """
        if status is None:
            status = status_of_error(data.get("error") if isinstance(data, dict) else None)
        return error_for_status(self.name, status, json.dumps(data), {}, self._secrets())

    # -- the request ---------------------------------------------------------------------------
    def _headers_for(self, request: ModelRequest) -> dict[str, str]:
        headers = self._plain_headers()
        headers.update(request.headers)
        return headers

    def request(
        self, request: ModelRequest, *, on_chunk: ChunkCallback | None = None
    ) -> ModelResponse:
        response = self._answer(request, on_chunk)
        return with_parsed_json(request, response) if self.parses_json_text else response

    async def arequest(
        self, request: ModelRequest, *, on_chunk: AsyncChunkCallback | None = None
    ) -> ModelResponse:
        """``request()`` over ``httpx.AsyncClient``: the same body, errors, size cap and
        stream parser. A provider given a sync-only transport, or whose subclass parses
        streams with ``parse_stream`` only, runs ``request()`` on a thread instead."""
        transport = self._transport
        own_parser = type(self).stream_parser is not HTTPProvider.stream_parser
        if (transport is not None and not isinstance(transport, httpx.AsyncBaseTransport)) or (
            on_chunk is not None and not own_parser
        ):
            return await super().arequest(request, on_chunk=on_chunk)
        response = await self._aanswer(request, on_chunk)
        return with_parsed_json(request, response) if self.parses_json_text else response

    def _post(self, request: ModelRequest, stream: bool) -> dict[str, Any]:
        """The arguments of the POST for ``request``."""
        body = self.build_body(request, stream)
        return self._signed_post(self.endpoint(request, stream), body, self._headers_for(request))

    def _signed_post(self, url: str, body: Any, headers: dict[str, str]) -> dict[str, Any]:
        """The arguments of a JSON POST to ``url``: the call's deadline, then signed."""
        post: dict[str, Any] = {"url": url, "json": body, "headers": headers}
        left = watchdog.remaining()
        if left is not None:
            # No single wait (connecting, the headers, a read) outlasts the call's deadline;
            # never 0, which makes a socket non-blocking (a connect then fails with EINPROGRESS).
            left = max(left, 0.001)
            timeout = self._timeout_setting()
            post["timeout"] = httpx.Timeout(
                connect=min(timeout.connect or left, left),
                read=min(timeout.read or left, left),
                write=min(timeout.write or left, left),
                pool=min(timeout.pool or left, left),
            )
        return self.sign(post)

    def _answer(self, request: ModelRequest, on_chunk: ChunkCallback | None) -> ModelResponse:
        with call_errors(self.name, self._secrets) as sent:
            post = sent(self._post(request, on_chunk is not None))
            with self._calling(post) as client:
                if on_chunk is None:
                    with client.stream("POST", **post) as response:
                        watchdog.watch_response(response)  # a cancel or the deadline shuts it
                        cap_response(response, self.name)
                        response.read()
                    return self._json_answer(response)
                decoder = self.stream_decoder()
                if decoder is not None:
                    with client.stream("POST", **post) as response:
                        self._check_stream(response)
                        parts = response.iter_bytes()
                        pieces = (event for part in parts for event in decoder(part))
                        answer = self._parse_stream(pieces, on_chunk)
                        read_to_the_end(pieces)
                        return answer
                with connect_sse(client, "POST", **post) as source:
                    self._check_stream(source.response)
                    events = source.iter_sse()
                    answer = self._parse_stream(events, on_chunk)
                    read_to_the_end(events)
                    return answer

    def _check_stream(self, response: httpx.Response) -> None:  # watch, cap, raise its error
        watchdog.watch_response(response)  # a cancel or the deadline shuts it
        cap_response(response, self.name)
        if response.status_code >= 400:
            response.read()
            self._raise_for_status(response)

    async def _aanswer(
        self, request: ModelRequest, on_chunk: AsyncChunkCallback | None
    ) -> ModelResponse:
        with call_errors(self.name, self._secrets) as sent:
            post = sent(self._post(request, on_chunk is not None))
            async with self._async_calling(post) as client:
                if on_chunk is None:
                    async with client.stream("POST", **post) as response:
                        cap_response(response, self.name)
                        await response.aread()
                    return self._json_answer(response)
                decoder = self.stream_decoder()
                if decoder is not None:
                    async with client.stream("POST", **post) as response:
                        await self._acheck_stream(response)
                        pieces = response.aiter_bytes()
                        events = (event async for piece in pieces for event in decoder(piece))
                        with self._unexpected_shape("streamed"):
                            return await self._aparse_stream(events, on_chunk)
                async with aconnect_sse(client, "POST", **post) as source:
                    await self._acheck_stream(source.response)
                    with self._unexpected_shape("streamed"):
                        return await self._aparse_stream(source.aiter_sse(), on_chunk)

    async def _acheck_stream(self, response: httpx.Response) -> None:  # cap, raise its error
        cap_response(response, self.name)
        if response.status_code >= 400:
            await response.aread()
            self._raise_for_status(response)

    # -- other JSON calls (embeddings): the same client, headers, signing, cap and errors ---------
    def _plain_headers(self) -> dict[str, str]:
        headers = self.auth_headers(self.api_key())
        headers.update(self._setting("headers") or {})
        headers.update(self._headers)
        return headers

    def post_json(self, url: str, body: Any) -> Any:
        """POST ``body`` as JSON to ``url`` (a path under ``base_url``, or a whole URL) and
        return the JSON answer: the key, headers, signing, size cap and error mapping of a
        model call (``agentloop.embed`` sends its requests through this)."""
        with call_errors(self.name, self._secrets) as sent:
            post = sent(self._signed_post(url, body, self._plain_headers()))
            with self._calling(post) as client:
                with client.stream("POST", **post) as response:
                    watchdog.watch_response(response)  # a cancel or the deadline shuts it
                    cap_response(response, self.name)
                    response.read()
            return self._json_of(response)

    async def apost_json(self, url: str, body: Any) -> Any:
        """:meth:`post_json` over ``httpx.AsyncClient`` (on a thread with a sync-only
        transport). The headers are made on a thread: an OAuth token or a signature may
        need blocking calls (google-auth, Entra ID, botocore)."""
        transport = self._transport
        if transport is not None and not isinstance(transport, httpx.AsyncBaseTransport):
            return await asyncio.to_thread(self.post_json, url, body)
        with call_errors(self.name, self._secrets) as sent:
            post = sent(
                await asyncio.to_thread(lambda: self._signed_post(url, body, self._plain_headers()))
            )
            async with self._async_calling(post) as client:
                async with client.stream("POST", **post) as response:
                    cap_response(response, self.name)
                    await response.aread()
            return self._json_of(response)

    def _json_of(self, response: httpx.Response) -> Any:
        """The JSON of a read, non-streamed response (or its error)."""
        self._raise_for_status(response)
        try:
            return response.json()
        except ValueError as exc:
            raise InvalidResponseError(
                f"{self.name} answered with invalid JSON",
                status=response.status_code,
                body=redact(response.text[:2000], self._secrets()),
            ) from exc

    def _json_answer(self, response: httpx.Response) -> ModelResponse:
        """The answer of a read, non-streamed response (or its error)."""
        return self._parse(self._json_of(response))

    def _parse(self, data: Any) -> ModelResponse:
        with self._unexpected_shape("answered in"):
            return self.parse_response(data)

    def _parse_stream(
        self, events: Iterator[ServerSentEvent], on_chunk: ChunkCallback
    ) -> ModelResponse:
        with self._unexpected_shape("streamed"):
            return self.parse_stream(events, on_chunk)

    @contextmanager
    def _unexpected_shape(self, verb: str) -> Iterator[None]:
        """A parser tripping over an answer's shape raises InvalidResponseError."""
        try:
            yield
        except ProviderError:
            raise
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise InvalidResponseError(
                f"{self.name} {verb} an unexpected shape: {type(exc).__name__}: {exc}"
            ) from exc

    def _raise_for_status(self, response: httpx.Response) -> None:
        if response.status_code < 400:
            return
        raise error_for_status(
            self.name, response.status_code, response.text, response.headers, self._secrets()
        )

    # -- prices ----------------------------------------------------------------------------------
    def cost(self, model: str, usage: TokenUsage) -> Decimal | None:
        # The class's name (a BUILTINS name): a Vertex AI provider configured as "vertex-eu"
        # is priced by the catalog's vertexai entries, unless PRICES names "vertex-eu:...".
        return price_of(model, usage, provider=type(self).name, configured=self.name)

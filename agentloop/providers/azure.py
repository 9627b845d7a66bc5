"""Azure AI Foundry and Azure OpenAI (``azure:<deployment>``): one provider, two routes.

A Foundry resource (``https://NAME.services.ai.azure.com``) serves its deployments on two
wire formats, and :class:`AzureProvider` sends each model to one of them (:func:`route_for`):

- ``"chat"``: the model-inference Chat Completions route,
  ``{endpoint}/models/chat/completions?api-version=2024-05-01-preview``, the deployment in
  ``model`` (Grok, Llama, Mistral, DeepSeek, and the OpenAI models up to gpt-5.3), mapped by
  :class:`AzureChatProvider`, a dialect of :class:`~agentloop.providers.openai.OpenAIProvider`;
- ``"responses"``: the OpenAI v1 Responses route, ``{endpoint}/openai/v1/responses``, for the
  generations that need it (gpt-5.4 and later, codex and pro models), mapped by
  :class:`AzureResponsesProvider`, which is
  :class:`~agentloop.providers.openai_responses.OpenAIResponsesProvider` at another URL.

Both authenticate alike (:class:`_AzureConnection`): an ``api-key`` header, or a Microsoft
Entra ID bearer token (see :mod:`agentloop.providers.azure_auth`). Settings, in
``AGENTLOOP["PROVIDERS"]["azure"]``: ``endpoint``, ``api_key``, ``credential``,
``api_version``, ``route`` and ``routes`` (see docs/providers/azure.md).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from asgiref.sync import sync_to_async

from ..exceptions import ConfigurationError
from ..messages import ModelRequest, ModelResponse, TokenUsage
from .azure_auth import EntraTokens, credential_from
from .base import AsyncChunkCallback, ChunkCallback, Provider
from .catalog import price_of
from .errors import call_errors
from .http import HTTPProvider
from .openai import OpenAIProvider
from .openai_responses import OpenAIResponsesProvider

__all__ = [
    "DEFAULT_API_VERSION",
    "ROUTES",
    "AzureChatProvider",
    "AzureProvider",
    "AzureResponsesProvider",
    "route_for",
]

#: the routes a model can be sent to.
ROUTES = ("chat", "responses")
#: the model-inference API version the chat route asks for (``api_version`` overrides it).
DEFAULT_API_VERSION = "2024-05-01-preview"

# The route rule, in one place: model (or deployment) names served on Responses. A name
# may carry a prefix ("prod-gpt-5.6"). Why each: from gpt-5.6 on, Chat Completions rejects
# function tools unless reasoning is off (Microsoft's Chat Completions how-to), and gpt-5.4
# and 5.5 are of the same Responses-first generation; codex and pro models are served on
# Responses only. Everything else (Grok, Llama, Mistral, gpt-4.x, gpt-5 to 5.3, o-series)
# stays on Chat Completions, which every Foundry model speaks.
_RESPONSES_MODELS = (
    re.compile(r"(?<![a-z0-9])gpt-5[.-]?(?:[4-9]|[1-9][0-9])(?![0-9])"),
    re.compile(r"(?<![a-z0-9])gpt-(?:[6-9]|[1-9][0-9])(?![0-9])"),
    re.compile(r"codex"),
    re.compile(r"(?<![a-z0-9])(?:o1|o3|gpt-5(?:\.[0-9])?)-pro(?![a-z0-9])"),
    re.compile(r"(?<![a-z0-9])computer-use"),
)
# OpenAI reasoning models: on the chat route they take max_completion_tokens, not max_tokens.
_REASONING_MODELS = re.compile(r"(?<![a-z0-9])(?:gpt-5|o[1-9])(?![0-9])")
# What a pasted endpoint may end with beyond the resource's root.
_ENDPOINT_SUFFIXES = ("/models", "/openai/v1", "/openai")


def route_for(model: str, routes: Mapping[str, str] | None = None, route: str | None = None) -> str:
    """The route (``"chat"`` or ``"responses"``) for ``model``: its entry in ``routes``, else
    ``route`` (every model), else the rule above (``"auto"`` asks for the rule)."""
    chosen = (routes or {}).get(model) or route or "auto"
    if chosen == "auto":
        name = model.lower()
        return "responses" if any(rule.search(name) for rule in _RESPONSES_MODELS) else "chat"
    if chosen not in ROUTES:
        raise ConfigurationError(
            f"Azure route {chosen!r} (model {model!r}) is not one of 'chat', 'responses', 'auto'"
        )
    return chosen


def _resource_root(url: str) -> str:
    """``https://NAME.services.ai.azure.com`` from what a portal shows (``.../models``,
    ``.../openai/v1/``)."""
    url = url.strip().rstrip("/")
    for suffix in _ENDPOINT_SUFFIXES:
        if url.endswith(suffix):
            url = url[: -len(suffix)]
    return url


class _AzureConnection(HTTPProvider):
    """What both routes share: the resource endpoint, the key or Entra ID token, the
    API version. The token source is shared with ``shared`` (the other route) when given."""

    name = "azure"
    api_key_env: tuple[str, ...] = ("AZURE_API_KEY", "AZURE_OPENAI_API_KEY")
    #: environment variables that may hold the endpoint (after the settings).
    endpoint_env: tuple[str, ...] = ("AZURE_ENDPOINT", "AZURE_OPENAI_ENDPOINT")

    def __init__(
        self,
        *,
        endpoint: str | None = None,
        credential: Any = None,
        api_version: str | None = None,
        shared: _AzureConnection | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._endpoint = endpoint
        self._credential = credential
        self._api_version = api_version
        self._shared = shared
        self._tokens: EntraTokens | None = None

    @property
    def base_url(self) -> str:
        """The resource's endpoint, or "" when none is configured (an error when used)."""
        url = (
            self._endpoint
            or self._base_url
            or self._setting("endpoint")
            or self._setting("endpoint_url")
            or self._setting("base_url")
        )
        for variable in self.endpoint_env:
            url = url or os.environ.get(variable)
        return _resource_root(url or "")

    def _root(self) -> str:
        root = self.base_url
        if not root:
            places = " or ".join(self.endpoint_env)
            raise ConfigurationError(
                f"No endpoint for provider {self.name!r}: set "
                f"AGENTLOOP['PROVIDERS'][{self.name!r}]['endpoint'] "
                f"(https://NAME.services.ai.azure.com) or {places}."
            )
        return root

    @property
    def api_version(self) -> str:
        """The chat route's ``api-version``."""
        return str(self._api_version or self._setting("api_version") or DEFAULT_API_VERSION)

    # -- authentication ----------------------------------------------------------------------
    def entra_tokens(self) -> EntraTokens | None:
        """The Entra ID token source when a credential is configured, else None (API key)."""
        if self._shared is not None:
            return self._shared.entra_tokens()
        with self._lock:
            if self._tokens is None:
                chosen = self._credential or self._setting("credential")
                credential = credential_from(chosen, self.name)
                if credential is None:
                    return None
                self._tokens = EntraTokens(credential)
            return self._tokens

    def api_key(self) -> str | None:
        """The key; none is needed with an Entra ID credential."""
        if self.entra_tokens() is not None:
            return None
        try:
            return super().api_key()
        except ConfigurationError as exc:
            raise ConfigurationError(
                f"{exc} Or authenticate with Microsoft Entra ID: "
                f"AGENTLOOP['PROVIDERS'][{self.name!r}]['credential'] = 'entra'."
            ) from None

    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        tokens = self.entra_tokens()
        if tokens is not None:
            return {"Authorization": f"Bearer {tokens.token()}"}
        return {"api-key": api_key} if api_key else {}

    def credential_secrets(self) -> tuple[str, ...]:
        """The Entra ID token last fetched, if any."""
        tokens = self._tokens if self._shared is None else self._shared._tokens
        token = tokens.cached() if tokens is not None else None
        return (token,) if token else ()

    async def arequest(
        self, request: ModelRequest, *, on_chunk: AsyncChunkCallback | None = None
    ) -> ModelResponse:
        tokens = self.entra_tokens()
        if tokens is not None and not tokens.fresh():
            # A token fetch blocks (a call to Entra ID, or the Azure CLI): on a thread, so the
            # event loop runs on; the request then finds the token cached.
            with call_errors(self.name, self._secrets):
                await sync_to_async(tokens.token, thread_sensitive=False)()
        return await super().arequest(request, on_chunk=on_chunk)


class AzureChatProvider(_AzureConnection, OpenAIProvider):
    """The model-inference Chat Completions route: OpenAI's mapping in Azure's dialect.

    The recordings decide the dialect: system messages keep the ``system`` role, tools go
    without a ``strict`` flag, thinking is asked for by ``reasoning_effort``, no prompt cache
    key. The output cap is ``max_tokens``, except for OpenAI reasoning models (gpt-5,
    o-series), which Microsoft documents as taking ``max_completion_tokens``.
    """

    # The dialect is that of any OpenAI-compatible host (OpenAIProvider.option's defaults
    # for a base URL other than api.openai.com): just what the recordings show.
    base_url_env = ()

    def endpoint(self, request: ModelRequest, stream: bool) -> str:
        query = urlencode({"api-version": self.api_version})
        return f"{self._root()}/models/chat/completions?{query}"

    def option_for(self, key: str, model: str) -> Any:
        chosen = key in self._dialect or self._setting(key) is not None
        if key == "max_tokens_field" and not chosen and _REASONING_MODELS.search(model.lower()):
            return "max_completion_tokens"
        return super().option_for(key, model)


class AzureResponsesProvider(_AzureConnection, OpenAIResponsesProvider):
    """The OpenAI v1 Responses route (versionless): OpenAI's Responses mapping unchanged,
    reasoning items replayed between turns, at the resource's ``/openai/v1/responses``."""

    def endpoint(self, request: ModelRequest, stream: bool) -> str:
        return f"{self._root()}/openai/v1/responses"


#: constructor options only the chat route's dialect takes.
_CHAT_OPTIONS = frozenset({"system_role", "max_tokens_field", "strict_tools", "reasoning_field"})


class AzureProvider(Provider):
    """``azure:<deployment>``: each request goes to the route :func:`route_for` picks.

    Constructor options are those of both routes (``api_key``, ``endpoint``,
    ``credential``, ``api_version``, ``timeout``, ``headers``, ``transport``) plus ``route``
    and ``routes``; each falls back to ``AGENTLOOP["PROVIDERS"][name]``.
    """

    name = "azure"
    api_key_env = _AzureConnection.api_key_env

    def __init__(
        self,
        *,
        name: str | None = None,
        route: str | None = None,
        routes: Mapping[str, str] | None = None,
        **options: Any,
    ) -> None:
        if name:
            self.name = name
        self._route = route
        self._routes = dict(routes) if routes is not None else None
        shared = {key: value for key, value in options.items() if key not in _CHAT_OPTIONS}
        #: the two mapping objects.
        self.chat = AzureChatProvider(name=self.name, **options)
        self.responses = AzureResponsesProvider(name=self.name, shared=self.chat, **shared)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r} endpoint={self.base_url!r}>"

    @property
    def base_url(self) -> str:
        """The resource's endpoint ("" when none is configured)."""
        return self.chat.base_url

    def api_key(self) -> str | None:
        """The key (None with an Entra ID credential); ConfigurationError when none is set."""
        return self.chat.api_key()

    def route(self, model: str) -> str:
        """``"chat"`` or ``"responses"`` for ``model`` (see :func:`route_for`)."""
        routes = self._routes if self._routes is not None else self.chat._setting("routes")
        return route_for(model, routes, self._route or self.chat._setting("route"))

    def family(self, model: str) -> HTTPProvider:
        """The mapping object that serves ``model``."""
        return self.responses if self.route(model) == "responses" else self.chat

    def request(
        self, request: ModelRequest, *, on_chunk: ChunkCallback | None = None
    ) -> ModelResponse:
        return self.family(request.model).request(request, on_chunk=on_chunk)

    async def arequest(
        self, request: ModelRequest, *, on_chunk: AsyncChunkCallback | None = None
    ) -> ModelResponse:
        return await self.family(request.model).arequest(request, on_chunk=on_chunk)

    def cost(self, model: str, usage: TokenUsage) -> Decimal | None:
        """Azure's own price for ``model`` (the catalog's ``clouds`` entries of ``azure``),
        never another vendor's: Azure meters differ by deployment type and region. The class's
        name, not the instance's: a provider configured under another name is Azure too."""
        return price_of(model, usage, provider=type(self).name, configured=self.name)

    def close(self) -> None:
        """Close both routes' HTTP clients."""
        self.chat.close()
        self.responses.close()

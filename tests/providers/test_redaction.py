"""What is redacted (docs/providers/index.md): no provider family lets a credential it sent
come back to a user, through a gateway that repeats every request it refuses.

Each family is configured as a deployment behind a gateway would be: its endpoint is a host
only the gateway reaches and the gateway is its HTTP proxy with a user and password (or the
gateway is its endpoint, with a user and password in the URL), a gateway key goes in
``headers``, and the family's own credentials are set (an API key, Vertex AI's OAuth token,
Bedrock's AWS credentials or API key, Azure's key or Entra ID token). The gateway
(tests/providers/echo_gateway.py, a real HTTP server on 127.0.0.1) answers every request
with an error, as a status or as a stream's first event, that repeats its URL and all its
headers, ``Proxy-Authorization`` included. None of it may be in the error raised, the
chat's error and traceback, its usage row or the logs.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import traceback
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from django.test import override_settings

from agentloop import providers
from agentloop.exceptions import ProviderError
from agentloop.messages import Message, ModelRequest
from agentloop.models import Chat, Usage
from agentloop.providers.anthropic import AnthropicProvider
from agentloop.providers.azure import AzureProvider
from agentloop.providers.base import Provider
from agentloop.providers.gemini import GeminiProvider
from agentloop.providers.openai import (
    DeepSeekProvider,
    OllamaProvider,
    OpenAIProvider,
    OpenRouterProvider,
)
from agentloop.providers.openai_responses import OpenAIResponsesProvider
from agentloop.providers.redaction import redact
from tests.providers.echo_gateway import EchoServer
from tests.providers.local_servers import serving

KEY = "zz-agentloop-KEY-7d1f9a0c2b4e"  # no vendor's key shape: only the provider knows it
PROXY_USER = "team-a"
PASSWORD = "pr0xy-pa55-9f3e1c7a"
BASIC = base64.b64encode(f"{PROXY_USER}:{PASSWORD}".encode()).decode()
#: the user and password of an endpoint URL (a gateway asking for HTTP Basic auth).
ENDPOINT_USER = "svc-agents"
ENDPOINT_PASSWORD = "endp0int-pa55-2b7c9d"
ENDPOINT_BASIC = base64.b64encode(f"{ENDPOINT_USER}:{ENDPOINT_PASSWORD}".encode()).decode()
GATEWAY_KEY = "gw-k3y-5b2d8e1a4c6f"
VERTEX_TOKEN = "vertex-access-token-5c4b3a2918"
VERTEX_REFRESH = "vertex-refresh-token-0a9b8c7d"
VERTEX_CLIENT_SECRET = "vertex-client-secret-6e5f4d"
AWS_ACCESS_KEY = "AKIDREDACTIONTEST01"
AWS_SECRET_KEY = "aws-secret-key/+7c8d9e0f1a2b3c4d"
AWS_SESSION_TOKEN = "aws-session-token-3f2e1d0c9b8a"
ENTRA_TOKEN = "entra-token-9d8c7b6a5f4e"
#: a host only the gateway, as the proxy, reaches.
UPSTREAM = "http://llm.upstream.test"


class EntraCredential:
    """azure-core's credential protocol, giving one token for an hour."""

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        return _AccessToken(ENTRA_TOKEN, int(datetime.now(UTC).timestamp()) + 3600)


class _AccessToken:
    def __init__(self, token: str, expires_on: int) -> None:
        self.token = token
        self.expires_on = expires_on


def vertex_credentials() -> Any:
    from google.oauth2.credentials import Credentials

    return Credentials(
        token=VERTEX_TOKEN,
        expiry=datetime.now(UTC).replace(tzinfo=None) + timedelta(hours=1),
        refresh_token=VERTEX_REFRESH,
        client_id="vertex-client-id",
        client_secret=VERTEX_CLIENT_SECRET,
        token_uri="https://oauth2.googleapis.com/token",
    )


def aws_session() -> Any:
    import botocore.session

    session = botocore.session.Session()
    session.set_credentials(AWS_ACCESS_KEY, AWS_SECRET_KEY, AWS_SESSION_TOKEN)
    return session


#: what one family needs: its settings (beyond the gateway's), the objects its
#: constructor takes, a model, and the secrets it holds that are not in what was sent.
Family = tuple[type[Provider], dict[str, Any], Callable[[], dict[str, Any]], str, tuple[str, ...]]

FAMILIES: dict[str, Family] = {
    "openai": (OpenAIProvider, {"api_key": KEY}, dict, "gpt-5-nano", (KEY,)),
    "openai-responses": (OpenAIResponsesProvider, {"api_key": KEY}, dict, "gpt-5-nano", (KEY,)),
    "openrouter": (OpenRouterProvider, {"api_key": KEY}, dict, "openai/gpt-5-nano", (KEY,)),
    "deepseek": (DeepSeekProvider, {"api_key": KEY}, dict, "deepseek-chat", (KEY,)),
    "ollama": (OllamaProvider, {}, dict, "llama3.2", ()),
    "anthropic": (AnthropicProvider, {"api_key": KEY}, dict, "claude-haiku-4-5", (KEY,)),
    "gemini": (GeminiProvider, {"api_key": KEY}, dict, "gemini-2.5-flash", (KEY,)),
    "vertexai": (
        providers.load_by_path("agentloop.providers.vertex.VertexAIProvider"),
        {"project": "test-project", "location": "global"},
        lambda: {"credentials": vertex_credentials()},
        "gemini-2.5-flash",
        (VERTEX_TOKEN, VERTEX_REFRESH, VERTEX_CLIENT_SECRET),
    ),
    "bedrock": (
        providers.load_by_path("agentloop.providers.bedrock.BedrockProvider"),
        {"region": "us-east-1"},
        lambda: {"session": aws_session()},
        "us.amazon.nova-2-lite-v1:0",
        (AWS_SECRET_KEY, AWS_SESSION_TOKEN),
    ),
    "bedrock-key": (
        providers.load_by_path("agentloop.providers.bedrock.BedrockProvider"),
        {"region": "us-east-1", "api_key": KEY},
        lambda: {"session": aws_session()},
        "us.amazon.nova-2-lite-v1:0",
        (KEY, AWS_SECRET_KEY, AWS_SESSION_TOKEN),
    ),
    "azure": (AzureProvider, {"api_key": KEY}, dict, "gpt-4.1", (KEY,)),
    "azure-responses": (AzureProvider, {"api_key": KEY}, dict, "gpt-5.5", (KEY,)),
    "azure-entra": (
        AzureProvider,
        {},
        lambda: {"credential": EntraCredential()},
        "gpt-4.1",
        (ENTRA_TOKEN,),
    ),
}


@pytest.fixture
def gateway() -> Iterator[EchoServer]:
    with serving(EchoServer()) as server:
        yield server


def settings_for(name: str, gateway: EchoServer, route: str) -> dict[str, Any]:
    """The family's settings: a gateway key in its headers, its own options, and the way to
    the gateway: ``proxied``, its endpoint on a host the gateway reaches as its proxy with
    a password; ``direct``, the gateway as its endpoint, with a user and password."""
    own = FAMILIES[name][1]
    endpoint_key = "endpoint" if FAMILIES[name][0] is AzureProvider else "endpoint_url"
    if route == "proxied":
        way = {
            endpoint_key: f"{UPSTREAM}/{name}",
            "proxy": gateway.proxy_url(PROXY_USER, PASSWORD),
        }
    else:
        way = {endpoint_key: f"{gateway.proxy_url(ENDPOINT_USER, ENDPOINT_PASSWORD)}/{name}"}
    settings = {**way, "headers": {"X-Gateway-Key": GATEWAY_KEY}, **own}
    return {"PROVIDERS": {name: settings}}


@pytest.fixture
def configured(gateway: EchoServer, request: pytest.FixtureRequest) -> Iterator[Provider]:
    """The family named by the test's ``family`` parameter, behind the gateway by its
    ``route`` parameter (``proxied`` when it has none)."""
    name = request.node.callspec.params["family"]
    route = request.node.callspec.params.get("route", "proxied")
    provider_class, _, objects, _, _ = FAMILIES[name]
    with override_settings(AGENTLOOP=settings_for(name, gateway, route)):
        provider = provider_class(name=name, **objects())
        try:
            yield provider
        finally:
            provider.close()


def question(name: str) -> ModelRequest:
    return ModelRequest(model=FAMILIES[name][3], messages=[Message(role="user", content="Hi")])


def assert_nothing_sensitive(name: str, gateway: EchoServer, *texts: str) -> None:
    """None of the credentials the gateway was sent, nor the family's own, is in ``texts``;
    and the gateway did repeat a request (so hiding them means something)."""
    seen = gateway.state.seen
    assert seen, "the gateway was never asked"
    proxied = [r.headers.get("proxy-authorization") == f"Basic {BASIC}" for r in seen]
    direct = [r.headers.get("authorization") == f"Basic {ENDPOINT_BASIC}" for r in seen]
    assert all(proxied) or all(direct)  # the gateway was asked with a password, either way
    assert all(r.headers.get("x-gateway-key") == GATEWAY_KEY for r in seen)
    hidden = {
        PASSWORD,
        BASIC,
        ENDPOINT_PASSWORD,
        ENDPOINT_BASIC,
        GATEWAY_KEY,
        *FAMILIES[name][4],
        *gateway.state.sensitive_values(),
    }
    shown = "\n".join(texts)
    assert "gateway refused" in shown  # the gateway's words reached the user...
    leaked = sorted(secret for secret in hidden if secret in shown)
    assert leaked == []  # ...and none of the credentials it repeated


def error_texts(error: BaseException) -> tuple[str, ...]:
    body = error.body if isinstance(error, ProviderError) else None
    return (str(error), repr(error), body or "", "".join(traceback.format_exception(error)))


# -- every family, every way of calling ------------------------------------------------------
@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("call", ["json", "streamed", "async"])
@pytest.mark.parametrize("route", ["proxied", "direct"])
def test_an_error_repeating_the_request_shows_no_credential(
    family, call, route, configured, gateway, caplog
):
    caplog.set_level(logging.DEBUG)  # httpx, httpcore, google-auth and botocore log at DEBUG
    request = question(family)

    with pytest.raises(ProviderError) as raised:
        if call == "json":
            configured.request(request)
        elif call == "streamed":
            configured.request(request, on_chunk=lambda chunk: None)
        else:
            asyncio.run(configured.arequest(request, on_chunk=lambda chunk: None))

    assert raised.value.status == 400
    assert_nothing_sensitive(family, gateway, *error_texts(raised.value), caplog.text)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("call", ["streamed", "async"])
def test_an_error_event_mid_stream_repeating_the_request_shows_no_credential(
    family, call, configured, gateway, caplog
):
    caplog.set_level(logging.DEBUG)
    gateway.state.mid_stream = True  # HTTP 200, then the error as the stream's first event
    request = question(family)

    with pytest.raises(ProviderError) as raised:
        if call == "streamed":
            configured.request(request, on_chunk=lambda chunk: None)
        else:
            asyncio.run(configured.arequest(request, on_chunk=lambda chunk: None))

    assert_nothing_sensitive(family, gateway, *error_texts(raised.value), caplog.text)


# -- what a chat keeps -------------------------------------------------------------------------
@pytest.mark.django_db
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_failed_chat_keeps_no_credential(family, configured, gateway, user, caplog):
    caplog.set_level(logging.DEBUG)
    providers.register(family, configured)
    try:
        chat = Chat.objects.create(model=f"{family}:{FAMILIES[family][3]}", owner=user)
        with pytest.raises(ProviderError) as raised:
            chat.ask("Hi")
    finally:
        providers.unregister(family)

    chat.refresh_from_db()
    (usage,) = Usage.objects.filter(chat=chat)
    assert (chat.state, usage.status) == ("failed", "failed")
    stored = json.dumps([list(Chat.objects.values()), list(Usage.objects.values())], default=str)
    assert_nothing_sensitive(
        family,
        gateway,
        *error_texts(raised.value),
        chat.error,
        chat.error_detail,
        usage.error,
        stored,
        caplog.text,
    )


# -- the exceptions an error was raised from ----------------------------------------------
def test_the_exception_an_error_was_raised_from_is_redacted_too():
    """A traceback (``error_detail``) shows the httpx error a ServerError was raised from."""

    def refused(request: httpx.Request) -> httpx.Response:
        said = f"{request.headers['x-gateway-key']} and {request.headers['authorization']}"
        raise httpx.ConnectError(f"the gateway refused {said}", request=request)

    provider = OpenAIProvider(
        api_key=KEY, headers={"X-Gateway-Key": GATEWAY_KEY}, transport=httpx.MockTransport(refused)
    )

    with pytest.raises(ProviderError) as raised:
        provider.request(question("openai"))

    shown = "".join(traceback.format_exception(raised.value))
    assert "httpx.ConnectError: the gateway refused [redacted] and [redacted]" in shown
    assert KEY not in shown and GATEWAY_KEY not in shown


# -- the shapes of credentials, and what stays -------------------------------------------
@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("Proxy-Authorization: Basic dGVhbTpzM2NyZXQ=", "Proxy-Authorization: Basic [redacted]"),
        ('{"x-portkey-api-key": "pk-1234567"}', '{"x-portkey-api-key": "[redacted]"}'),
        (
            "X-Amz-Security-Token: IQoJb3JpZ2lu; Host: a",
            "X-Amz-Security-Token: [redacted]; Host: a",
        ),
        (
            "AWS4-HMAC-SHA256 Credential=AKID/20260819/us-east-1/bedrock/aws4_request, "
            "SignedHeaders=host, Signature=0a1b2c3d4e",
            "AWS4-HMAC-SHA256 Credential=[redacted], SignedHeaders=host, Signature=[redacted]",
        ),
        ("GET /v1beta/models?key=abc123&alt=sse", "GET /v1beta/models?key=[redacted]&alt=sse"),
        ("via http://svc:hunter2@proxy:3128 failed", "via http://[redacted]@proxy:3128 failed"),
        ("token ya29.a0AfH6SMBx-abc", "token ya29.[redacted]"),
        ("key AKIAIOSFODNN7EXAMPLE", "key [redacted]"),
        # What is not a credential stays as the vendor wrote it.
        ("Missing bearer or basic authentication in header", None),
        ("input tokens exceed the limit: 5000; max_tokens=100", None),
        ('{"code": "invalid_api_key", "message": "Incorrect API key"}', None),
        ("https://platform.openai.com/account/api-keys", None),
    ],
)
def test_credentials_are_known_by_their_shape(text, shown):
    assert redact(text) == (text if shown is None else shown)

"""Private endpoints and gateways (docs/providers/index.md): ``endpoint_url`` (or its older
name ``base_url``), ``proxy`` and ``headers`` for every provider family, through a real
HTTP proxy on 127.0.0.1 that records what passed through it and answers as the vendor."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.test import override_settings

from agentloop.exceptions import ConfigurationError, ProviderError, ServerError
from agentloop.messages import Message, ModelRequest
from agentloop.providers.anthropic import AnthropicProvider
from agentloop.providers.bedrock import BedrockProvider
from agentloop.providers.gemini import GeminiProvider
from agentloop.providers.http import HTTPProvider
from agentloop.providers.openai import OllamaProvider, OpenAIProvider
from agentloop.providers.openai_responses import OpenAIResponsesProvider
from agentloop.providers.vertex import VertexAIProvider
from tests.providers.wire import chat_completion

PASSWORD = "pr0xy-s3cret"
GATEWAY = "http://llm.gateway.test/team-a"  # never resolved: only the proxy can reach it

#: each family's name, class, model, the path it posts to below the endpoint, and an answer.
FAMILIES: dict[str, tuple[type[HTTPProvider], str, str, dict[str, Any]]] = {
    "openai": (
        OpenAIProvider,
        "gpt-5-nano",
        "/chat/completions",
        chat_completion("Hi", model="gpt-5-nano").json(),
    ),
    "ollama": (
        OllamaProvider,
        "llama3.2",
        "/chat/completions",
        chat_completion("Hi", model="llama3.2").json(),
    ),
    "openai-responses": (
        OpenAIResponsesProvider,
        "gpt-5-nano",
        "/responses",
        {
            "id": "resp_1",
            "status": "completed",
            "output": [{"type": "message", "content": [{"type": "output_text", "text": "Hi"}]}],
        },
    ),
    "anthropic": (
        AnthropicProvider,
        "claude-haiku-4-5",
        "/v1/messages",
        {
            "id": "msg_1",
            "model": "claude-haiku-4-5",
            "content": [{"type": "text", "text": "Hi"}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 3, "output_tokens": 1},
        },
    ),
    "gemini": (
        GeminiProvider,
        "gemini-2.5-flash",
        "/v1beta/models/gemini-2.5-flash:generateContent",
        {
            "candidates": [
                {"content": {"role": "model", "parts": [{"text": "Hi"}]}, "finishReason": "STOP"}
            ]
        },
    ),
}


@dataclass
class Seen:
    """One request the proxy forwarded: the absolute URL it was asked for, and its headers."""

    method: str
    url: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class Proxy:
    """A forward HTTP proxy that answers every request itself (as the vendor would)."""

    url: str
    seen: list[Seen] = field(default_factory=list)
    answer: dict[str, Any] = field(default_factory=dict)
    status: int = 200

    def with_credentials(self, user: str = "team-a", password: str = PASSWORD) -> str:
        return self.url.replace("http://", f"http://{user}:{password}@")


@pytest.fixture
def proxy() -> Iterator[Proxy]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    state = Proxy(url=f"http://127.0.0.1:{server.server_address[1]}")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            headers = {key.lower(): value for key, value in self.headers.items()}
            state.seen.append(Seen(self.command, self.path, headers, body))
            payload = json.dumps(state.answer).encode()
            self.send_response(state.status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:  # quiet
            pass

    server.RequestHandlerClass = Handler
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def ask(model: str) -> ModelRequest:
    return ModelRequest(model=model, messages=[Message(role="user", content="Hello")])


def gateway_settings(name: str, proxy: Proxy, **extra: Any) -> dict[str, Any]:
    return {
        "PROVIDERS": {
            name: {
                "api_key": "test-key",
                "endpoint_url": GATEWAY,
                "proxy": proxy.with_credentials(),
                "headers": {"X-Gateway-Team": "team-a"},
                **extra,
            }
        }
    }


# -- every family, through the proxy ---------------------------------------------------------
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_reaches_its_endpoint_url_through_the_proxy_with_its_headers(proxy, family):
    provider_class, model, path, answer = FAMILIES[family]
    proxy.answer = answer

    with override_settings(AGENTLOOP=gateway_settings(family, proxy)):
        response = provider_class(name=family).request(ask(model))

    assert response.content == "Hi"
    (seen,) = proxy.seen
    assert (seen.method, seen.url) == ("POST", GATEWAY + path)
    assert seen.headers["x-gateway-team"] == "team-a"
    token = base64.b64encode(f"team-a:{PASSWORD}".encode()).decode()
    assert seen.headers["proxy-authorization"] == f"Basic {token}"


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_async_requests_take_the_proxy_too(proxy, family):
    provider_class, model, path, answer = FAMILIES[family]
    proxy.answer = answer

    with override_settings(AGENTLOOP=gateway_settings(family, proxy)):
        response = asyncio.run(provider_class(name=family).arequest(ask(model)))

    assert response.content == "Hi"
    assert [seen.url for seen in proxy.seen] == [GATEWAY + path]


def test_constructor_arguments_configure_the_same_as_settings(proxy):
    provider_class, model, path, answer = FAMILIES["anthropic"]
    proxy.answer = answer
    provider = provider_class(
        api_key="test-key", endpoint_url=GATEWAY, proxy=proxy.url, headers={"X-Team": "b"}
    )

    assert provider.request(ask(model)).content == "Hi"
    assert proxy.seen[0].url == GATEWAY + path
    assert proxy.seen[0].headers["x-team"] == "b"
    assert "proxy-authorization" not in proxy.seen[0].headers


# -- endpoint_url and base_url ---------------------------------------------------------------
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_base_url_still_works_and_names_the_same_setting(family):
    provider_class = FAMILIES[family][0]
    for key in ("endpoint_url", "base_url"):
        with override_settings(AGENTLOOP={"PROVIDERS": {family: {key: "https://gw.test/x/"}}}):
            assert provider_class(name=family).base_url == "https://gw.test/x"


def test_both_names_agreeing_is_fine_and_the_constructor_wins_over_settings():
    both = {"endpoint_url": "https://gw.test/v1/", "base_url": "https://gw.test/v1"}
    with override_settings(AGENTLOOP={"PROVIDERS": {"openai": both}}):
        assert OpenAIProvider().base_url == "https://gw.test/v1"
        assert OpenAIProvider(base_url="https://mine.test/v1").base_url == "https://mine.test/v1"


def test_both_names_disagreeing_is_a_one_line_error_naming_both():
    both = {"endpoint_url": "https://gw.test/v1", "base_url": "https://api.openai.com/v1"}
    with override_settings(AGENTLOOP={"PROVIDERS": {"openai": both}}):
        with pytest.raises(ConfigurationError) as caught:
            OpenAIProvider().base_url  # noqa: B018

    message = str(caught.value)
    assert message == (
        "AGENTLOOP['PROVIDERS']['openai'] sets both 'endpoint_url' 'https://gw.test/v1' and "
        "'base_url' 'https://api.openai.com/v1': base_url is the older name of endpoint_url, "
        "so keep one"
    )
    with pytest.raises(ConfigurationError, match="was given both endpoint_url="):
        AnthropicProvider(endpoint_url="https://a.test", base_url="https://b.test").base_url  # noqa: B018


@pytest.mark.parametrize("bad", ["llm.internal/v1", "ftp://llm.internal", "https://", 8080])
def test_an_endpoint_that_is_not_a_url_is_a_one_line_error(bad):
    with override_settings(AGENTLOOP={"PROVIDERS": {"gemini": {"endpoint_url": bad}}}):
        with pytest.raises(ConfigurationError) as caught:
            GeminiProvider(api_key="k").request(ask("gemini-2.5-flash"))

    assert str(caught.value).startswith("AGENTLOOP['PROVIDERS']['gemini']['endpoint_url'] must")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("family", "provider_class"), [("bedrock", BedrockProvider), ("vertexai", VertexAIProvider)]
)
def test_the_cloud_families_check_their_endpoint_as_every_http_provider_does(
    family, provider_class
):
    def base_url(settings: dict[str, Any], **given: Any) -> str:
        with override_settings(AGENTLOOP={"PROVIDERS": {family: settings}}):
            return provider_class(name=family, **given).base_url

    with pytest.raises(ConfigurationError, match=rf"\['{family}'\]\['endpoint_url'\] must"):
        base_url({"endpoint_url": "ftp://gw.test"})
    with pytest.raises(ConfigurationError, match="so keep one"):
        base_url({"endpoint_url": "https://a.test", "base_url": "https://b.test"})
    # the constructor wins over the settings, whichever of the two names each uses
    assert base_url({"endpoint_url": "https://set.test"}, base_url="https://mine.test/") == (
        "https://mine.test"
    )


# -- the proxy's password ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "bad",
    [
        f"team-a:{PASSWORD}@gateway:3128",
        "gateway:3128",
        f"ftp://u:{PASSWORD}@gw",
        "http://",
        3128,
        f"http://u:{PASSWORD}@gw:port",
    ],
)
def test_a_proxy_that_is_not_a_url_is_a_one_line_error_without_the_password(bad):
    with override_settings(AGENTLOOP={"PROVIDERS": {"openai": {"proxy": bad}}}):
        with pytest.raises(ConfigurationError) as caught:
            OpenAIProvider(api_key="k").request(ask("gpt-5-nano"))

    message = str(caught.value)
    assert message.startswith("AGENTLOOP['PROVIDERS']['openai']['proxy'] (or proxy=) must be a URL")
    assert "\n" not in message
    assert PASSWORD not in message and PASSWORD not in repr(caught.value)


def test_the_password_is_never_in_the_repr():
    provider = OpenAIProvider(proxy=f"http://team-a:{PASSWORD}@gateway:3128")

    assert repr(provider) == (
        "<OpenAIProvider name='openai' base_url='https://api.openai.com/v1' "
        "proxy='http://team-a:***@gateway:3128'>"
    )


def test_the_password_is_never_logged(proxy, caplog):
    provider_class, model, _, answer = FAMILIES["openai"]
    proxy.answer = answer
    caplog.set_level(logging.DEBUG)  # httpx and httpcore log every connection at DEBUG

    with override_settings(AGENTLOOP=gateway_settings("openai", proxy)):
        provider_class().request(ask(model))

    assert caplog.records  # the clients did log
    token = base64.b64encode(f"team-a:{PASSWORD}".encode()).decode()
    assert PASSWORD not in caplog.text and token not in caplog.text


def test_an_unreachable_proxy_fails_without_the_password(proxy):
    closed = proxy.with_credentials().replace(proxy.url.rpartition(":")[2], "9")  # discard port

    with pytest.raises(ServerError) as caught:
        OpenAIProvider(api_key="k", endpoint_url=GATEWAY, proxy=closed).request(ask("gpt-5-nano"))

    assert str(caught.value).startswith("Could not reach openai")
    assert PASSWORD not in f"{caught.value} {caught.value!r}"


def test_a_gateway_error_repeating_the_credentials_shows_them_redacted(proxy):
    proxy.status = 407
    proxy.answer = {"error": {"message": f"bad proxy credentials team-a:{PASSWORD}"}}

    with override_settings(AGENTLOOP=gateway_settings("openai", proxy)):
        with pytest.raises(ProviderError) as caught:
            OpenAIProvider().request(ask("gpt-5-nano"))

    shown = " ".join([str(caught.value), repr(caught.value), caught.value.body or ""])
    assert "team-a:[redacted]" in shown
    assert PASSWORD not in shown

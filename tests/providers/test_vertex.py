"""The Vertex AI provider: credentials and tokens (refreshed before expiry, one refresh at a
time, never shown), settings (project, location, hosts), async, errors and the registry.

The network edge is an ``httpx.MockTransport`` answering with the recorded token exchange
and recorded answers (``providers-cloud``); the credentials are google-auth's own.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import threading
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import time_machine
from django.test import override_settings

from agentloop.exceptions import AuthenticationError, ConfigurationError, RateLimitError
from agentloop.messages import Message, ModelRequest
from agentloop.providers.vertex import VertexAIProvider
from tests.price_sources import without_genai_prices  # noqa: F401 (a fixture)
from tests.providers.cassettes import CLOUD, Interaction, cached
from tests.providers.vertex_wire import (
    ACCESS_TOKEN,
    LOCATION,
    PROJECT,
    TOKEN_URI,
    VertexServer,
    is_token_exchange,
    recorded_response,
    serving,
    user_credentials,
    user_file,
)
from tests.providers.wire import shown

BASIC = "chat_basic_chat_functionality_vertexai_gemini-2_5-flash_can_have_a_basic_conversation"
MODEL = "gemini-2.5-flash"


def recorded() -> tuple[Interaction, Interaction]:
    token, call = cached(BASIC, CLOUD).interactions
    assert is_token_exchange(token)
    return token, call


def question() -> ModelRequest:
    return ModelRequest(model=MODEL, messages=[Message(role="user", content="What's 2 + 2?")])


def token_answer(token: str, expires_in: int = 3599) -> httpx.Response:
    return httpx.Response(200, json={"access_token": token, "expires_in": expires_in})


# -- tokens -----------------------------------------------------------------------------------
def test_the_token_is_refreshed_before_it_expires():
    token, call = recorded()
    later = [recorded_response(call) for _ in range(3)]
    provider, server = serving([token, call], *later, tokens=(token_answer("second-token"),))
    start = datetime(2026, 8, 19, 14, 36, tzinfo=UTC)

    with time_machine.travel(start, tick=False) as clock:
        provider.request(question())
        clock.shift(timedelta(minutes=50))  # 3599 s tokens: still valid for 10 minutes
        provider.request(question())
        clock.shift(timedelta(minutes=6, seconds=30))  # under google-auth's 3m45s margin
        provider.request(question())
        provider.request(question())

    assert len(server.token_requests) == 2
    bearers = [r.headers["authorization"] for r in server.api_requests]
    assert bearers == [f"Bearer {ACCESS_TOKEN}"] * 2 + ["Bearer second-token"] * 2


def test_one_refresh_for_many_threads():
    token, call = recorded()
    provider, server = serving([token])
    barrier = threading.Barrier(8)
    headers: list[dict[str, str]] = []

    def ask() -> None:
        barrier.wait()
        headers.append(provider.auth_headers(None))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(server.token_requests) == 1
    assert headers == [{"Authorization": f"Bearer {ACCESS_TOKEN}"}] * 8


def test_the_token_is_never_shown(caplog):
    """Not in the provider's repr, logs (google-auth's own included) or an error whose body
    repeats it; the refresh token and client secret neither."""
    caplog.set_level(logging.DEBUG)
    secret = "ya29.a0-secret-access-token-value"
    echo = {"error": {"code": 401, "message": f"Bad token {secret}", "status": "UNAUTHENTICATED"}}
    provider, _ = serving([], httpx.Response(401, json=echo), tokens=(token_answer(secret),))

    with pytest.raises(AuthenticationError) as raised:
        provider.request(question())

    seen = " ".join([shown(raised.value), repr(provider), repr(provider._google), caplog.text])
    assert "[redacted]" in raised.value.body
    for hidden in (secret, "<GOOGLE_REFRESH_TOKEN>", "<GOOGLE_CLIENT_SECRET>"):
        assert hidden not in seen
    assert raised.value.retryable is False


def test_a_refused_refresh_is_an_authentication_error():
    refused = httpx.Response(400, json={"error": "invalid_grant", "error_description": "Bad"})
    provider, server = serving([], tokens=(refused,))

    with pytest.raises(AuthenticationError) as raised:
        provider.request(question())

    assert "refused to refresh the access token" in str(raised.value)
    assert "<GOOGLE_REFRESH_TOKEN>" not in shown(raised.value)
    assert server.api_requests == []


def test_an_async_request_refreshes_on_a_thread():
    server = VertexServer.of(list(recorded()))
    loop_threads: list[threading.Thread] = []
    seen: list[tuple[str, threading.Thread]] = []

    def spy(request: httpx.Request) -> httpx.Response:
        seen.append((str(request.url), threading.current_thread()))
        return server(request)

    provider = VertexAIProvider(
        project=PROJECT,
        location=LOCATION,
        credentials=user_credentials(),
        transport=httpx.MockTransport(spy),
    )

    async def ask() -> str:
        loop_threads.append(threading.current_thread())
        return (await provider.arequest(question())).content

    assert asyncio.run(ask()) == "2 + 2 = **4**"
    (token_thread,) = [thread for url, thread in seen if url == TOKEN_URI]
    assert token_thread is not loop_threads[0]
    assert server.api_requests[0].headers["authorization"] == f"Bearer {ACCESS_TOKEN}"


# -- google-auth missing ------------------------------------------------------------------------
def test_without_google_auth_a_one_line_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "google.auth", None)
    monkeypatch.delitem(sys.modules, "agentloop.providers.vertex.transport", raising=False)
    provider = VertexAIProvider(project=PROJECT, location=LOCATION)

    with pytest.raises(ConfigurationError) as raised:
        provider.auth_headers(None)

    message = str(raised.value)
    assert "\n" not in message
    assert "google-auth" in message and "django-agentloop[vertex]" in message


# -- settings ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("location", "host"),
    [
        ("global", "https://aiplatform.googleapis.com"),
        ("europe-west4", "https://europe-west4-aiplatform.googleapis.com"),
    ],
)
def test_the_location_chooses_the_host(location, host):
    provider = VertexAIProvider(project="p", location=location, credentials=user_credentials())
    path = provider.endpoint(question(), stream=True)

    assert provider.base_url == host
    assert path == (
        f"/v1beta1/projects/p/locations/{location}/publishers/google/models/{MODEL}"
        ":streamGenerateContent?alt=sse"
    )


def test_settings_and_environment(monkeypatch):
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "env-project")
    monkeypatch.setenv("GOOGLE_CLOUD_LOCATION", "us-east5")
    provider = VertexAIProvider(credentials=user_credentials())
    assert (provider.project, provider.location) == ("env-project", "us-east5")

    setting = {"project": "set-project", "location": "global", "api_version": "v1"}
    with override_settings(AGENTLOOP={"PROVIDERS": {"vertexai": setting}}):
        assert (provider.project, provider.location) == ("set-project", "global")
        assert provider.endpoint(question(), stream=False).startswith(
            "/v1/projects/set-project/locations/global/"
        )


def test_endpoint_url_overrides_the_host():
    setting = {"project": "p", "location": "us-central1", "endpoint_url": "https://gw.internal/"}
    with override_settings(AGENTLOOP={"PROVIDERS": {"vertexai": setting}}):
        assert VertexAIProvider().base_url == "https://gw.internal"
    assert VertexAIProvider(endpoint_url="https://psc.example").base_url == "https://psc.example"


def test_model_paths():
    provider = VertexAIProvider(project="p", location="global", credentials=user_credentials())
    tuned = question().model_copy(update={"model": "endpoints/123"})
    full = question().model_copy(update={"model": "projects/q/locations/l/endpoints/9"})

    assert provider.endpoint(tuned, False) == (
        "/v1beta1/projects/p/locations/global/endpoints/123:generateContent"
    )
    assert (
        provider.endpoint(full, False)
        == "/v1beta1/projects/q/locations/l/endpoints/9:generateContent"
    )


def test_no_location_is_a_configuration_error(monkeypatch):
    monkeypatch.delenv("GOOGLE_CLOUD_LOCATION", raising=False)
    provider = VertexAIProvider(project="p", credentials=user_credentials())

    with pytest.raises(ConfigurationError, match="GOOGLE_CLOUD_LOCATION"):
        provider.request(question())
    assert "location=None" in repr(provider)


def test_no_project_anywhere_is_a_configuration_error(monkeypatch):
    for variable in ("GOOGLE_CLOUD_PROJECT", "GCLOUD_PROJECT"):
        monkeypatch.delenv(variable, raising=False)
    provider = VertexAIProvider(location="global", credentials=user_credentials())

    with pytest.raises(ConfigurationError, match="No Google Cloud project"):
        provider.endpoint(question(), stream=False)


def test_the_project_of_a_credentials_file(tmp_path, monkeypatch):
    """A credentials file (here an authorized user's, as ``gcloud auth application-default
    login`` writes it) is loaded by google-auth; its quota project is the project."""
    for variable in ("GOOGLE_CLOUD_PROJECT", "GCLOUD_PROJECT"):
        monkeypatch.delenv(variable, raising=False)
    token, call = recorded()
    server = VertexServer.of([token, call])
    setting = {"credentials": user_file(tmp_path, quota_project_id="file-project")}
    setting["location"] = "global"
    with override_settings(AGENTLOOP={"PROVIDERS": {"vertexai": setting}}):
        provider = VertexAIProvider(transport=httpx.MockTransport(server))

        assert provider.request(question()).content == "2 + 2 = **4**"

    assert "/projects/file-project/" in str(server.api_requests[0].url)
    assert server.api_requests[0].headers["authorization"] == f"Bearer {ACCESS_TOKEN}"


def test_a_credentials_file_google_auth_cannot_read(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text("{}")
    provider = VertexAIProvider(project="p", location="global", credentials=str(path))

    with pytest.raises(ConfigurationError, match="No usable Google credentials"):
        provider.auth_headers(None)


# -- errors and the registry -------------------------------------------------------------------
def test_a_429_says_when_to_retry():
    token, _ = recorded()
    body = {
        "error": {
            "code": 429,
            "message": "Resource exhausted. Please try again later.",
            "status": "RESOURCE_EXHAUSTED",
            "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "7s"}],
        }
    }
    provider, _ = serving([token], httpx.Response(429, json=body))

    with pytest.raises(RateLimitError) as raised:
        provider.request(question())
    assert raised.value.retry_after == 7.0


@pytest.mark.parametrize("status", [401, 403])
def test_401_and_403_are_authentication_errors(status):
    token, _ = recorded()
    body = {"error": {"code": status, "message": "Denied", "status": "PERMISSION_DENIED"}}
    provider, _ = serving([token], httpx.Response(status, json=body))

    with pytest.raises(AuthenticationError):
        provider.request(question())


def test_built_in_under_vertexai():
    from agentloop import providers
    from tests.providers.wire import resolved

    provider, model = resolved("vertexai:gemini-3-flash-preview")

    assert providers.BUILTINS["vertexai"] == "agentloop.providers.vertex.VertexAIProvider"
    assert providers.VertexAIProvider is VertexAIProvider
    assert isinstance(provider, VertexAIProvider) and provider.name == "vertexai"
    assert model == "gemini-3-flash-preview"


def test_no_batch_api():
    """Vertex AI's batch prediction is another API (Cloud Storage or BigQuery in and out):
    the Gemini API's batch mode is not used for it."""
    from agentloop.providers.batch_apis import batch_api

    assert batch_api(VertexAIProvider(project="p", location="global")) is None


@pytest.mark.django_db
@pytest.mark.usefixtures("without_genai_prices")  # the catalog's price only: none
def test_a_chat_on_vertex_ai_keeps_usage_and_no_token(user):
    from agentloop.models import Chat
    from tests.providers.wire import registered

    provider, server = serving(list(recorded()))
    with registered("vertexai", provider):
        chat = Chat.objects.create(model="vertexai:gemini-2.5-flash", owner=user)
        answer = chat.ask("What's 2 + 2?")

    (usage,) = chat.usage_records.all()
    assert answer.content == "2 + 2 = **4**"
    assert (usage.input_tokens, usage.output_tokens, usage.reasoning_tokens) == (9, 27, 19)
    assert usage.cost is None  # Vertex AI's prices are not in the catalog (see models.json)
    stored = json.dumps([list(m.provider_data.items()) for m in chat.messages.all()])
    assert ACCESS_TOKEN not in stored + json.dumps(chat.provider_options or {})

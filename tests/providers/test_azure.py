"""The Azure AI Foundry provider beyond the recordings: the route rule and its settings, the
endpoint and api-version, keys and Entra ID tokens (cached, refreshed, fetched off the event
loop, never shown), the output-cap field per model, prices, and check agentloop.E009."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from typing import Any

import httpx
import pytest
from django.core.checks import run_checks
from django.test import override_settings

from agentloop.checks import check_azure_endpoints
from agentloop.exceptions import AuthenticationError, ConfigurationError
from agentloop.messages import ModelRequest, TokenUsage
from agentloop.providers import azure_auth
from agentloop.providers.azure import AzureProvider, route_for
from agentloop.providers.catalog import price_of
from tests.providers.wire import Recorder, chat_completion, conversation, shown

ENDPOINT = "https://res.services.ai.azure.com"
CHAT_URL = f"{ENDPOINT}/models/chat/completions?api-version=2024-05-01-preview"
RESPONSES_URL = f"{ENDPOINT}/openai/v1/responses"
ENV = ("AZURE_API_KEY", "AZURE_OPENAI_API_KEY", "AZURE_ENDPOINT", "AZURE_OPENAI_ENDPOINT")


@pytest.fixture(autouse=True)
def no_azure_environment(monkeypatch) -> None:
    for variable in ENV:
        monkeypatch.delenv(variable, raising=False)


def responses_answer(text: str = "OK") -> httpx.Response:
    output = [{"type": "message", "content": [{"type": "output_text", "text": text}]}]
    return httpx.Response(200, json={"id": "resp_1", "model": "gpt-5.6", "output": output})


def ask(model: str) -> ModelRequest:
    return conversation(model, ("user", "Hi"))


def serving(*answers: Any, **options: Any) -> tuple[AzureProvider, Recorder]:
    recorder = Recorder(*answers)
    options.setdefault("endpoint", ENDPOINT)
    return AzureProvider(transport=recorder.transport(), **options), recorder


class FakeCredential:
    """azure-core's credential protocol: a new token per call, valid for ``lifetime`` seconds
    by ``clock`` (a negative lifetime: an answer without a token)."""

    def __init__(self, lifetime: float = 3600, clock: Any = time.time) -> None:
        self.lifetime = lifetime
        self.clock = clock
        self.calls: list[tuple[str, ...]] = []
        self.threads: list[int] = []

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        self.calls.append(scopes)
        self.threads.append(threading.get_ident())
        if self.lifetime < 0:
            return {"token": "not an AccessToken"}
        return _Token(f"entra-token-{len(self.calls)}", self.clock() + self.lifetime)


class _Token:
    def __init__(self, token: str, expires_on: float) -> None:
        self.token = token
        self.expires_on = int(expires_on)


# -- the route rule --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("model", "route"),
    [
        ("gpt-5.6-luna", "responses"),
        ("gpt-5.4", "responses"),
        ("gpt-56", "responses"),  # a deployment name without the dot
        ("prod-gpt-5.5-mini", "responses"),  # the model name inside a deployment name
        ("gpt-6", "responses"),
        ("gpt-5.1-codex", "responses"),
        ("o3-pro", "responses"),
        ("gpt-5-nano", "chat"),
        ("gpt-5-2025-08-07", "chat"),  # a dated gpt-5 snapshot, not a gpt-5.20
        ("gpt-5.3", "chat"),
        ("gpt-4.1", "chat"),
        ("o4-mini", "chat"),
        ("grok-4-1-fast-non-reasoning", "chat"),
        ("Llama-3.3-70B-Instruct", "chat"),
    ],
)
def test_the_rule_sends_each_model_generation_to_its_route(model, route):
    assert route_for(model) == route


def test_a_route_per_model_wins_over_the_provider_wide_one_and_the_rule():
    routes = {"my-deployment": "responses", "gpt-5.6": "chat"}

    assert route_for("my-deployment", routes, "chat") == "responses"
    assert route_for("gpt-5.6", routes) == "chat"
    assert route_for("grok-3", routes, "responses") == "responses"
    assert route_for("gpt-5.6", {}, "auto") == "responses"


def test_an_unknown_route_is_a_one_line_configuration_error():
    with pytest.raises(ConfigurationError, match="'completions'.*'chat', 'responses', 'auto'"):
        route_for("gpt-5", route="completions")


def test_the_route_settings_choose_the_url():
    provider, recorder = serving(chat_completion("chat"), responses_answer(), api_key="k")
    settings = {"azure": {"routes": {"gpt-5.6-luna": "chat"}, "route": "responses"}}

    with override_settings(AGENTLOOP={"PROVIDERS": settings}):
        assert provider.request(ask("gpt-5.6-luna")).content == "chat"
        assert provider.request(ask("grok-4")).content == "OK"

    assert [str(request.url) for request in recorder.requests] == [CHAT_URL, RESPONSES_URL]


# -- endpoint, api-version, output cap -------------------------------------------------------
@pytest.mark.parametrize(
    "pasted", [ENDPOINT, f"{ENDPOINT}/", f"{ENDPOINT}/models", f"{ENDPOINT}/openai/v1/"]
)
def test_the_endpoint_may_be_pasted_as_the_portal_shows_it(pasted):
    provider, recorder = serving(chat_completion(), endpoint=pasted, api_key="k")

    provider.request(ask("grok-4"))

    assert str(recorder.requests[0].url) == CHAT_URL


def test_the_endpoint_and_key_come_from_settings_or_the_environment(monkeypatch):
    provider, recorder = serving(chat_completion(), chat_completion(), endpoint=None)
    monkeypatch.setenv("AZURE_OPENAI_API_KEY", "env-key")
    monkeypatch.setenv("AZURE_ENDPOINT", "https://env.services.ai.azure.com")

    provider.request(ask("grok-4"))
    configured = {"azure": {"endpoint": ENDPOINT, "api_key": "set-key", "api_version": "2025"}}
    with override_settings(AGENTLOOP={"PROVIDERS": configured}):
        provider.request(ask("grok-4"))

    first, second = recorder.requests
    assert str(first.url).startswith("https://env.services.ai.azure.com/models/")
    assert first.headers["api-key"] == "env-key"
    assert str(second.url) == f"{ENDPOINT}/models/chat/completions?api-version=2025"
    assert second.headers["api-key"] == "set-key"


def test_no_endpoint_is_an_error_naming_the_setting_and_nothing_is_sent():
    provider, recorder = serving(endpoint=None, api_key="k")

    with pytest.raises(ConfigurationError) as raised:
        provider.request(ask("grok-4"))

    assert "AGENTLOOP['PROVIDERS']['azure']['endpoint']" in str(raised.value)
    assert "AZURE_ENDPOINT" in str(raised.value)
    assert recorder.requests == []


@pytest.mark.parametrize(
    ("model", "field"),
    [
        ("grok-4", "max_tokens"),
        ("gpt-5-nano", "max_completion_tokens"),
        ("o3", "max_completion_tokens"),
    ],
)
def test_the_output_cap_is_the_field_the_model_takes(model, field):
    provider, recorder = serving(chat_completion(), api_key="k")

    provider.request(ask(model).model_copy(update={"max_output_tokens": 50}))

    body = recorder.bodies[0]
    assert body[field] == 50
    assert {"max_tokens", "max_completion_tokens"} - {field} & set(body) == set()


def test_a_configured_output_cap_field_wins_for_every_model():
    provider, recorder = serving(chat_completion(), api_key="k", max_tokens_field="max_tokens")

    provider.request(ask("gpt-5-nano").model_copy(update={"max_output_tokens": 50}))

    assert recorder.bodies[0]["max_tokens"] == 50


# -- keys and Entra ID -----------------------------------------------------------------------
def test_a_missing_key_names_both_variables_and_the_entra_option():
    provider, _ = serving()

    with pytest.raises(ConfigurationError) as raised:
        provider.request(ask("grok-4"))

    for part in ("AZURE_API_KEY", "AZURE_OPENAI_API_KEY", "['credential'] = 'entra'"):
        assert part in str(raised.value)


def test_entra_sends_a_bearer_token_for_the_cognitive_services_scope_and_caches_it():
    credential = FakeCredential()
    provider, recorder = serving(
        chat_completion(), responses_answer(), chat_completion(), credential=credential
    )

    for model in ("grok-4", "gpt-5.6", "grok-4"):
        provider.request(ask(model))

    assert credential.calls == [("https://cognitiveservices.azure.com/.default",)]
    for request in recorder.requests:  # both routes share the one token
        assert request.headers["authorization"] == "Bearer entra-token-1"
        assert "api-key" not in request.headers
    assert provider.api_key() is None


def test_a_token_about_to_expire_is_replaced_before_use():
    credential = FakeCredential(lifetime=60)  # inside the refresh margin: never reused
    provider, recorder = serving(chat_completion(), chat_completion(), credential=credential)

    provider.request(ask("grok-4"))
    provider.request(ask("grok-4"))

    assert len(credential.calls) == 2
    assert recorder.requests[1].headers["authorization"] == "Bearer entra-token-2"


def test_the_token_is_not_in_an_error_that_repeats_it():
    credential = FakeCredential()
    echo = httpx.Response(401, json={"error": {"code": "401", "message": "bad entra-token-1"}})
    provider, _ = serving(echo, credential=credential)

    with pytest.raises(AuthenticationError) as raised:
        provider.request(ask("grok-4"))

    assert "entra-token-1" not in shown(raised.value)
    assert "[redacted]" in shown(raised.value)


def test_entra_from_settings_without_azure_identity_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "azure.identity", None)  # importing it now fails
    provider, recorder = serving(chat_completion())

    with override_settings(AGENTLOOP={"PROVIDERS": {"azure": {"credential": "entra"}}}):
        with pytest.raises(ConfigurationError, match=r"django-agentloop\[azure\]"):
            provider.request(ask("grok-4"))

    assert recorder.requests == []


def test_entra_from_settings_uses_default_azure_credential(monkeypatch):
    made: list[FakeCredential] = []

    def default() -> FakeCredential:
        made.append(FakeCredential())
        return made[-1]

    module = type(sys)("azure.identity")
    module.DefaultAzureCredential = default  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "azure.identity", module)
    provider, recorder = serving(chat_completion(), responses_answer())

    with override_settings(AGENTLOOP={"PROVIDERS": {"azure": {"credential": "entra"}}}):
        provider.request(ask("grok-4"))
        provider.request(ask("gpt-5.6"))

    assert len(made) == 1 and len(made[0].calls) == 1
    assert recorder.requests[1].headers["authorization"] == "Bearer entra-token-1"


def test_a_credential_that_is_no_credential_is_a_one_line_error():
    provider, _ = serving(credential="yes please")

    with pytest.raises(ConfigurationError, match="must be 'entra' or an object with get_token"):
        provider.request(ask("grok-4"))


def test_a_failing_or_malformed_credential_is_an_authentication_error():
    class Failing:
        def get_token(self, *scopes: str, **kwargs: Any) -> Any:
            raise RuntimeError("DefaultAzureCredential failed to retrieve a token\nmore lines")

    with pytest.raises(AuthenticationError, match="RuntimeError.*retrieve a token$"):
        serving(credential=Failing())[0].request(ask("grok-4"))
    with pytest.raises(AuthenticationError, match="returned no token and expiry"):
        serving(credential=FakeCredential(lifetime=-1))[0].request(ask("grok-4"))


def test_async_requests_fetch_the_token_on_a_thread_not_the_event_loop():
    credential = FakeCredential()
    provider, recorder = serving(chat_completion("async"), credential=credential)

    async def call() -> tuple[str, int]:
        response = await provider.arequest(ask("grok-4"))
        return response.content, threading.get_ident()

    content, loop_thread = asyncio.run(call())

    assert content == "async"
    assert credential.threads and loop_thread not in credential.threads
    assert recorder.requests[0].headers["authorization"] == "Bearer entra-token-1"


def test_a_token_is_reused_until_five_minutes_before_its_expiry():
    now = [1000.0]
    credential = FakeCredential(lifetime=3600, clock=lambda: now[0])
    tokens = azure_auth.EntraTokens(credential, clock=lambda: now[0])

    assert tokens.token() == "entra-token-1"
    now[0] += 3600 - 301
    assert tokens.token() == "entra-token-1"
    now[0] += 2
    assert tokens.token() == "entra-token-2"
    assert len(credential.calls) == 2


# -- prices -------------------------------------------------------------------------------
def test_azure_calls_are_priced_at_azures_price_or_not_at_all():
    usage = TokenUsage(input_tokens=1000, output_tokens=100)
    # gpt-5-nano has OpenAI's price, but Microsoft's own page gave none to read.
    assert AzureProvider().cost("gpt-5-nano", usage) is None
    assert AzureProvider().cost("grok-4-1-fast-non-reasoning", usage) is None
    # A model the catalog has no Azure entry for is not priced at OpenAI's rates either,
    # nor is one through an Azure provider configured under another name.
    assert price_of("gpt-5-mini", usage) is not None
    assert AzureProvider().cost("gpt-5-mini", usage) is None
    assert AzureProvider(name="azure-eu").cost("gpt-5-mini", usage) is None


# -- agentloop.E009 ----------------------------------------------------------------------------
def e009(**agentloop: Any) -> list[Any]:
    with override_settings(AGENTLOOP=agentloop):
        return [m for m in run_checks(databases=[]) if m.id == "agentloop.E009"]


def test_e009_a_configured_azure_provider_without_an_endpoint_fails():
    (error,) = e009(PROVIDERS={"azure": {"api_key": "k"}})

    assert error.obj == "azure"
    assert "AGENTLOOP['PROVIDERS']['azure']['endpoint']" in error.hint


def test_e009_a_default_model_on_azure_without_an_endpoint_fails():
    assert [e.obj for e in e009(DEFAULT_MODEL="azure:grok-4")] == ["azure"]


def test_e009_a_second_azure_provider_by_class_is_checked_too():
    configured = {"azure-eu": {"class": "agentloop.providers.azure.AzureProvider"}}

    assert [e.obj for e in e009(PROVIDERS=configured)] == ["azure-eu"]


def test_e009_an_endpoint_in_settings_or_the_environment_passes(monkeypatch):
    assert e009(PROVIDERS={"azure": {"endpoint": ENDPOINT}}, DEFAULT_MODEL="azure:x") == []
    monkeypatch.setenv("AZURE_ENDPOINT", ENDPOINT)
    assert e009(PROVIDERS={"azure": {}}) == []


def test_e009_other_providers_and_no_settings_pass():
    assert e009(PROVIDERS={"openai": {}}, DEFAULT_MODEL="gpt-5-nano") == []
    with override_settings(AGENTLOOP={"DEFAULT_MODEL": "azure:x"}):
        assert check_azure_endpoints() != []


# -- agentloop.W002 ----------------------------------------------------------------------------
def w002(**agentloop: Any) -> list[Any]:
    with override_settings(AGENTLOOP=agentloop):
        return [m for m in run_checks(databases=[]) if m.id == "agentloop.W002"]


def test_w002_a_default_model_on_azure_without_a_key_warns():
    (warning,) = w002(DEFAULT_MODEL="azure:grok-4", PROVIDERS={"azure": {"endpoint": ENDPOINT}})

    assert warning.obj == "azure"
    assert "AZURE_API_KEY" in warning.hint and "'entra'" in warning.hint


def test_w002_a_key_or_an_entra_credential_passes():
    configured = {"endpoint": ENDPOINT, "api_key": "k"}
    assert w002(DEFAULT_MODEL="azure:grok-4", PROVIDERS={"azure": configured}) == []
    configured = {"endpoint": ENDPOINT, "credential": FakeCredential()}
    assert w002(DEFAULT_MODEL="azure:grok-4", PROVIDERS={"azure": configured}) == []

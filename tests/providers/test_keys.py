"""API keys: the agentloop.W002 check, the error when a key is missing, and keys never leaking.

Every built-in provider class is covered (``agentloop.providers.BUILTINS``); a class whose
module can't be imported yet is skipped.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import subprocess
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.core.checks import run_checks as run_django_checks
from django.test import override_settings

from agentloop import providers
from agentloop.checks import check_provider_keys
from agentloop.exceptions import AuthenticationError, ConfigurationError, ProviderError
from agentloop.messages import Message, ModelRequest
from agentloop.models import Chat, Usage
from agentloop.models import Message as MessageRow
from agentloop.providers.http import HTTPProvider
from tests.providers.wire import Recorder

REPO = Path(__file__).resolve().parents[2]
# No vendor's key shape, so only the provider's own redaction can hide it.
KEY = "zz-agentloop-SECRET-7d1f9a0c2b4e"
#: providers authorised without an API key: AWS Bedrock signs with the AWS credentials chain
#: (tests/providers/test_bedrock.py shows its secrets never leak) and Vertex AI's OAuth tokens
#: come from google-auth (tests/providers/test_vertex.py shows they never leak).
WITHOUT_API_KEYS = {"bedrock", "vertexai"}
NAMES = sorted(set(providers.BUILTINS) - WITHOUT_API_KEYS)
NEED_KEYS = [name for name in NAMES if name != "ollama"]
ALL_KEY_VARIABLES = (
    "OPENAI_API_KEY",
    "OPENROUTER_API_KEY",
    "DEEPSEEK_API_KEY",
    "OLLAMA_API_KEY",
    "ANTHROPIC_API_KEY",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "AZURE_API_KEY",
    "AZURE_OPENAI_API_KEY",
)


def provider_class(name: str) -> type[HTTPProvider]:
    """The built-in class registered as ``name``; skips when its module isn't there yet."""
    module, _, class_name = providers.BUILTINS[name].rpartition(".")
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} does not exist yet")
    cls: type[HTTPProvider] = getattr(importlib.import_module(module), class_name)
    return cls


def ask() -> ModelRequest:
    return ModelRequest(model="test-model", messages=[Message(role="user", content="Hi")])


def setting_name(name: str) -> str:
    return f"AGENTLOOP['PROVIDERS'][{name!r}]['api_key']"


@pytest.fixture(autouse=True)
def no_keys(monkeypatch) -> None:
    """No key in the environment, whatever the machine running the tests has."""
    for variable in (*ALL_KEY_VARIABLES, "OPENAI_BASE_URL", "AZURE_OPENAI_ENDPOINT"):
        monkeypatch.delenv(variable, raising=False)
    # Azure has no default endpoint (check agentloop.E009): give its requests somewhere to go.
    monkeypatch.setenv("AZURE_ENDPOINT", "https://keys-test.services.ai.azure.com")


def run_checks() -> list[Any]:
    """Django's checks, minus the database ones (Django 6 opens every database without this)."""
    return run_django_checks(databases=[])


def w002(**agentloop: Any) -> list[Any]:
    with override_settings(AGENTLOOP=agentloop):
        return [message for message in run_checks() if message.id == "agentloop.W002"]


# -- agentloop.W002 ------------------------------------------------------------------------------
def test_w002_the_default_models_provider_without_a_key_warns():
    (warning,) = w002(DEFAULT_MODEL="claude-haiku-4-5")

    assert warning.obj == "anthropic"
    assert "'anthropic'" in warning.msg
    assert setting_name("anthropic") in warning.hint
    assert "ANTHROPIC_API_KEY" in warning.hint


def test_w002_the_default_model_written_with_its_provider_warns():
    (warning,) = w002(DEFAULT_MODEL="openrouter:openai/gpt-5-nano")

    assert warning.obj == "openrouter"
    assert "OPENROUTER_API_KEY" in warning.hint


def test_w002_a_provider_named_in_providers_but_not_by_default_model_passes():
    # Only DEFAULT_MODEL's provider is checked: a chat may never use the others (issue 12).
    providers_setting = {"openai-responses": {"base_url": "https://proxy.example/v1"}}

    assert w002(DEFAULT_MODEL="ollama:llama3.2", PROVIDERS=providers_setting) == []


def test_w002_warns_once_for_the_default_models_provider_only():
    (warning,) = w002(DEFAULT_MODEL="gpt-5-nano", PROVIDERS={"openai": {}, "anthropic": {}})

    assert warning.obj == "openai"


def test_w002_a_key_in_settings_passes_and_is_never_shown():
    with override_settings(
        AGENTLOOP={
            "DEFAULT_MODEL": "claude-haiku-4-5",
            "PROVIDERS": {"anthropic": {"api_key": KEY}},
        }
    ):
        messages = run_checks()

    assert "agentloop.W002" not in [message.id for message in messages]
    assert KEY not in " ".join(f"{m.msg} {m.hint} {m.obj}" for m in messages)


def test_w002_a_key_in_the_environment_passes(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)

    assert w002(DEFAULT_MODEL="claude-haiku-4-5") == []


def test_w002_a_provider_that_needs_no_key_passes():
    assert w002(DEFAULT_MODEL="ollama:llama3.2", PROVIDERS={"ollama": {}}) == []


def test_w002_a_provider_that_is_not_an_http_provider_passes():
    providers_setting = {"rules": {"class": "tests.worker_provider.RuleProvider"}}

    assert w002(DEFAULT_MODEL="rules:anything", PROVIDERS=providers_setting) == []


def test_w002_a_default_model_of_no_known_provider_is_left_to_fail_when_used():
    assert w002(DEFAULT_MODEL="my-finetune") == []


def test_w002_a_provider_class_that_cannot_be_imported_is_left_to_fail_when_used():
    providers_setting = {"custom": {"class": "nowhere.NoProvider"}}

    assert w002(DEFAULT_MODEL="ollama:llama3.2", PROVIDERS=providers_setting) == []


def test_w002_is_registered_with_django_and_callable_alone():
    with override_settings(AGENTLOOP={"DEFAULT_MODEL": "gpt-5-nano"}):
        assert [message.id for message in check_provider_keys()] == ["agentloop.W002"]
        assert "agentloop.W002" in [message.id for message in run_checks()]


# -- a missing key is an error when the provider is used, not before --------------------------
def refuse(request: httpx.Request) -> httpx.Response:
    raise AssertionError(f"a request was sent without a key: {request.url}")


@pytest.mark.parametrize("name", NEED_KEYS)
def test_a_missing_key_is_an_error_naming_the_setting_and_the_variables_on_use(name):
    cls = provider_class(name)
    provider = cls(name=name, transport=httpx.MockTransport(refuse))  # making it is fine

    with pytest.raises(ConfigurationError) as raised:
        provider.request(ask())

    assert setting_name(name) in str(raised.value)
    for variable in cls.api_key_env:
        assert variable in str(raised.value)


@pytest.mark.django_db
def test_a_chat_on_a_provider_without_a_key_fails_with_that_error_and_a_failed_usage_row(user):
    chat = Chat.objects.create(model="anthropic:claude-haiku-4-5", owner=user)

    with override_settings(AGENTLOOP={}), pytest.raises(ConfigurationError) as raised:
        chat.ask("Hi")

    assert "ANTHROPIC_API_KEY" in str(raised.value)
    (usage,) = Usage.objects.filter(chat=chat)
    assert usage.status == "failed"
    assert setting_name("anthropic") in usage.error


def test_importing_and_making_every_provider_needs_no_key():
    environment = {
        key: value
        for key, value in os.environ.items()
        if key not in ALL_KEY_VARIABLES and key != "DJANGO_SETTINGS_MODULE"
    }
    script = (
        "import importlib, importlib.util\n"
        "from agentloop import providers\n"
        "for name, path in sorted(providers.BUILTINS.items()):\n"
        "    module = path.rpartition('.')[0]\n"
        "    if importlib.util.find_spec(module) is None:\n"
        "        continue\n"
        "    importlib.import_module(module)\n"
        "    providers.get(name)\n"
        "    print(name)\n"
    )

    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    made = done.stdout.split()
    assert {"openai", "openai-responses", "anthropic"} <= set(made)


# -- keys never leak ------------------------------------------------------------------------------
def echo_key(status: int = 401) -> httpx.Response:
    """An error whose body repeats the key, as some servers do."""
    body = {
        "type": "error",
        "error": {
            "type": "authentication_error",
            "code": "invalid_api_key",
            "message": f"Incorrect API key provided: {KEY}.",
        },
    }
    return httpx.Response(status, json=body, headers={"x-echo": KEY})


def sent_the_key(request: httpx.Request) -> bool:
    return any(KEY in value for value in request.headers.values())


@pytest.fixture(params=["constructor", "settings", "environment"])
def key_from(request, monkeypatch) -> Iterator[str]:
    """Where the provider finds its key."""
    if request.param == "environment":
        for variable in ALL_KEY_VARIABLES:
            monkeypatch.setenv(variable, KEY)
    settings = {name: {"api_key": KEY} for name in NAMES} if request.param == "settings" else {}
    with override_settings(AGENTLOOP={"PROVIDERS": settings}):
        yield request.param


def make(name: str, key_from: str, *answers: Any) -> tuple[HTTPProvider, Recorder]:
    recorder = Recorder(*answers)
    options: dict[str, Any] = {"api_key": KEY} if key_from == "constructor" else {}
    provider = provider_class(name)(name=name, transport=recorder.transport(), **options)
    return provider, recorder


@pytest.mark.parametrize("name", NAMES)
def test_the_key_is_not_in_the_providers_repr(name, key_from):
    provider, _ = make(name, key_from)

    assert provider.api_key() == KEY
    assert KEY not in repr(provider)
    assert KEY not in str(provider)


@pytest.mark.parametrize("name", NAMES)
def test_the_key_is_not_in_an_error_whose_body_repeats_it(name, key_from, caplog):
    provider, recorder = make(name, key_from, echo_key())
    caplog.set_level(logging.DEBUG)

    with pytest.raises(ProviderError) as raised:
        provider.request(ask())

    assert sent_the_key(recorder.requests[0])  # the key was used, so hiding it means something
    error = raised.value
    assert error.status == 401
    assert "[redacted]" in (error.body or "")
    for text in (
        str(error),
        repr(error),
        error.body or "",
        "".join(traceback.format_exception(error)),
        caplog.text,
    ):
        assert KEY not in text


@pytest.mark.parametrize("name", NAMES)
def test_the_key_is_not_in_a_streamed_error_whose_body_repeats_it(name, key_from):
    provider, _ = make(name, key_from, echo_key(429))

    with pytest.raises(ProviderError) as raised:
        provider.request(ask(), on_chunk=lambda chunk: None)

    assert KEY not in str(raised.value)
    assert KEY not in (raised.value.body or "")


@pytest.mark.parametrize("name", NAMES)
def test_the_key_is_not_in_a_connection_error_that_mentions_it(name, key_from):
    def broken(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError(f"proxy refused the request with key {KEY}", request=request)

    provider, _ = make(name, key_from, broken)

    with pytest.raises(ProviderError) as raised:
        provider.request(ask())

    assert KEY not in str(raised.value)
    assert KEY not in repr(raised.value)


@pytest.mark.django_db
@pytest.mark.parametrize("name", NAMES)
def test_the_key_is_not_stored_when_a_chat_fails_with_an_error_that_repeats_it(name, user):
    provider, _ = make(name, "constructor", echo_key())
    providers.register("leaky", provider)
    try:
        chat = Chat.objects.create(model="leaky:test-model", owner=user)
        with pytest.raises(AuthenticationError):
            chat.ask("Hi")
    finally:
        providers.unregister("leaky")

    usage = Usage.objects.get(chat=chat)
    assert usage.status == "failed"
    assert "[redacted]" in usage.error
    stored = json.dumps(
        [
            list(Chat.objects.values()),
            list(MessageRow.objects.values()),
            list(Usage.objects.values()),
        ],
        default=str,
    )
    assert KEY not in stored

"""Shared fixtures: no network, a scripted provider registered as "scripted", users."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agentloop import providers
from agentloop.conf import agentloop_settings
from agentloop.testing import ScriptedProvider, block_network
from tests.agents import register_agents_provider


@pytest.fixture(autouse=True)
def _no_network() -> Iterator[None]:
    """Tests never reach a real provider: only loopback connections are allowed."""
    with block_network():
        yield


@pytest.fixture(autouse=True)
def _fresh_settings() -> Iterator[None]:
    agentloop_settings.reload()
    yield
    agentloop_settings.reload()


@pytest.fixture
def scripted() -> Iterator[ScriptedProvider]:
    """A ScriptedProvider registered as "scripted" (model "scripted:test"); add replies to it."""
    provider = ScriptedProvider()
    providers.register("scripted", provider)
    yield provider
    providers.unregister("scripted")


@pytest.fixture
def chat(user):
    """A persisted chat on the "scripted" model, owned by ``user`` (files may override it)."""
    from agentloop.models import Chat  # the models load once Django is set up

    return Chat.objects.create(model="scripted:test", owner=user)


@pytest.fixture
def user(django_user_model):
    return django_user_model.objects.create_user(username="ada", password="pw")


@pytest.fixture
def brains() -> Iterator[object]:
    """The "agents" provider (tests/agents.py): ``brains.script("You are LEAD.", replies...)``."""
    provider = register_agents_provider()
    yield provider
    providers.unregister("agents")


@pytest.fixture
def run_log(tmp_path, monkeypatch):
    """Tools in tests/tools.py log each run here (see ``tests.tools.runs``)."""
    path = tmp_path / "runs.log"
    monkeypatch.setenv("AGENTLOOP_TEST_RUN_LOG", str(path))
    return path

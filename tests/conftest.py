"""Shared fixtures: no network, a scripted provider registered as "scripted", users."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agentloop import providers
from agentloop.conf import agentloop_settings
from agentloop.testing import ScriptedProvider, block_network


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
def user(django_user_model):
    return django_user_model.objects.create_user(username="ada", password="pw")

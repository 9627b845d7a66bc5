"""Fixtures of the provider tests: providers registered over recorded traffic."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agentloop import providers
from tests.providers import cassettes
from tests.providers.aws import aws_env  # noqa: F401 (fixed AWS credentials: the Bedrock tests)


@pytest.fixture
def replaying() -> Iterator[Callable[..., cassettes.Cassette]]:
    """``replaying(cassette_name, provider_class, register_as=None, **options)``: a provider
    serving the cassette's answers in order, registered as ``register_as`` (else the class's
    built-in name) until the test ends; returns the cassette (``sent`` holds the requests).

    The key is "test-key" unless ``options`` give one (``api_key=None`` for none).
    """
    registered: list[str] = []

    def serve(
        cassette_name: str,
        provider_class: type[Any],
        register_as: str | None = None,
        **options: Any,
    ) -> cassettes.Cassette:
        cassette = cassettes.load(cassette_name)
        options.setdefault("api_key", "test-key")
        name = register_as or provider_class.name
        providers.register(name, provider_class(transport=cassette.transport(), **options))
        registered.append(name)
        return cassette

    yield serve
    for name in registered:
        providers.unregister(name)

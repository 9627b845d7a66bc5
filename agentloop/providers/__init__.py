"""Model providers and the registry that resolves ``"provider:model"`` strings.

``register(name, provider)`` makes a provider instance available under a name;
``resolve("name:model")`` returns the provider and the model id to send it.
"""

from __future__ import annotations

import threading

from ..exceptions import ConfigurationError, UnknownProviderError
from .base import ChunkCallback, Provider

__all__ = ["ChunkCallback", "Provider", "get", "register", "registered", "resolve", "unregister"]

_registry: dict[str, Provider] = {}
_lock = threading.Lock()

# Well-known model id prefixes, for model ids given without "provider:".
_PREFIXES: tuple[tuple[str, str], ...] = (
    ("gpt-", "openai"),
    ("o1", "openai"),
    ("o3", "openai"),
    ("o4", "openai"),
    ("claude-", "anthropic"),
    ("gemini-", "gemini"),
)


def register(name: str, provider: Provider) -> Provider:
    """Make ``provider`` available as ``name`` (``"name:model"``); replaces an earlier one."""
    if not name or ":" in name:
        raise ConfigurationError(f"Invalid provider name {name!r}")
    if not isinstance(provider, Provider):
        raise ConfigurationError(f"{provider!r} is not an agentloop Provider")
    with _lock:
        _registry[name] = provider
    return provider


def unregister(name: str) -> None:
    """Forget the provider registered as ``name`` (no error if there is none)."""
    with _lock:
        _registry.pop(name, None)


def registered() -> dict[str, Provider]:
    """A copy of the registry."""
    with _lock:
        return dict(_registry)


def get(name: str) -> Provider:
    """The provider registered as ``name``."""
    with _lock:
        provider = _registry.get(name)
    if provider is None:
        available = ", ".join(sorted(_registry)) or "none"
        raise UnknownProviderError(
            f"No provider is registered as {name!r} (registered: {available}). "
            f"Register one with agentloop.providers.register({name!r}, provider)."
        )
    return provider


def split_model(model: str, provider: str | None = None) -> tuple[str, str]:
    """Provider name and model id from "name:model", an explicit provider, or a known prefix."""
    if provider:
        return provider, model
    if ":" in model:
        name, _, model_id = model.partition(":")
        if name and model_id:
            return name, model_id
    for prefix, name in _PREFIXES:
        if model.startswith(prefix):
            return name, model
    raise ConfigurationError(
        f"Can't tell which provider serves model {model!r}: write it as 'provider:model' "
        "or pass provider=."
    )


def resolve(model: str, provider: str | None = None) -> tuple[Provider, str]:
    """The provider instance and the model id for a chat's model setting."""
    name, model_id = split_model(model, provider)
    return get(name), model_id

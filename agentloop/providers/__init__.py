"""Model providers and the registry that resolves ``"provider:model"`` strings.

``register(name, provider)`` makes a provider instance available under a name;
``resolve("name:model")`` returns the provider and the model id to send it. A name nobody
registered is made from ``AGENTLOOP["PROVIDERS"][name]["class"]``, else a built-in, else an
installed package's entry point in the :data:`ENTRY_POINT_GROUP` group (a plugin).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
import threading
from pathlib import Path
from typing import Any

from ..conf import agentloop_settings
from ..exceptions import ConfigurationError, UnknownProviderError
from ..import_paths import load_by_path
from .base import ChunkCallback, Provider

__all__ = [
    "BUILTINS",
    "ENTRY_POINT_GROUP",
    "ChunkCallback",
    "Provider",
    "available",
    "forget_configured",
    "get",
    "register",
    "registered",
    "resolve",
    "split_model",
    "this_process",
    "unregister",
]

_registry: dict[str, Provider] = {}
#: names whose provider was made from settings or the built-ins (dropped when settings change).
_made: set[str] = set()
_lock = threading.Lock()

# Well-known model id prefixes, for model ids given without "provider:".
_PREFIXES: tuple[tuple[str, str], ...] = (
    ("gpt-", "openai"),
    ("o1", "openai"),
    ("o3", "openai"),
    ("o4", "openai"),
    ("claude-", "anthropic"),
    ("gemini-", "gemini"),
    ("deepseek-", "deepseek"),
)


def register(name: str, provider: Provider) -> Provider:
    """Make ``provider`` available as ``name`` (``"name:model"``); replaces an earlier one."""
    if not name or ":" in name:
        raise ConfigurationError(f"Invalid provider name {name!r}")
    if not isinstance(provider, Provider):
        raise ConfigurationError(f"{provider!r} is not an agentloop Provider")
    with _lock:
        _registry[name] = provider
        _made.discard(name)
    return provider


def unregister(name: str) -> None:
    """Forget the provider registered as ``name`` (no error if there is none)."""
    with _lock:
        _registry.pop(name, None)
        _made.discard(name)


def forget_configured() -> None:
    """Drop providers made from settings, so changed settings take effect."""
    with _lock:
        for name in _made:
            _registry.pop(name, None)
        _made.clear()


def registered() -> dict[str, Provider]:
    """A copy of the registry."""
    with _lock:
        return dict(_registry)


# Providers made on first use when nobody registered the name: name -> class path.
BUILTINS: dict[str, str] = {
    "openai": "agentloop.providers.openai.OpenAIProvider",
    "openai-responses": "agentloop.providers.openai_responses.OpenAIResponsesProvider",
    "openrouter": "agentloop.providers.openai.OpenRouterProvider",
    "ollama": "agentloop.providers.openai.OllamaProvider",
    "deepseek": "agentloop.providers.openai.DeepSeekProvider",
    "anthropic": "agentloop.providers.anthropic.AnthropicProvider",
    "gemini": "agentloop.providers.gemini.GeminiProvider",
    "azure": "agentloop.providers.azure.AzureProvider",
    "bedrock": "agentloop.providers.bedrock.BedrockProvider",
    "vertexai": "agentloop.providers.vertex.VertexAIProvider",
}


#: the entry-point group of installed packages' providers: ``name = "module:ProviderClass"``
#: (``[project.entry-points."agentloop.providers"]`` in the package's pyproject.toml).
ENTRY_POINT_GROUP = "agentloop.providers"


def _plugin(name: str) -> tuple[str, Any] | None:
    """The installed package offering provider ``name`` and its class, or None."""
    offered = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP, name=name)
    packages = sorted({entry.dist.name if entry.dist else entry.value for entry in offered})
    if len(packages) > 1:
        raise ConfigurationError(
            f"Installed packages {', '.join(packages)} all offer provider {name!r} (entry point "
            f"group {ENTRY_POINT_GROUP!r}): uninstall all but one, or name the class in "
            f"AGENTLOOP['PROVIDERS'][{name!r}]['class']"
        )
    if not packages:
        return None
    entry = next(iter(offered))
    try:
        return packages[0], entry.load()
    except Exception as exc:  # whatever the package's import raises: one line naming it
        raise ConfigurationError(
            f"Provider {name!r} of the installed package {packages[0]} ({entry.value}) can't "
            f"be loaded: {type(exc).__name__}: {exc}"
        ) from exc


def _from_settings_or_builtin(name: str) -> Provider | None:
    """A provider for ``name`` from ``AGENTLOOP["PROVIDERS"][name]["class"]``, the
    built-ins, or an installed package's entry point (in that order)."""

    configured: dict[str, Any] = agentloop_settings.PROVIDERS.get(name) or {}
    path = configured.get("class") or BUILTINS.get(name)
    if path is not None:
        provider_class, origin = load_by_path(path), repr(path)
    else:
        plugin = _plugin(name)
        if plugin is None:
            return None
        origin, provider_class = f"The class of the package {plugin[0]}", plugin[1]
    provider = provider_class(name=name)
    if not isinstance(provider, Provider):
        raise ConfigurationError(f"{origin} (provider {name!r}) is not an agentloop Provider")
    return provider


def get(name: str) -> Provider:
    """The provider registered as ``name``, else a configured or built-in one (made once)."""
    with _lock:
        provider = _registry.get(name)
    if provider is None:
        provider = _from_settings_or_builtin(name)
        if provider is not None:
            with _lock:
                provider = _registry.setdefault(name, provider)
                _made.add(name)
    if provider is None:
        raise UnknownProviderError(_unknown_message(name))
    return provider


def available() -> list[str]:
    """The provider names this process was given: registered with :func:`register`,
    configured in ``AGENTLOOP["PROVIDERS"]`` (a built-in with settings, or a ``"class"``),
    or offered by an installed package (:data:`ENTRY_POINT_GROUP`).

    Built-ins nobody configured are left out, made on first use or not: listing them would
    say a provider was set up when the process only knows its class."""
    configured = {
        name
        for name, options in agentloop_settings.PROVIDERS.items()
        if (options or {}).get("class") or name in BUILTINS
    }
    installed = {entry.name for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    with _lock:
        registered_here = {name for name in _registry if name not in _made}
    return sorted(registered_here | configured | installed)


def this_process() -> str:
    """This process, as an error names it: its pid and its command (``celery -A mysite
    worker``), so an error read elsewhere (the admin, a shell) says where it happened."""
    argv = sys.argv or [""]
    words = [Path(argv[0]).name or "python", *argv[1:4]]
    command = " ".join(words)
    if len(command) > 60:
        command = command[:57] + "..."
    return f"process {os.getpid()} ({command})"


def _unknown_message(name: str) -> str:
    """One line: which process lacks ``name``, what it has, and how every process gets it."""
    names = ", ".join(available()) or "none"
    setting = f"AGENTLOOP['PROVIDERS'][{name!r}]"
    if name in agentloop_settings.PROVIDERS:
        fix = f'{setting} has no "class": name the provider class there'
    else:
        fix = (
            f'set {setting} = {{"class": "<module>.<ProviderClass>"}} in settings, install '
            f"a package that offers it (entry point group {ENTRY_POINT_GROUP!r}), or call "
            f"agentloop.providers.register({name!r}, provider) in an AppConfig.ready(), so "
            "every process (web, shell, worker) has it; register() in a shell reaches that "
            "shell only"
        )
    return (
        f"No provider is registered as {name!r} in {this_process()} "
        f"(registered or configured there: {names}): {fix} "
        '(see "Model providers" in the agentloop docs).'
    )


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


def __getattr__(name: str) -> Any:
    """The built-in provider classes by name (``providers.OpenAIProvider``), imported on use."""
    for path in BUILTINS.values():
        module, _, class_name = path.rpartition(".")
        if class_name == name:
            return getattr(importlib.import_module(module), class_name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

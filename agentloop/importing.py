"""Import paths: how persisted chats name the tools, agents and schemas a worker loads again."""

from __future__ import annotations

import importlib
from typing import Any

from .exceptions import ConfigurationError

__all__ = ["import_path_of", "load_by_path"]


def import_path_of(obj: Any) -> str:
    """The dotted path that loads ``obj`` again, or ConfigurationError if there is none."""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not module or not qualname or "<locals>" in qualname or module == "__main__":
        raise ConfigurationError(
            f"{obj!r} can't be stored by import path: define it at module level in an "
            "importable module so a worker in another process can load it."
        )
    path = f"{module}.{qualname}"
    try:
        loaded = load_by_path(path)
    except ConfigurationError:
        loaded = None
    if loaded is not obj:
        raise ConfigurationError(f"{obj!r} is not importable as {path!r}.")
    return path


def load_by_path(path: str) -> Any:
    """Import ``package.module.Name`` (nested names allowed); errors name the path."""
    parts = path.split(".")
    for split in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:split])
        try:
            target: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                continue  # this prefix is not a module; try a shorter one
            raise ConfigurationError(f"Could not import {path!r}: {exc}") from exc
        try:
            for attribute in parts[split:]:
                target = getattr(target, attribute)
        except AttributeError as exc:
            raise ConfigurationError(f"Could not import {path!r}: {exc}") from exc
        return target
    raise ConfigurationError(f"Could not import {path!r}: no such module")

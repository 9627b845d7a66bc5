"""Import paths: how persisted chats name the tools, agents and schemas a worker loads again."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from .exceptions import ConfigurationError

__all__ = ["describe", "import_path_of", "load_by_path"]


#: what the errors of :func:`import_path_of` advise, unless the caller says better.
_ADVICE = (
    "define it at module level in an importable module, so a worker in another process can load it"
)


def describe(obj: Any) -> str:
    """How an error names ``obj``: "function 'f'", "class 'C'", or its repr."""
    name = getattr(obj, "__qualname__", None)
    if inspect.isclass(obj) and name:
        return f"class {name!r}"
    if inspect.isfunction(obj) and name:
        return f"function {name!r}"
    return repr(obj)


def import_path_of(obj: Any, *, what: str | None = None, advice: str = _ADVICE) -> str:
    """The dotted path that loads ``obj`` again, or ConfigurationError if there is none.

    ``what`` names the object in the error (default: :func:`describe`), ``advice`` says how
    to fix it.
    """
    what = what or describe(obj)
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not module or not qualname or "<locals>" in qualname or module == "__main__":
        raise ConfigurationError(f"The {what} can't be stored by import path: {advice}.")
    path = f"{module}.{qualname}"
    try:
        loaded = load_by_path(path)
    except ConfigurationError:
        loaded = None
    if loaded is not obj:
        raise ConfigurationError(f"The {what} is not importable as {path!r}: {advice}.")
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

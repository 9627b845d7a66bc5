"""Every deprecated alias of agentloop, in one place: they warn, and go in 0.3.

- Moved modules (:data:`MOVED`): the old import path is the new module itself, found by a
  meta path finder that warns when an old path is imported (``include("agentloop.urls")``
  included). A package's old path covers its submodules (``agentloop.mcp._settings``).
- Moved names (:data:`MOVED_NAMES`): an old module whose names went elsewhere, some renamed;
  each name warns when it is read.
- Model verbs (:func:`add_model_aliases`, from ``AppConfig.ready``): ``Batch.refresh()``,
  ``Batch.cancel()`` and ``Chat.objects.filter(...).batch()`` call the batch service.

No module of agentloop imports an old path or this module, except the package's
``__init__`` (which installs the finder) and ``AppConfig.ready``: what is here can be
deleted whole when the aliases go.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType
from typing import Any

__all__ = ["MOVED", "MOVED_NAMES", "add_model_aliases"]

#: old module path -> the module that holds its code now.
MOVED: dict[str, str] = {
    "agentloop.events": "agentloop.live_events",
    "agentloop.importing": "agentloop.import_paths",
    "agentloop.storable": "agentloop.storable_text",
    "agentloop.mcp": "agentloop.tools.mcp",
    "agentloop.tool_context": "agentloop.tools._context",
    "agentloop.tool_refs": "agentloop.tools._references",
    "agentloop.urls": "agentloop.web.urls",
    "agentloop.views": "agentloop.web.views",
    "agentloop.permissions": "agentloop.web._access",
    "agentloop.stream_slots": "agentloop.web._access",
    "agentloop.sse": "agentloop.web._live",
    "agentloop.stream_drivers": "agentloop.web._live",
    "agentloop.ui_live": "agentloop.web._live",
    "agentloop.ui_stream": "agentloop.web._ui_protocol",
    "agentloop.ui_messages": "agentloop.web._ui_protocol",
    # Modules inside the packages that users could import by path (the packages themselves
    # export the same names, unchanged).
    "agentloop.engine.memory": "agentloop.engine.in_memory_store",
    "agentloop.engine.config": "agentloop.engine._chat_config",
    "agentloop.engine.conversation": "agentloop.engine._conversation",
    "agentloop.engine.results": "agentloop.engine._transcript_reading",
    "agentloop.runners.base": "agentloop.runners.runner",
    "agentloop.runners.sending": "agentloop.runners.enqueueing",
    "agentloop.models.messages": "agentloop.models.message",
    "agentloop.django_store.store": "agentloop.django_store.database",
}

#: old module path -> (the module its names went to, {old name: new name}).
MOVED_NAMES: dict[str, tuple[str, dict[str, str]]] = {
    "agentloop.background": (
        "agentloop.runners",
        {
            "backend_name": "runner_name",
            "enqueue": "enqueue",
            "mark_unsent": "mark_unsent",
            "wait_for_embedded_jobs": "wait_for_embedded_jobs",
        },
    ),
}


def new_path(old: str) -> str | None:
    """Where the module once imported as ``old`` is now (None: it did not move)."""
    for moved, new in MOVED.items():
        if old == moved or old.startswith(moved + "."):
            return new + old[len(moved) :]
    return None


class _Alias(importlib.abc.Loader):
    """Loads an old path as the module that holds its code now (one module object, so
    ``isinstance`` and monkeypatching see the same things under either path)."""

    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} moved to {self.new}; the old path goes in 0.3",
            DeprecationWarning,
            stacklevel=2,  # the import statement (the import system's frames are skipped)
        )
        module = importlib.import_module(self.new)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system set the alias's spec on the module: it keeps its own.
        module.__spec__ = self._spec


class _Renamed(importlib.abc.Loader):
    """Loads an old module whose names moved: each name warns when it is read."""

    def __init__(self, new: str, names: dict[str, str]) -> None:
        self.new = new
        self.names = names

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # a plain new module

    def exec_module(self, module: ModuleType) -> None:
        new, names = self.new, self.names

        def moved_name(name: str) -> Any:
            if name not in names:
                raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")
            warnings.warn(
                f"{module.__name__}.{name} moved to {new}.{names[name]}; the old path goes in 0.3",
                DeprecationWarning,
                stacklevel=2,
            )
            return getattr(importlib.import_module(new), names[name])

        module.__getattr__ = moved_name  # type: ignore[method-assign]
        module.__doc__ = f"Deprecated: the names moved to {new} (this alias goes in 0.3)."


class _MovedFinder(importlib.abc.MetaPathFinder):
    """Finds the old paths of :data:`MOVED` and :data:`MOVED_NAMES`, and nothing else."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname in MOVED_NAMES:
            target_module, names = MOVED_NAMES[fullname]
            return importlib.machinery.ModuleSpec(fullname, _Renamed(target_module, names))
        new = new_path(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(new))


def _install() -> None:
    # First: the path finder would load a moved package's submodule a second time, under
    # its old name, from the package's ``__path__``.
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())


def _batch_verb(verb: str) -> Any:
    def alias(self: Any) -> Any:
        warnings.warn(
            f"Batch.{verb}() is deprecated: use agentloop.batches.{verb}(batch)",
            DeprecationWarning,
            stacklevel=2,
        )
        # Function-local: the batch service needs the ORM's models (called once they load).
        from . import batches

        return getattr(batches, verb)(self)

    alias.__name__ = verb
    alias.__doc__ = f"Deprecated (goes in 0.3): ``agentloop.batches.{verb}(batch)``."
    return alias


def _queryset_batch(self: Any, auto_continue: bool = False) -> Any:
    """Deprecated (goes in 0.3): ``agentloop.batch(queryset)``."""
    warnings.warn(
        "Chat.objects.batch() is deprecated: use agentloop.batch(chats)",
        DeprecationWarning,
        stacklevel=2,
    )
    # Function-local: the batch service needs the ORM's models (called once they load).
    from .batches import submit

    return submit(self, auto_continue=auto_continue)


def add_model_aliases() -> None:
    """Give the models their deprecated verbs (``AppConfig.ready``: the models are loaded)."""
    # Function-local: the models load only once Django's apps are ready.
    from .models import Batch, ChatQuerySet
    from .models.chat import ChatManager

    Batch.refresh = _batch_verb("refresh")  # type: ignore[attr-defined]
    Batch.cancel = _batch_verb("cancel")  # type: ignore[attr-defined]
    ChatQuerySet.batch = _queryset_batch  # type: ignore[attr-defined]
    ChatManager.batch = _queryset_batch


_install()

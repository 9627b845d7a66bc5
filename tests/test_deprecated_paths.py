"""The old import paths of moved modules (``agentloop._deprecated``): each still imports, as the
very module that holds its code now, with a DeprecationWarning pointing at the import; and
nothing inside agentloop uses one."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest
from django.urls import include

from agentloop import _deprecated, runners

PACKAGE = Path(_deprecated.__file__).resolve().parent


def _forget(old: str) -> None:
    """Import ``old`` afresh: drop it (and its submodules) from this process's modules."""
    for name in [name for name in sys.modules if name == old or name.startswith(old + ".")]:
        del sys.modules[name]


@pytest.mark.parametrize(("old", "new"), sorted(_deprecated.MOVED.items()))
def test_an_old_path_imports_the_moved_module_with_a_warning(old, new):
    _forget(old)
    with pytest.warns(DeprecationWarning, match=rf"{old} moved to {new}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert module.__spec__.name == new  # the module keeps its own spec
    _forget(old)


def test_the_warning_points_at_the_import_statement():
    _forget("agentloop.views")
    with pytest.warns(DeprecationWarning) as caught:
        import agentloop.views  # noqa: F401
    assert [Path(warning.filename) for warning in caught] == [Path(__file__)]
    _forget("agentloop.views")


def test_a_moved_packages_submodule_is_the_same_module_under_its_old_path():
    _forget("agentloop.mcp")
    with pytest.warns(DeprecationWarning, match=r"agentloop\.mcp(\._settings)? moved") as caught:
        settings_then = importlib.import_module("agentloop.mcp._settings")
    assert [str(warning.message).split()[0] for warning in caught] == [
        "agentloop.mcp",
        "agentloop.mcp._settings",
    ]
    assert settings_then is importlib.import_module("agentloop.tools.mcp._settings")
    _forget("agentloop.mcp")


def test_including_the_old_urlconf_still_works_with_a_warning():
    _forget("agentloop.urls")
    with pytest.warns(DeprecationWarning, match="agentloop.urls moved to agentloop.web.urls"):
        urlconf, app_name, namespace = include("agentloop.urls")
    assert urlconf is importlib.import_module("agentloop.web.urls")
    assert (app_name, namespace) == ("agentloop", "agentloop")
    _forget("agentloop.urls")


def test_the_old_background_names_warn_and_are_the_runners():
    _forget("agentloop.background")
    import agentloop.background as background

    with pytest.warns(DeprecationWarning, match="agentloop.runners.runner_name"):
        assert background.backend_name is runners.runner_name
    with pytest.warns(DeprecationWarning, match="agentloop.runners.enqueue"):
        assert background.enqueue is runners.enqueue
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        background.nothing  # noqa: B018
    _forget("agentloop.background")


def test_an_unmoved_path_is_not_found_by_the_finder():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("agentloop.never_was")


def _imported_modules(path: Path) -> set[str]:
    """The agentloop modules ``path`` imports, written out whole."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    package = list(parts[:-1])  # a module's package; an __init__'s own
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found |= {module, *(f"{module}.{alias.name}" for alias in node.names)}
    return found


def test_nothing_inside_agentloop_imports_an_old_path_or_the_aliases():
    """Only the package's ``__init__`` (it installs the finder) and ``AppConfig.ready`` (the
    model aliases) import ``_deprecated``; no module imports an old path."""
    old = set(_deprecated.MOVED) | set(_deprecated.MOVED_NAMES)
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "migrations" in path.parts or path.name == "_deprecated.py":
            continue
        imported = _imported_modules(path)
        name = str(path.relative_to(PACKAGE.parent))
        if any(module == o or module.startswith(o + ".") for module in imported for o in old):
            offenders.append(f"{name}: an old path")
        if "agentloop._deprecated" in imported and name not in (
            "agentloop/__init__.py",
            "agentloop/apps.py",
        ):
            offenders.append(f"{name}: agentloop._deprecated")
    assert offenders == []

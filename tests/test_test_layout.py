"""The test suite's own shape: no module under tests/ (test modules, conftest.py files,
helpers) imports a test module (``test_*.py``), at import time or inside a function.

What several test modules share lives where pytest and readers look for it: fixtures in the
``conftest.py`` of the folder that needs them (tests/conftest.py for the whole suite),
helpers in modules named for what they hold (tests/workers.py, tests/sse_reading.py, ...).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_test_module(name: str) -> bool:
    return name.startswith("tests.") and name.rpartition(".")[2].startswith("test_")


def imported_test_modules(source: str, module: str, is_package: bool = False) -> set[str]:
    """The test modules ``module``'s source imports, wherever the import stands."""
    found: set[str] = set()
    package = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            # "from tests import test_x" names a module; "from tests.test_x import y" is one.
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in names:
            # "import tests.test_x.y" and "from tests.test_x.y import z" come from a test module
            parts = name.split(".")
            for end in range(2, len(parts) + 1):
                prefix = ".".join(parts[:end])
                if is_test_module(prefix) and prefix != module:
                    found.add(prefix)
                    break
    return found


SOURCES = sorted(path for path in TESTS.rglob("*.py") if "__pycache__" not in path.parts)


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: str(path.relative_to(TESTS)))
def test_no_module_of_the_tests_imports_a_test_module(path: Path) -> None:
    found = imported_test_modules(path.read_text(), module_name(path), path.name == "__init__.py")
    assert found == set(), (
        f"{path.relative_to(ROOT)} imports {sorted(found)}: share fixtures through a "
        "conftest.py and helpers through a module named for what it holds"
    )


@pytest.mark.parametrize(
    "source",
    [
        "from tests.test_sse import Reader",
        "from tests import test_celery_worker as workers",
        "import tests.test_docs",
        "from tests.faults.test_broker import scenario",
        "from tests.faults import test_leases",
        "from .test_mcp import calls",
        "from . import test_mcp",
        "def later():\n    from tests.test_sse import REDIS_URL",
        "if True:\n    import tests.providers.test_gemini.helpers",
    ],
)
def test_the_check_finds_every_way_of_importing_a_test_module(source: str) -> None:
    assert imported_test_modules(source, "tests.test_example") != set()


@pytest.mark.parametrize(
    "source",
    [
        "from tests.workers import Background",
        "from tests import workers, helpers",
        "import tests.sse_reading",
        "from tests.faults.parts import Workers",
        "from .tools import add",
        'load_by_path("tests.test_tools.Search.Params")',  # a string, not an import
    ],
)
def test_the_check_passes_imports_of_helpers(source: str) -> None:
    assert imported_test_modules(source, "tests.test_example") == set()

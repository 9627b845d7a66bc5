"""The test suite's own shape: no module under tests/ (test modules, conftest.py files,
helpers) imports a test module (``test_*.py``), at import time or inside a function.

What several test modules share lives where pytest and readers look for it: fixtures in the
``conftest.py`` of the folder that needs them (tests/conftest.py for the whole suite),
helpers in modules named for what they hold (tests/workers.py, tests/sse_reading.py, ...).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_test_module(name: str) -> bool:
    return name.startswith("tests.") and name.rpartition(".")[2].startswith("test_")


def imported_test_modules(
    source: str, module: str, is_package: bool = False
) -> list[tuple[int, str]]:
    """The test modules ``module``'s source imports, wherever the import stands, each with
    the line of its import."""
    found: set[tuple[int, str]] = set()
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
                    found.add((node.lineno, prefix))
                    break
    return sorted(found)


def importers_of_test_modules(paths: Iterable[Path], root: Path = ROOT) -> list[str]:
    """One line per import of a test module in ``paths``: "path:line: imports tests.test_x"."""
    offenders = []
    for path in paths:
        module = module_name(path, root)
        found = imported_test_modules(path.read_text(), module, path.name == "__init__.py")
        shown = path.relative_to(root)
        offenders.extend(f"{shown}:{line}: imports {name}" for line, name in found)
    return offenders


def sources() -> list[Path]:
    """Every Python module under tests/: test modules, conftest.py files and helpers."""
    return sorted(path for path in TESTS.rglob("*.py") if "__pycache__" not in path.parts)


def test_no_module_of_the_tests_imports_a_test_module() -> None:
    offenders = importers_of_test_modules(sources())
    assert not offenders, (
        "share fixtures through a conftest.py and helpers through a module named for what it "
        "holds, not by importing a test module:\n" + "\n".join(offenders)
    )


def test_every_importer_is_named_with_its_line(tmp_path: Path) -> None:
    """The check above fails with every offending module and line, not the first."""
    (tmp_path / "tests" / "faults").mkdir(parents=True)
    helper = tmp_path / "tests" / "helpers.py"
    helper.write_text("import json\n\nfrom tests.test_sse import Reader\n")
    conftest = tmp_path / "tests" / "faults" / "conftest.py"
    conftest.write_text("def later():\n    from . import test_broker, parts\n")
    assert importers_of_test_modules([helper, conftest], root=tmp_path) == [
        "tests/helpers.py:3: imports tests.test_sse",
        "tests/faults/conftest.py:2: imports tests.faults.test_broker",
    ]


#: every way of importing a test module (each must be found) ...
IMPORTS_OF_TEST_MODULES = [
    "from tests.test_sse import Reader",
    "from tests import test_celery_worker as workers",
    "import tests.test_docs",
    "from tests.faults.test_broker import scenario",
    "from tests.faults import test_leases",
    "from .test_mcp import calls",
    "from . import test_mcp",
    "def later():\n    from tests.test_sse import REDIS_URL",
    "if True:\n    import tests.providers.test_gemini.helpers",
]
#: ... and imports of helpers, which pass.
IMPORTS_OF_HELPERS = [
    "from tests.workers import Background",
    "from tests import workers, helpers",
    "import tests.sse_reading",
    "from tests.faults.parts import Workers",
    "from .tools import add",
    'load_by_path("tests.test_tools.Search.Params")',  # a string, not an import
]


def test_the_check_finds_every_way_of_importing_a_test_module() -> None:
    missed = [
        source
        for source in IMPORTS_OF_TEST_MODULES
        if not imported_test_modules(source, "tests.test_example")
    ]
    assert not missed, "imports of test modules not found:\n" + "\n".join(missed)


def test_the_check_passes_imports_of_helpers() -> None:
    flagged = [
        source
        for source in IMPORTS_OF_HELPERS
        if imported_test_modules(source, "tests.test_example")
    ]
    assert not flagged, "imports of helpers taken for test modules:\n" + "\n".join(flagged)

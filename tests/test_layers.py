"""The package's shape (a newcomer can carry it): no import cycles between its modules, every
function-local import says why it is local, and no module outgrows 500 lines."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "agentloop"
MAX_LINES = 500


def modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield name, path


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def top_level_imports(module: str, path: Path) -> set[str]:
    """agentloop modules imported when ``module`` is imported (not under TYPE_CHECKING, not
    inside functions)."""
    tree = ast.parse(path.read_text())
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    known = {name for name, _ in modules()}

    def add(target: str) -> None:
        # "from . import x" may name a submodule; otherwise the module itself.
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != module:
            found.add(target)

    for node in tree.body:
        nodes = node.body if isinstance(node, ast.If) and not _type_checking(node) else [node]
        for statement in nodes:
            if isinstance(statement, ast.Import):
                for alias in statement.names:
                    if alias.name.startswith("agentloop"):
                        add(alias.name)
            elif isinstance(statement, ast.ImportFrom):
                target = _resolve(module, statement, is_package)
                if target.startswith("agentloop"):
                    for alias in statement.names:
                        submodule = f"{target}.{alias.name}"
                        add(submodule if submodule in known else target)
    return found


def test_no_import_cycles_between_modules():
    graph = {name: top_level_imports(name, path) for name, path in modules()}
    # A package importing its own submodules (re-exports) is not a cycle of concern.
    edges = {
        name: {target for target in targets if not target.startswith(name + ".")}
        for name, targets in graph.items()
    }
    cycles: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                cycles.append([*stack[stack.index(target) :], target])
            elif target not in state:
                visit(target, stack)
        stack.pop()
        state[node] = 2

    for name in sorted(edges):
        if name not in state:
            visit(name, [])
    assert cycles == [], "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def _local_imports(path: Path) -> Iterator[ast.stmt]:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for child in ast.walk(node):
                if isinstance(child, ast.Import | ast.ImportFrom):
                    yield child


@pytest.mark.parametrize(("module", "path"), list(modules()), ids=lambda value: str(value))
def test_every_function_local_import_says_why(module, path):
    lines = path.read_text().splitlines()
    silent = []
    for node in _local_imports(path):
        here = lines[node.lineno - 1]
        above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
        # The reason sits on the line above (or, for a run of local imports, above the run).
        index = node.lineno - 2
        while index >= 0 and lines[index].strip().startswith(("from ", "import ")):
            index -= 1
        first_above = lines[index].strip() if index >= 0 else ""
        if "#" not in here and not above.startswith("#") and not first_above.startswith("#"):
            silent.append(f"{path.name}:{node.lineno}: {here.strip()}")
    assert silent == [], f"{module}: function-local imports without a reason:\n" + "\n".join(silent)


@pytest.mark.parametrize(("module", "path"), list(modules()), ids=lambda value: str(value))
def test_modules_stay_under_500_lines(module, path):
    count = len(path.read_text().splitlines())
    assert count < MAX_LINES, f"{module} has {count} lines: split it"

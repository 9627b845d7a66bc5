"""The package's shape (a newcomer can carry it): no import circles between its modules counting
every import; function-local imports only where listed (app loading, optional extras,
deprecated aliases), each saying why it is local; no module past a sanity limit of 1,000 lines
(modules are cut by concept, not by length); no two modules with one base name; the engine in
at most 15 modules; docs/design.md's module map naming every public module."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "agentloop"
MAX_LINES = 1000


def modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield name, path


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _inside(module: str, package: str) -> bool:
    """Whether ``module`` is ``package`` or one of its submodules."""
    return module == package or module.startswith(package + ".")


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


#: Function-local imports of agentloop's own modules, each with why it can't be at the top:
#: Django's app loading (a module the ORM's models need, imported once apps are ready), a
#: module of an optional extra, and deprecated aliases. Anything else is a layer climbing
#: back up: fix the layout instead.
LOCAL_IMPORTS = {
    ("agentloop", "agentloop.batches"): "app loading: importing agentloop loads no models",
    ("agentloop.apps", "agentloop._deprecated"): "app loading: AppConfig.ready()",
    ("agentloop.embeddings", "agentloop.embeddings.recording"): (
        "app loading: importing agentloop loads no models"
    ),
    ("agentloop.apps", "agentloop.checks"): "app loading: AppConfig.ready()",
    ("agentloop.apps", "agentloop.receivers"): "app loading: AppConfig.ready()",
    ("agentloop.tasks", "agentloop.batches"): "app loading: Celery imports tasks before apps",
    ("agentloop.tasks", "agentloop.data"): "app loading: Celery imports tasks before apps",
    ("agentloop.tasks", "agentloop.evals"): "app loading: Celery imports tasks before apps",
    ("agentloop.tasks", "agentloop.past_chats"): "app loading: Celery imports tasks before apps",
    ("agentloop.tasks", "agentloop.evals.running"): (
        "app loading: Celery imports tasks before apps"
    ),
    ("agentloop.tasks", "agentloop.evals.batch_rounds"): (
        "app loading: Celery imports tasks before apps"
    ),
    ("agentloop.providers.vertex.credentials", "agentloop.providers.vertex.transport"): (
        "optional extra: the transport imports google-auth (the vertex extra)"
    ),
    ("agentloop.web.mcp_asgi", "agentloop.models"): (
        "app loading: asgi.py imports the mount before Django's application is made"
    ),
    ("agentloop.web.mcp_asgi", "agentloop.web._mcp_server"): (
        "optional extra: the MCP server imports the mcp SDK (the mcp extra)"
    ),
    ("agentloop.management.mcp_command", "agentloop.web"): (
        "optional extra: the MCP server imports the mcp SDK (the mcp extra)"
    ),
    ("agentloop.management.mcp_command", "agentloop.web._mcp_server"): (
        "optional extra: the MCP server imports the mcp SDK (the mcp extra)"
    ),
    ("agentloop._deprecated", "agentloop.batches"): "deprecated alias (0.3): Batch.refresh",
    ("agentloop._deprecated", "agentloop.models"): "deprecated alias (0.3): ChatQuerySet.batch",
    ("agentloop._deprecated", "agentloop.models.chat"): "deprecated alias (0.3): ChatManager",
}
#: the deprecated aliases above climb back up on purpose until they go; no other import does.
DEPRECATED = {edge for edge, why in LOCAL_IMPORTS.items() if why.startswith("deprecated")}

#: Type-only imports that close a circle on purpose: the models' own relations, which Django
#: resolves by name at run time (a Message row has a foreign key to its Chat; a chat's verbs
#: return Message rows). Nothing is imported at run time.
MODEL_RELATIONS = {
    ("agentloop.models.delegations", "agentloop.models.message"): "a chat's verbs' rows",
}

#: Function-local imports of other packages: optional extras, and Django read when used.
OPTIONAL = {
    "azure": "the azure extra",
    "botocore": "the bedrock extra",
    "celery": "the celery extra",
    "django": "settings and apps read when used, not at import",
    "genai_prices": "the prices extra",
    "google": "the vertex extra",
    "jsonschema": "the mcp extra (the evals' json_schema scorer)",
    "mcp": "the mcp extra",
    "opentelemetry": "the otel extra",
    "pgvector": "the postgres extra",
    "psycopg": "the postgres extra",
    "readline": "not on every platform",
    "redis": "the celery extra",
}


def imports(module: str, path: Path) -> dict[str, set[str]]:
    """agentloop modules ``module`` imports, by where: "top" (at import time), "typing"
    (under TYPE_CHECKING) and "local" (inside a function)."""
    tree = ast.parse(path.read_text())
    is_package = path.name == "__init__.py"
    found: dict[str, set[str]] = {"top": set(), "typing": set(), "local": set()}
    known = {name for name, _ in modules()}

    def add(target: str, where: str) -> None:
        # "from . import x" may name a submodule; otherwise the module itself.
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != module:
            found[where].add(target)
        # Importing a submodule runs its packages' __init__ first, except the packages this
        # module sits in (they are already being imported when it is).
        package = target.rpartition(".")[0]
        while package and not _inside(module, package):
            found[where].add(package)
            package = package.rpartition(".")[0]

    def take(statement: ast.AST, where: str) -> None:
        if isinstance(statement, ast.Import):
            for alias in statement.names:
                if alias.name.startswith("agentloop"):
                    add(alias.name, where)
        elif isinstance(statement, ast.ImportFrom):
            target = _resolve(module, statement, is_package)
            if target.startswith("agentloop"):
                for alias in statement.names:
                    submodule = f"{target}.{alias.name}"
                    add(submodule if submodule in known else target, where)

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                visit(child, "local")
            elif isinstance(child, ast.If) and where == "top" and _type_checking(child):
                for statement in child.body:
                    take(statement, "typing")
                    visit(statement, "typing")
                for statement in child.orelse:
                    take(statement, where)
                    visit(statement, where)
            else:
                take(child, where)
                visit(child, where)

    visit(tree, "top")
    return found


def test_importing_a_submodule_counts_its_packages(tmp_path):
    """``from ..models.budgets import Budget`` runs ``agentloop/models/__init__.py`` too: the
    edge to the package is counted (a circle through a package's ``__init__`` is a circle)."""
    module = tmp_path / "counters.py"
    module.write_text("from ..models.budgets import Budget\nfrom . import limits\n")
    found = imports("agentloop.budgets.counters", module)["top"]
    assert "agentloop.models" in found and "agentloop.models.budgets" in found
    assert "agentloop.budgets" not in found  # its own package is already being imported


def top_level_imports(module: str, path: Path) -> set[str]:
    """agentloop modules imported when ``module`` is imported."""
    return imports(module, path)["top"]


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
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
    return cycles


def test_no_import_circles_counting_every_import():
    """At import time, under TYPE_CHECKING and inside functions alike, every import points
    down the layers; a package importing its own submodules counts too."""
    edges: dict[str, set[str]] = {}
    for name, path in modules():
        found = imports(name, path)
        typing_only = {target for target in found["typing"] if (name, target) in MODEL_RELATIONS}
        every = found["top"] | found["local"] | (found["typing"] - typing_only)
        edges[name] = {target for target in every if (name, target) not in DEPRECATED}
    cycles = _cycles(edges)
    assert cycles == [], "import circles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_function_local_imports_of_agentloop_are_the_listed_ones():
    found = {(name, target) for name, path in modules() for target in imports(name, path)["local"]}
    assert found == set(LOCAL_IMPORTS), (
        f"not listed: {sorted(found - set(LOCAL_IMPORTS))}; "
        f"listed but gone: {sorted(set(LOCAL_IMPORTS) - found)}"
    )


def _local_imports(path: Path) -> Iterator[ast.stmt]:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for child in ast.walk(node):
                if isinstance(child, ast.Import | ast.ImportFrom):
                    yield child


def _shown(path: Path) -> str:
    """``path`` as a reader finds it: from the clone's top folder when it is inside."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


# Each rule below checks every module and gives one line per offender ("path:line: what"),
# so a failing test names all of them at once.
def local_imports_not_optional(paths: Iterable[Path]) -> list[str]:
    """Function-local imports of other packages than agentloop that OPTIONAL doesn't list."""
    offenders = []
    for path in paths:
        for node in _local_imports(path):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                names = [] if node.level else [node.module or ""]
            others = {name.split(".")[0] for name in names if not name.startswith("agentloop")}
            if others - set(OPTIONAL):
                unlisted = ", ".join(sorted(others - set(OPTIONAL)))
                offenders.append(f"{_shown(path)}:{node.lineno}: {ast.unparse(node)} ({unlisted})")
    return offenders


def local_imports_without_a_reason(paths: Iterable[Path]) -> list[str]:
    """Function-local imports without a comment saying why."""
    offenders = []
    for path in paths:
        lines = path.read_text().splitlines()
        for node in _local_imports(path):
            here = lines[node.lineno - 1]
            above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
            # The reason sits on the line above (or, for a run of local imports, above the run).
            index = node.lineno - 2
            while index >= 0 and lines[index].strip().startswith(("from ", "import ")):
                index -= 1
            first_above = lines[index].strip() if index >= 0 else ""
            if "#" not in here and not above.startswith("#") and not first_above.startswith("#"):
                offenders.append(f"{_shown(path)}:{node.lineno}: {here.strip()}")
    return offenders


def modules_too_long(paths: Iterable[Path]) -> list[str]:
    """Modules of MAX_LINES lines or more."""
    counts = [(path, len(path.read_text().splitlines())) for path in paths]
    return [f"{_shown(path)}: {count} lines" for path, count in counts if count >= MAX_LINES]


def module_paths() -> list[Path]:
    return [path for _, path in modules()]


def test_function_local_imports_of_other_packages_are_optional_ones():
    offenders = local_imports_not_optional(module_paths())
    assert not offenders, "\n".join(["local imports of packages not in OPTIONAL:", *offenders])


def test_every_function_local_import_says_why():
    offenders = local_imports_without_a_reason(module_paths())
    assert not offenders, "\n".join(["local imports without a comment saying why:", *offenders])


def test_modules_stay_under_the_sanity_limit():
    offenders = modules_too_long(module_paths())
    assert not offenders, "\n".join(
        [f"{MAX_LINES} lines or more (more than one concept?):", *offenders]
    )


def test_each_rule_names_every_offender(tmp_path):
    """The three rules above fail with every offending module and line, not the first."""
    first, second = tmp_path / "first.py", tmp_path / "second.py"
    first.write_text("def run():\n    import requests\n")
    second.write_text(
        "def run():\n    import yaml  # a reason, but not an optional extra\n"
        + "\n" * MAX_LINES
        + "def later():\n    from django.conf import settings\n"
    )
    assert local_imports_not_optional([first, second]) == [
        f"{first}:2: import requests (requests)",
        f"{second}:2: import yaml (yaml)",
    ]
    assert local_imports_without_a_reason([first, second]) == [
        f"{first}:2: import requests",
        f"{second}:{MAX_LINES + 4}: from django.conf import settings",
    ]
    assert modules_too_long([first, second]) == [f"{second}: {MAX_LINES + 4} lines"]


def _module_map() -> str:
    """The module map of docs/design.md: the first fenced block under "The layers"."""
    text = (ROOT / "docs" / "design.md").read_text()
    start = text.index("```\nagentloop/")
    return text[start : text.index("\n```", start + 4)]


#: Base names more than one module may bear, each with the modules and why. A provider
#: family's package names what its module holds: ``batch_apis/openai.py`` is OpenAI's batch
#: API beside ``providers/openai.py``, the OpenAI provider; ``base.py`` is each package's own
#: seam (the Provider, the BatchAPI, Gemini's shared base); ``provider.py`` and ``mapping.py``
#: are a family's provider and its wire mapping. Nothing outside ``providers/`` shares a name.
SHARED_BASE_NAMES = {
    "anthropic.py": {"providers/anthropic.py", "providers/batch_apis/anthropic.py"},
    "openai.py": {"providers/openai.py", "providers/batch_apis/openai.py"},
    "base.py": {"providers/base.py", "providers/batch_apis/base.py", "providers/gemini/base.py"},
    "provider.py": {
        "providers/bedrock/provider.py",
        "providers/gemini/provider.py",
        "providers/vertex/provider.py",
    },
    "mapping.py": {"providers/bedrock/mapping.py", "providers/gemini/mapping.py"},
}

#: the engine's modules (``__init__.py`` aside): each a concept a newcomer can name.
MAX_ENGINE_MODULES = 15


def base_name(path: Path) -> str:
    """A module's name as a reader says it: ``_chats.py`` and ``chats.py`` are one name."""
    return path.name.lstrip("_")


def shared_base_names(paths: Iterable[Path], package: Path = PACKAGE) -> list[str]:
    """One line per base name two modules or more bear (``__init__.py`` aside) that
    ``SHARED_BASE_NAMES`` doesn't list with exactly those modules."""
    holders: dict[str, set[str]] = {}
    for path in paths:
        if path.name != "__init__.py":
            holders.setdefault(base_name(path), set()).add(str(path.relative_to(package)))
    return [
        f"{name}: {', '.join(sorted(found))}"
        for name, found in sorted(holders.items())
        if len(found) > 1 and SHARED_BASE_NAMES.get(name) != found
    ]


def test_no_two_modules_share_a_base_name():
    offenders = shared_base_names(module_paths())
    assert not offenders, "\n".join(["modules sharing a base name:", *offenders])


def test_a_shared_base_name_is_found_with_every_module_that_bears_it(tmp_path):
    for name in ("a/rows.py", "b/rows.py", "c/_rows.py", "a/__init__.py", "b/__init__.py"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("")
    assert shared_base_names(sorted(tmp_path.rglob("*.py")), tmp_path) == [
        "rows.py: a/rows.py, b/rows.py, c/_rows.py"
    ]


def test_the_engine_has_at_most_fifteen_modules():
    engine = sorted(
        path.name for path in (PACKAGE / "engine").glob("*.py") if path.name != "__init__.py"
    )
    assert len(engine) <= MAX_ENGINE_MODULES, f"{len(engine)} engine modules: {engine}"


def test_the_design_pages_module_map_names_every_public_module_and_no_other():
    """The map names each module by its base name (unique, above), a private one (``_x.py``)
    at will: its package is what users import. Every name it gives is a module (or, like
    ``manage.py``, a file at the project's top)."""
    named = set(re.findall(r"(?<![\w.])(\w+\.py)\b", _module_map()))
    modules_ = [path for path in module_paths() if path.name != "__init__.py"]
    missing = [
        _shown(path)
        for path in modules_
        if not path.name.startswith("_") and path.name not in named
    ]
    top = {path.name for path in ROOT.glob("*.py")}
    stale = sorted(named - {path.name for path in modules_} - top - {"__init__.py"})
    assert missing == [], "docs/design.md's module map doesn't name: " + ", ".join(missing)
    assert stale == [], "docs/design.md's module map names no module: " + ", ".join(stale)

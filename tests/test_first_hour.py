"""What a new user meets in the first hour stays true (issue 26): the docs agree with the code
and with each other, and the package metadata says where the docs are."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import django
from django.core.management import load_command_class

from tests.doc_blocks import blocks_of

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def python_blocks(page: str) -> list[str]:
    return [
        block.code for block in blocks_of((DOCS / page).read_text()) if block.language == "python"
    ]


def test_the_celery_app_its_import_and_settings_are_on_the_install_page_only():
    install = python_blocks("install.md")
    canonical = [
        code for code in install
        if code.startswith(("# mysite/celery.py", "# mysite/__init__.py"))
        or code.startswith("# mysite/settings.py") and "CELERY_BROKER_URL" in code
    ]  # fmt: skip
    others = [page for page in sorted(DOCS.rglob("*.md")) if page.name != "install.md"]
    repeated = [
        (page.relative_to(DOCS).as_posix(), code.splitlines()[0])
        for page in others
        for code in python_blocks(page.relative_to(DOCS).as_posix())
        if code in canonical or code.startswith(("# mysite/celery.py", "# mysite/__init__.py"))
    ]

    assert len(canonical) == 3
    assert repeated == []
    assert "(install.md#5-the-celery-app)" in (DOCS / "background.md").read_text()


def test_background_first_example_defines_its_tool_in_a_project_module():
    first_tool = next(code for code in python_blocks("background.md") if "@tool" in code)
    assert first_tool.startswith("# myapp/tools.py")
    assert "wait_for_embedded_jobs" not in (DOCS / "background.md").read_text()


def test_the_commands_page_lists_exactly_the_agentloop_subcommands():
    command = load_command_class("agentloop", "agentloop")
    parser = command.create_parser("manage.py", "agentloop")
    (subparsers,) = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    listed = re.findall(
        r"^## `manage\.py agentloop ([\w-]+)`$", (DOCS / "commands.md").read_text(), re.M
    )

    assert sorted(listed) == sorted(subparsers.choices)
    assert len(listed) == len(set(listed))


def test_the_install_extras_table_lists_every_extra():
    text = (DOCS / "install.md").read_text()
    rows = set(re.findall(r"^\| `([\w-]+)` \|", text, re.M))

    assert rows == set(PYPROJECT["project"]["optional-dependencies"])


def test_classifiers_name_every_supported_django():
    classifiers = PYPROJECT["project"]["classifiers"]
    dependency = next(d for d in PYPROJECT["project"]["dependencies"] if d.startswith("Django"))

    assert dependency == "Django>=5.2,<7"
    assert {"Framework :: Django :: 5.2", "Framework :: Django :: 6.0"} <= set(classifiers)
    assert f"Framework :: Django :: {django.VERSION[0]}.{django.VERSION[1]}" in classifiers


def test_the_project_urls_point_at_the_repository_and_its_docs_folder():
    urls = PYPROJECT["project"]["urls"]
    repository = urls["Repository"]

    assert repository.startswith("https://github.com/")
    assert urls["Documentation"] == f"{repository}/tree/main/docs"
    assert urls["Changelog"] == f"{repository}/blob/main/CHANGELOG.md"


def test_the_docs_import_nothing_private():
    private = re.compile(r"\bagentloop(?:\.\w+)*\._[a-z]")
    found = [
        f"{page.relative_to(ROOT)}: {match.group(0)}"
        for page in sorted(DOCS.rglob("*.md"))
        for match in private.finditer(page.read_text())
    ]
    assert found == []


def _messages_naming_docs_paths(path: Path) -> list[str]:
    """String constants (not docstrings) of a module that name a file under docs/."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and re.search(r"docs/[\w/-]+\.md", node.value)
    ]


def test_messages_name_docs_pages_by_title_not_by_path():
    found = [hit for path in sorted((ROOT / "agentloop").rglob("*.py"))
             for hit in _messages_naming_docs_paths(path)]  # fmt: skip
    assert found == []


def test_the_w005_figure_is_the_same_on_both_pages():
    figure = "155 steps/s without it, 325 with it"
    assert figure in (DOCS / "reference" / "checks.md").read_text()
    assert figure in " ".join((DOCS / "running-at-scale.md").read_text().split())
    assert (
        "| Redis | 2 | 729.3 | 154.7 | 0.21 | 324.5 |" in (ROOT / "bench" / "README.md").read_text()
    )


def test_the_changelog_has_upgrade_notes_for_the_next_release():
    text = (ROOT / "CHANGELOG.md").read_text()
    unreleased = text.split("## [Unreleased]", 1)[1].split("\n## [", 1)[0]

    assert "\n### Upgrading\n" in unreleased
    assert "manage.py migrate" in unreleased.split("### Upgrading", 1)[1].split("\n### ", 1)[0]

"""The documentation site (mkdocs.yml) builds strictly: every page in the navigation, no
broken link or anchor, every ``::: module`` reference found; and the API reference
documents the public modules only (docs/design.md, "Public modules").

The build needs the docs extra (MkDocs, Material, mkdocstrings; the dev extra brings it):
without it the build test is skipped with the reason, except under ``CI=true``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
REFERENCE = DOCS / "reference"
IN_CI = os.environ.get("CI") == "true"
#: a mkdocstrings directive: ``::: agentloop.models`` at the start of a line.
_DIRECTIVE = re.compile(r"^::: ([\w.]+)\s*$", re.MULTILINE)


def public_modules() -> set[str]:
    """The modules docs/design.md lists under "Public modules"."""
    design = (DOCS / "design.md").read_text()
    start = design.index("### Public modules")
    section = design[start : design.index("\n## ", start)]
    # "- `agentloop.budgets`, `agentloop.rate_limits`: what they hold": the names before the colon.
    return {
        name for line in re.findall(r"^- (.+)$", section, re.MULTILINE)
        for name in re.findall(r"`(agentloop[\w.]*)`", line.split(":", 1)[0])
    }  # fmt: skip


def top_level(module: str) -> bool:
    """``agentloop.<name>``, not private."""
    return re.fullmatch(r"agentloop\.[a-z]\w*", module) is not None


def referenced_modules() -> dict[str, list[str]]:
    """Each reference page (relative path) -> the modules its directives render."""
    return {
        page.relative_to(DOCS).as_posix(): _DIRECTIVE.findall(page.read_text())
        for page in sorted(REFERENCE.rglob("*.md"))
        if _DIRECTIVE.search(page.read_text())
    }


def test_the_api_reference_renders_public_modules_only():
    public = public_modules()
    assert {"agentloop", "agentloop.models", "agentloop.web"} <= public

    rendered = [name for names in referenced_modules().values() for name in names]
    # Listed, or a module of the agentloop package itself (agentloop.tasks): never a module
    # inside a subpackage, whose layout may change (agentloop.engine.conversation).
    assert [name for name in rendered if name not in public and not top_level(name)] == []
    assert len(rendered) == len(set(rendered)), "a module is rendered on two pages"


def test_the_api_reference_covers_every_public_module():
    rendered = {name for names in referenced_modules().values() for name in names}
    # A URLconf has no API (its urlpatterns): the web page names its include() instead.
    assert public_modules() - {"agentloop.web.urls"} - rendered == set()


def built_page(site: Path, page: Path) -> Path:
    """Where the build writes a page: ``a/b.md`` -> ``a/b/index.html``, ``a/index.md`` ->
    ``a/index.html``."""
    relative = page.relative_to(DOCS).with_suffix("")
    folder = relative.parent if relative.name == "index" else relative
    return site / folder / "index.html"


def test_a_module_inside_a_subpackage_is_not_top_level():
    assert top_level("agentloop.tasks")
    assert not top_level("agentloop._deprecated")
    assert not top_level("agentloop.engine.conversation")


def test_the_directive_pattern_reads_what_the_pages_hold():
    page = "# API\n\n::: agentloop.models\n    options:\n      members: [Chat]\n::: agentloop.web\n"
    assert _DIRECTIVE.findall(page) == ["agentloop.models", "agentloop.web"]


@pytest.mark.subprocess
@pytest.mark.timeout(300)
def test_the_site_builds_strictly(tmp_path):
    if not all(importlib.util.find_spec(name) for name in ("mkdocs", "mkdocstrings")):
        reason = "mkdocs is not installed (pip install -e '.[docs]')"
        if IN_CI:
            pytest.fail(f"{reason}; under CI=true the docs site must build")
        pytest.skip(reason)
    site = tmp_path / "site"
    result = subprocess.run(  # noqa: S603 - this interpreter's own mkdocs
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
         str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=280, check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr

    # Every page of docs/ became a page of the site (strict mode refuses one left out of the nav).
    pages = sorted(DOCS.rglob("*.md"))
    assert [page for page in pages if not built_page(site, page).is_file()] == []
    # The reference is rendered from the docstrings: each module's heading, and each signal.
    for page, modules in referenced_modules().items():
        html = built_page(site, DOCS / page).read_text()
        for module in modules:
            if module not in ("agentloop.signals", "agentloop.exceptions"):
                assert f'id="{module}"' in html, (page, module)
    signals_page = (site / "reference" / "signals" / "index.html").read_text()
    signals = importlib.import_module("agentloop.signals")
    assert [n for n in signals.__all__ if f'id="agentloop.signals.{n}"' not in signals_page] == []

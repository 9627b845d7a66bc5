"""The documentation's Python examples run, offline, against the real database.

Every ```python block of docs/**/*.md and README.md runs, except one preceded by the
HTML comment ``<!-- no-run -->``. A page's blocks run in order in one namespace, so
a later block uses what an earlier one defined.

That namespace is a module named ``myapp.tools``, registered in ``sys.modules``
while the page runs: the examples are written as the reader's own project code,
and persisted chats keep their tools by import path, so a tool a page defines must
be importable (``from myapp.tools import add`` works, and so does loading
``myapp.tools.add`` back from a chat row).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agentloop import providers
from tests.doc_blocks import ROOT, blocks_of, example_module, runnable

PAGES = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]

_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
#: promises of what isn't there ("providers are coming"), and to-do marks.
_PROMISE = re.compile(
    r"\b(?:is|are)\s+coming\b|\bcoming\s+soon\b|\bin\s+a\s+(?:future|later)\s+(?:release|version)\b"
    r"|\bnot\s+(?:on\s+\w+|documented(?:\s+here)?|implemented|supported|released|published)\s+yet\b"
    r"|\b(?:TODO|TBD|FIXME)\b",
    re.IGNORECASE,
)
#: placeholders where a real address belongs ("<agentloop repository URL>", "<your-org>").
_PLACEHOLDER_URL = re.compile(
    r"<[^<>\n]*\bURL\b[^<>\n]*>|<(?:your|YOUR)[\w -]*>"
    r"|https?://(?:github|gitlab)\.com/(?:<|your|YOUR|USER|OWNER)"
)


def page_id(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def test_blocks_of_skips_a_block_marked_no_run():
    page = "Text\n\n<!-- no-run -->\n```python\nskipped()\n```\n\n```python\nran = 1\n```\n"

    blocks = blocks_of(page)

    assert [(block.code, block.runs) for block in blocks] == [
        ("skipped()\n", False),
        ("ran = 1\n", True),
    ]


def test_a_provider_made_from_settings_before_a_page_follows_the_settings_after_it(settings):
    # Pages share a worker process: one made from settings (by a test, or a background job
    # still running after its page) must not outlive a later page's override_settings.
    made = providers.get("offline")
    with example_module():
        pass

    settings.AGENTLOOP = {
        **settings.AGENTLOOP,
        "PROVIDERS": {"offline": {"class": "agentloop.testing.OfflineProvider", "reply": "Hi."}},
    }

    assert providers.get("offline") is not made


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_page_has_a_runnable_example(page):
    assert runnable(page), f"{page.name} has no runnable Python example"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_page_examples_run(page, example_module):
    namespace = example_module.__dict__
    for block in runnable(page):
        # Compiled with padding so tracebacks name the page's own line numbers.
        source = "\n" * (block.line - 1) + block.code
        exec(compile(source, str(page), "exec"), namespace)  # noqa: S102


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_page_links_point_to_existing_files(page):
    broken = []
    for target in _LINK.findall(page.read_text()):
        if "://" in target or target.startswith(("#", "mailto:")):
            continue
        path = target.split("#", 1)[0]
        if path and not (page.parent / path).exists():
            broken.append(target)
    assert broken == []


@pytest.mark.parametrize("index", sorted((ROOT / "docs").rglob("index.md")), ids=page_id)
def test_index_links_every_page(index):
    linked = set(_LINK.findall(index.read_text()))
    pages = {page.name for page in PAGES if page.parent == index.parent} - {"index.md"}
    sections = {f"{d.name}/index.md" for d in index.parent.iterdir() if (d / "index.md").is_file()}
    assert (pages | sections) - linked == set()


def drift(text: str) -> list[str]:
    """The promises and placeholder addresses in a page (across line breaks), with line numbers."""
    return [
        f"{text.count(chr(10), 0, match.start()) + 1}: {match.group(0)!r}"
        for pattern in (_PROMISE, _PLACEHOLDER_URL)
        for match in pattern.finditer(text)
    ]


@pytest.mark.parametrize(
    "stale",
    [
        "Real providers (OpenAI, Anthropic, Gemini) are coming. Until then, use",
        "Real providers (OpenAI, Anthropic, Gemini) are\ncoming, wrapped.",
        "names its provider, but those providers are coming)",
        "Streaming is coming soon.",
        "git clone <agentloop repository URL> agentloop",
        "agentloop is not on PyPI yet; install it from a clone",
        "Background execution (built, not documented here yet):",
        "See https://github.com/your-org/agentloop for the source.",
        "TODO: document the sweeper.",
    ],
)
def test_the_drift_check_catches_promises_and_placeholder_urls(stale):
    assert drift(f"Intro.\n{stale}\n") != []


@pytest.mark.parametrize(
    "fine",
    [
        "A provider that is becoming popular; incoming messages; upcoming chunks.",
        '<form method="post" action="{% url \'agentloop:cancel\' chat.pk %}">',
        "a cancel that was requested but not yet seen",
        "those not collected yet.",
        "https://proxy.example/v1",
    ],
)
def test_the_drift_check_passes_plain_text(fine):
    assert drift(fine) == []


@pytest.mark.parametrize("page", [*PAGES, ROOT / "CHANGELOG.md"], ids=page_id)
def test_page_promises_nothing_and_has_no_placeholder_urls(page):
    assert drift(page.read_text()) == []

"""The documentation's code blocks as the docs tests run them: a Markdown page's fenced
blocks (:func:`blocks_of`), its runnable Python ones (:func:`runnable`), and the namespace
they run in (:func:`example_module`, a fresh ``myapp.tools``; the ``example_module`` fixture
of tests/conftest.py)."""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from agentloop import providers, signals

ROOT = Path(__file__).resolve().parent.parent
NO_RUN = "<!-- no-run -->"
EXAMPLE_MODULE = "myapp.tools"

_FENCE = re.compile(r"^```(\w*)\s*$")
_SIGNALS = [getattr(signals, name) for name in signals.__all__]


@dataclass
class Block:
    language: str
    code: str
    line: int  # where the code starts in the page (1-based)
    runs: bool


def blocks_of(text: str) -> list[Block]:
    """The fenced code blocks of a Markdown page, each marked run or no-run."""
    lines = text.splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        previous = next((line.strip() for line in reversed(lines[:index]) if line.strip()), "")
        end = index + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        code = "\n".join(lines[index + 1 : end]) + "\n"
        found.append(Block(opening.group(1), code, index + 2, previous != NO_RUN))
        index = end + 1
    return found


def runnable(page: Path) -> list[Block]:
    """The Python blocks of ``page`` that run (not marked no-run)."""
    return [
        block for block in blocks_of(page.read_text()) if block.language == "python" and block.runs
    ]


@contextmanager
def example_module() -> Iterator[types.ModuleType]:
    """A fresh ``myapp.tools`` module; providers and signal receivers are restored after."""
    package = types.ModuleType("myapp")
    package.__path__ = []
    module = types.ModuleType(EXAMPLE_MODULE)
    package.tools = module  # type: ignore[attr-defined]
    saved_modules = {name: sys.modules.get(name) for name in ("myapp", EXAMPLE_MODULE)}
    sys.modules["myapp"] = package
    sys.modules[EXAMPLE_MODULE] = module
    saved_providers = providers.registered()
    # Made from settings, not registered: put back by forgetting them (made again on use), as
    # registering them again would keep them through a later page's override_settings.
    made_from_settings = set(providers._made)
    saved_receivers = [(signal, list(signal.receivers)) for signal in _SIGNALS]
    try:
        yield module
    finally:
        for name, previous in saved_modules.items():
            if previous is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous
        for name, provider in providers.registered().items():
            if saved_providers.get(name) is not provider:
                providers.unregister(name)
        current = providers.registered()
        for name, provider in saved_providers.items():
            if name not in made_from_settings and current.get(name) is not provider:
                providers.register(name, provider)
        for signal, receivers in saved_receivers:
            with signal.lock:
                signal.receivers[:] = receivers
                signal.sender_receivers_cache.clear()


#: the install checklist, whose site blocks tests/test_install.py builds a site from.
INSTALL_PAGE = ROOT / "docs" / "install.md"
#: a block of docs/install.md that is a file of the site: "# mysite/<file>[: add at the end]".
_SITE_FILE = re.compile(r"^# mysite/(?P<file>[\w/.]+)(?P<append>: add at the end)?$")


def site_files(page: str) -> list[tuple[str, str, bool]]:
    """(file under mysite/, code, append?) for each site block of the install page, in order."""
    found = []
    for block in blocks_of(page):
        first_line = block.code.split("\n", 1)[0]
        match = _SITE_FILE.match(first_line)
        if block.language == "python" and match:
            found.append((match["file"], block.code, bool(match["append"])))
    return found

"""The public API is typed (issue 26): mypy, with the project's configuration, finds no error
in tests/typing_checks/public_api.py (its ``assert_type`` lines pin what ``@tool``,
``agentloop.chat()`` and the verbs return) and exactly the expected errors in
tests/typing_checks/wrong_use.py, which would pass silently if those returned ``Any``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Not tests/typing_checks/: a script run from tests/ (python tests/mcp_server.py) would import that
# folder as the standard library's typing module.
HERE = Path(__file__).resolve().parent / "typing_checks"

pytestmark = [pytest.mark.subprocess, pytest.mark.timeout(600)]


def mypy(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603 - the test run's own interpreter
        [sys.executable, "-m", "mypy", "--no-error-summary", str(path.relative_to(ROOT))],
        cwd=ROOT, capture_output=True, text=True, timeout=540, check=False,
    )  # fmt: skip


def test_the_typed_uses_of_the_public_api_check_clean():
    result = mypy(HERE / "public_api.py")
    assert (result.returncode, result.stdout) == (0, ""), result.stdout + result.stderr


def test_wrong_uses_of_the_public_api_are_type_errors():
    result = mypy(HERE / "wrong_use.py")
    errors = re.findall(r"wrong_use\.py:(\d+): error: .*\[([\w-]+)\]$", result.stdout, re.M)

    assert result.returncode == 1, result.stdout + result.stderr
    assert errors == [("17", "attr-defined"), ("18", "assignment"), ("19", "attr-defined")]

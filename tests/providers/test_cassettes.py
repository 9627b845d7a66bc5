"""The replay modules' helpers (tests/providers/cassettes.py): what the tests that read the
recordings do when the recordings are absent (a fresh clone has none beside it), and the
"N of M cassettes pass" count."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.providers import cassettes

ROOT = Path(__file__).resolve().parents[2]


def test_absent_recordings_skip_with_one_line_naming_the_folder_and_how_to_get_it(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(cassettes, "IN_CI", False)
    absent = tmp_path / "providers-cloud"

    with pytest.raises(pytest.skip.Exception) as skipped:
        cassettes.load("chat_basic_chat_functionality", absent)

    reason = skipped.value.msg
    assert reason is not None and "\n" not in reason
    assert f"recorded provider traffic not found at {absent}:" in reason
    assert "../shared/fixtures/" in reason and "AGENTLOOP_FIXTURES" in reason
    # called while pytest imports a module, it skips the module instead of erring
    assert skipped.value.allow_module_level


def test_under_ci_absent_recordings_fail(tmp_path, monkeypatch):
    monkeypatch.setattr(cassettes, "IN_CI", True)
    absent = tmp_path / "providers"

    with pytest.raises(pytest.fail.Exception, match="under CI=true the replay tests must run"):
        cassettes.require_fixtures(absent)


def test_present_recordings_are_read(tmp_path):
    (tmp_path / "one.yml").write_text("http_interactions: []\n")
    assert cassettes.require_fixtures(tmp_path) == tmp_path
    assert cassettes.load("one", tmp_path).interactions == []


def _collect(fixtures: Path) -> subprocess.CompletedProcess[str]:
    """``pytest --collect-only`` of every module that reads the recordings, with
    AGENTLOOP_FIXTURES at ``fixtures`` (and CI unset)."""
    modules = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "tests").rglob("test_*.py"))
        if "cassettes" in path.read_text() and path != Path(__file__).resolve()
    ]
    environment = {k: v for k, v in os.environ.items() if k != "CI"}
    environment["AGENTLOOP_FIXTURES"] = str(fixtures)
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    return subprocess.run(
        [*command, *modules], cwd=ROOT, env=environment, capture_output=True, text=True
    )


@pytest.mark.subprocess
def test_without_the_recordings_collection_skips_instead_of_erring(tmp_path):
    """A fresh clone has no ../shared beside it: the modules that read the recordings on
    import are skipped, each naming the folder; none is a collection error."""
    absent = tmp_path / "shared" / "fixtures" / "providers"

    collected = _collect(absent)

    shown = collected.stdout[-4000:] + collected.stderr[-2000:]  # the errors and the summary
    assert collected.returncode == 0, shown
    assert "error" not in collected.stdout.splitlines()[-1], shown
    assert f"recorded provider traffic not found at {absent}:" in collected.stdout


class _Report:
    """The fields of a ``pytest.TestReport`` that PassCounts reads."""

    def __init__(self, test: str, when: str, outcome: str) -> None:
        self.nodeid = f"tests/providers/test_x_replay.py::{test}"
        self.when = when
        self.failed = outcome == "failed"
        self.skipped = outcome == "skipped"


def test_a_cassette_passes_only_when_every_test_of_it_passed():
    counts = cassettes.PassCounts("tests.providers.test_x_replay", "X replay", "x")
    for report in [
        _Report("test_request[passes]", "setup", "passed"),
        _Report("test_request[passes]", "call", "passed"),
        _Report("test_request[fails]", "call", "failed"),
        _Report("test_request[set_up_skipped]", "setup", "skipped"),  # recordings absent
        _Report("test_request[xfails]", "call", "skipped"),
    ]:
        counts.pytest_runtest_logreport(report)  # type: ignore[arg-type]

    assert counts.results == {
        "passes": True,
        "fails": False,
        "set_up_skipped": False,
        "xfails": False,
    }

"""The React page of frontends/usechat, built with node (``npm ci``, ``npm run build``) when its
build output is missing or older than its sources; the output stays in the tree (git-ignored).
Used by the useChat browser test and by the test that follows docs/frontends.md. And the
AG-UI client of frontends/agui-client (``npm ci`` only: its script runs as it is), used by
tests/test_ag_ui_client.py."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.processes import REPO_ROOT

FRONTEND = REPO_ROOT / "frontends" / "usechat"
AGUI_CLIENT = REPO_ROOT / "frontends" / "agui-client"
BUILT = FRONTEND / "dist" / "usechat.js"
IN_CI = os.environ.get("CI") == "true"


def node_missing() -> str | None:
    """Why the page can't be built here (None: node and npm are installed)."""
    for program in ("node", "npm"):
        if shutil.which(program) is None:
            return f"{program} is not installed (apt-get install nodejs npm)"
    return None


def skip_or_fail(reason: str, what: str) -> None:
    """Skip for ``reason``; under CI=true fail instead (``what`` must run there)."""
    if IN_CI:
        pytest.fail(f"{reason}; under CI=true {what} must run")
    pytest.skip(reason)


def stale() -> bool:
    """The build is missing, or older than a source, the lock file or the configuration."""
    if not BUILT.exists():
        return True
    sources = [*FRONTEND.joinpath("src").rglob("*"), FRONTEND / "package-lock.json"]
    sources.append(FRONTEND / "vite.config.js")
    return max(path.stat().st_mtime for path in sources) > BUILT.stat().st_mtime


def npm(*args: str, folder: Path = FRONTEND) -> None:
    result = subprocess.run(  # noqa: S603 - npm with fixed arguments
        ["npm", *args],  # noqa: S607 - found on PATH, like any developer's npm
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, f"npm {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"


def build() -> Path:
    """The built page's folder (``dist/``), built first when stale. One pytest process
    builds at a time (a file lock): the others wait, then find it built."""
    with (FRONTEND / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stale():
            if not (FRONTEND / "node_modules" / ".package-lock.json").exists():
                npm("ci", "--no-audit", "--no-fund")
            npm("run", "build")
    return BUILT.parent


def install_agui_client() -> Path:
    """frontends/agui-client with its packages installed (``npm ci`` from the lock file when
    they are missing or older than it); one pytest process installs at a time."""
    installed = AGUI_CLIENT / "node_modules" / ".package-lock.json"
    with (AGUI_CLIENT / ".install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        lock_file = AGUI_CLIENT / "package-lock.json"
        if not installed.exists() or installed.stat().st_mtime < lock_file.stat().st_mtime:
            npm("ci", "--no-audit", "--no-fund", folder=AGUI_CLIENT)
    return AGUI_CLIENT

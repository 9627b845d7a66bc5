"""Helpers to run the scripts in this folder as real processes against the test database.

Each script is started with the test run's own interpreter, ``DJANGO_SETTINGS_MODULE`` =
``tests.settings`` and ``AGENTLOOP_TEST_DB_NAME`` = the test database's name, so it opens
the database the test created. Tests using them need ``django_db(transaction=True)``:
another process only sees committed rows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from django.db import connection

REPO_ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
#: what a script prints before its JSON summary line.
SUMMARY_PREFIX = "SUMMARY "


def process_env(**extra: Any) -> dict[str, str]:
    """The environment of a script: the test database, and ``extra`` (None removes a key)."""
    env = dict(os.environ)
    for key in ("AGENTLOOP_TEST_CRASH_IN", "AGENTLOOP_TEST_RUN_LOG"):
        env.pop(key, None)
    env.update(
        DJANGO_SETTINGS_MODULE="tests.settings",
        AGENTLOOP_TEST_DB_NAME=str(connection.settings_dict["NAME"]),
        PYTHONPATH=str(REPO_ROOT),
        PYTHONUNBUFFERED="1",
    )
    for key, value in extra.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = str(value)
    return env


def command(script: str, *args: Any) -> list[str]:
    return [sys.executable, str(HERE / script), *(str(arg) for arg in args)]


def run_script(script: str, *args: Any, env: dict[str, Any] | None = None, timeout: float = 60):
    """Run a script to its end; returns the ``CompletedProcess`` (output as text)."""
    return subprocess.run(  # noqa: S603 - our own interpreter and script
        command(script, *args),
        env=process_env(**(env or {})),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def start_script(script: str, *args: Any, env: dict[str, Any] | None = None) -> subprocess.Popen:
    """Start a script; read its stdout line by line (it prints progress as it goes)."""
    return subprocess.Popen(  # noqa: S603 - our own interpreter and script
        command(script, *args),
        env=process_env(**(env or {})),
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def summary(output: str) -> dict[str, Any]:
    """The JSON summary a script printed last."""
    for line in reversed(output.splitlines()):
        if line.startswith(SUMMARY_PREFIX):
            return json.loads(line[len(SUMMARY_PREFIX) :])
    raise AssertionError(f"no summary line in the output:\n{output}")

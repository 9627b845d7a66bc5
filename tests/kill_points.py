"""Named points of a transactional tool's run where a process stops, so a test can SIGKILL it
there (tests/test_transactional_tools.py, tests/test_transactional_tools_celery.py).

A test arms a point for one chat with :func:`arm`: a file ``<chat pk>.<point>`` in the folder
``$AGENTLOOP_TEST_KILL_POINTS`` names. The process that reaches the point renames the file to
``<chat pk>.<point>.reached`` (so it stops there once: the process that takes the chat over
goes on) and holds there until it is killed, or until the test creates
``<chat pk>.<point>.go`` (:func:`release`), or for :data:`HOLD_LIMIT` seconds at most, so no
process outlives a failed test.

The points, in the order a run passes them:

``before_body``
    the call is marked running and its transaction is open; the tool has written nothing;
``mid_body``
    the tool has written its row (uncommitted);
``before_commit``
    the call's result row and its final state are written too (the lease checked and its row
    locked), the transaction not yet committed;
``after_commit``
    all of it committed, before the step's next move.

The first two are the tool's own (``tests.transactional_tools.ledger``); :func:`install`
(run by the processes a test starts: tests/celery_app.py, tests/processes/drive_chat.py,
when the variable is set) adds the other two to agentloop's code of that process.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

ENV = "AGENTLOOP_TEST_KILL_POINTS"
POINTS = ("before_body", "mid_body", "before_commit", "after_commit")
#: the longest a process holds at a point (seconds).
HOLD_LIMIT = 120.0

__all__ = ["ENV", "HOLD_LIMIT", "POINTS", "arm", "install", "reached", "release", "stop_here"]


def arm(folder: Path, chat_pk: Any, point: str) -> None:
    """Make the next process that reaches ``point`` in chat ``chat_pk``'s run stop there."""
    if point not in POINTS:
        raise ValueError(f"unknown kill point {point!r}; the points are {', '.join(POINTS)}")
    (folder / f"{chat_pk}.{point}").touch()


def reached(folder: Path, chat_pk: Any, point: str) -> bool:
    """Whether a process stopped at ``point`` (it holds there now, or was killed there)."""
    return (folder / f"{chat_pk}.{point}.reached").exists()


def release(folder: Path, chat_pk: Any, point: str) -> None:
    """Let the process holding at ``point`` go on."""
    (folder / f"{chat_pk}.{point}.go").touch()


def stop_here(point: str, chat_pk: Any) -> None:
    """Hold here if a test armed ``point`` for this chat (see the module docstring)."""
    folder = os.environ.get(ENV)
    if not folder:
        return
    armed = Path(folder) / f"{chat_pk}.{point}"
    try:
        # A rename is atomic: of two processes reaching the point, one stops.
        armed.rename(armed.with_name(armed.name + ".reached"))
    except FileNotFoundError:
        return
    go = armed.with_name(armed.name + ".go")
    deadline = time.monotonic() + HOLD_LIMIT
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def install() -> None:
    """Add the points ``before_commit`` and ``after_commit`` to agentloop's code in this
    process (a worker or a driver a test starts)."""
    # Function-local: this runs in a started process, after Django's setup.
    from django.db import connections

    from agentloop import signals
    from agentloop.django_store.tool_calls import ToolCalls

    original = ToolCalls.save_tool_result

    def save_tool_result(self: ToolCalls, *args: Any, **kwargs: Any) -> Any:
        record = original(self, *args, **kwargs)
        if connections[self.row.db].in_atomic_block:  # a transactional tool's, not committed
            stop_here("before_commit", self.chat.pk)
        return record

    ToolCalls.save_tool_result = save_tool_result  # type: ignore[method-assign]

    def after_commit(*, chat: Any, **kwargs: Any) -> None:
        stop_here("after_commit", chat.pk)

    signals.tool_call_finished.connect(after_commit, weak=False)

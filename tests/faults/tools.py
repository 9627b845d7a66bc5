"""Tools of the fault suite: each run is logged as ``<chat pk> <call id> <pid> <name>``.

Persisted chats store tools by import path, so every worker process (whatever its network
namespace or clock) imports these. The log is ``$AGENTLOOP_TEST_RUN_LOG`` (one file per
test, fsync'd per line), which the invariants checker reads: a non-idempotent tool must
appear at most once per call.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from agentloop import Tool

#: how long a held tool waits for its flag at most, so no worker outlives a failed test.
HOLD_LIMIT = 120.0


def _log_run(tool: Tool) -> None:
    path = os.environ.get("AGENTLOOP_TEST_RUN_LOG")
    if not path:
        return
    line = f"{tool.context.chat.pk} {tool.tool_call.id} {os.getpid()} {tool.name}\n"
    with Path(path).open("a") as handle:
        handle.write(line)
        handle.flush()
        os.fsync(handle.fileno())


def _hold() -> None:
    """Wait while ``$AGENTLOOP_TEST_FLAG`` names a file that doesn't exist yet."""
    flag = os.environ.get("AGENTLOOP_TEST_FLAG")
    deadline = time.monotonic() + HOLD_LIMIT
    while flag and not Path(flag).exists() and time.monotonic() < deadline:
        time.sleep(0.02)


class Lookup(Tool):
    """An idempotent read: safe to run again after a fault."""

    name = "lookup"

    def execute(self) -> str:
        _log_run(self)
        return "looked up"


class Charge(Tool):
    """A charge: not safe to repeat, so a run cut by a fault is never run again."""

    name = "charge"
    idempotent = False

    def execute(self) -> str:
        _log_run(self)
        return "charged"


class SlowCharge(Tool):
    """A charge that holds until ``$AGENTLOOP_TEST_FLAG`` exists (a fault lands mid-tool)."""

    name = "slow_charge"
    idempotent = False

    def execute(self) -> str:
        _log_run(self)
        _hold()
        return "charged slowly"


class Nap(Tool):
    """Sleeps ``$AGENTLOOP_TEST_NAP`` seconds (default 1): a step long enough to break."""

    name = "nap"

    def execute(self) -> str:
        _log_run(self)
        time.sleep(float(os.environ.get("AGENTLOOP_TEST_NAP", "1")))
        return "napped"


#: tools whose runs the invariants count (a name not listed here is idempotent).
NOT_IDEMPOTENT = {Charge.name, SlowCharge.name}

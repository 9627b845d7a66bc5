"""Faults on the test's own database while workers run steps (issue 21; DESIGN §19).

Only the test database is touched: its backends are terminated (``pg_terminate_backend``,
as a server restart or a pooler dropping connections would), or it refuses connections for
a few seconds (``ALTER DATABASE ... ALLOW_CONNECTIONS false``, set back in a ``finally``).
The machine's PostgreSQL is never restarted.
"""

from __future__ import annotations

import time

import pytest

from tests.faults import invariants
from tests.faults.parts import record_recovery, refuse_connections, terminate_backends

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.subprocess,
    pytest.mark.timeout(300),
]

LEASE = 3  # seconds: a step cut by the fault is taken over quickly
SWEEP_EVERY = 2.0
REFUSED_FOR = 3.0  # seconds the database refuses connections
#: how long the chats may take to complete after the fault (generous: seconds are expected).
RECOVERY_DEADLINE = 45.0


def mid_step(faults, chats) -> None:
    """Wait until every chat is past its first step (the next ones run the slow tool)."""
    faults.wait(lambda: all(c.tool_calls.exists() for c in chats), "every chat's first step")


def test_terminated_backends_mid_step_lose_nothing(faults, user):
    faults.workers.start("w1", LEASE_SECONDS=LEASE)
    chats = [faults.send(user, f"tools:nap|charge|lookup chat-{i}") for i in range(3)]
    mid_step(faults, chats)
    faults.sweep_every = SWEEP_EVERY

    for _ in range(3):
        terminate_backends()
        time.sleep(0.5)  # the fault repeats while steps run
    faulted = time.monotonic()

    faults.wait(
        faults.all_settled,
        "every chat to complete after its connections dropped",
        timeout=RECOVERY_DEADLINE,
    )
    record_recovery("database backends terminated", time.monotonic() - faulted)
    faults.check()


def test_a_database_refusing_connections_for_seconds_loses_nothing(faults, user):
    faults.workers.start("w1", LEASE_SECONDS=LEASE)
    chats = [faults.send(user, f"tools:nap|charge|lookup chat-{i}") for i in range(3)]
    mid_step(faults, chats)

    with refuse_connections():
        time.sleep(REFUSED_FOR)  # the outage itself
    back = time.monotonic()
    faults.sweep_every = SWEEP_EVERY

    faults.wait(
        faults.all_settled,
        "every chat to complete after connections came back",
        timeout=RECOVERY_DEADLINE,
    )
    record_recovery("database refused connections", time.monotonic() - back)
    faults.check()


def test_a_tool_result_computed_during_an_outage_longer_than_the_lease_is_written_not_rerun(
    faults, user
):
    """Issue 41, defect 13: the database refuses connections while a tool (idempotent, the
    default) runs, and for longer than the lease: its result can't be written before the
    lease runs out. It is written once the database is back (no other process could take
    the chat meanwhile), and the tool is not run a second time for it."""
    outage = 6.0  # seconds: longer than the lease, so it runs out during the outage
    faults.workers.start("w1", LEASE_SECONDS=5)
    chat = faults.send(user, "tools:nap")
    faults.wait(lambda: nap_runs(faults) == 1, "the tool to start")

    with refuse_connections():
        time.sleep(outage)  # the tool (1 s) ends during the outage
    back = time.monotonic()
    faults.sweep_every = SWEEP_EVERY

    faults.wait(faults.all_settled, "the chat to complete", timeout=RECOVERY_DEADLINE)
    record_recovery("database refused connections past the lease", time.monotonic() - back)
    assert nap_runs(faults) == 1, faults.report()
    assert chat.tool_calls.get().result.content == "napped"
    faults.check()


def nap_runs(faults) -> int:
    return sum(1 for *_, name in invariants.runs(faults.workers.run_log) if name == "nap")

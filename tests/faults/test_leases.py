"""Leases under a skewed clock and a dead in-process holder (issue 21, defects 2 and 7).

* Defect 2: lease expiry is judged by each process's own clock; a worker whose clock runs
  120 s ahead (here: time-machine in the worker) takes a live lease, and the step in flight
  is done twice. Every lease decision must use the database's clock.
* Defect 7: a process that dies holding an in-process claim (``chat.complete()`` in a
  script, killed with SIGKILL) locks the chat for ``LEASE_SECONDS``; a new process on the
  same host that calls ``complete()`` gets ``ChatBusyError``. A lease records its holder
  (host, pid, start time): a dead holder on the same host is taken over at once.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from agentloop.models import Chat
from tests.faults import invariants
from tests.faults.conftest import TOOLS
from tests.faults.parts import record_recovery, wait_for
from tests.processes import start_script

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.subprocess,
    pytest.mark.timeout(240),
]

SKEW = 120.0  # seconds the skewed worker's clock runs ahead


def test_a_worker_with_a_clock_120_s_ahead_never_takes_a_live_lease(faults, user):
    from agentloop.tasks import step_chat

    flag = faults.tmp / "flag"
    honest = faults.workers.start("honest", flag=flag, LEASE_SECONDS=10)
    chat = faults.send(user, "tools:slow_charge|lookup")
    faults.wait(lambda: "slow_charge" in invariants_runs(faults), "the honest worker's tool")
    skewed = faults.workers.start("skewed", flag=flag, clock_offset=SKEW, LEASE_SECONDS=10)

    step_chat.delay(chat.pk)  # a second job (a redelivery, the sweeper) while it is held
    faults.wait(lambda: skewed.outcomes(), "the skewed worker's job to end")
    flag.touch()  # the honest worker's tool may finish now
    faults.wait(faults.all_settled, "the chat to complete")

    assert skewed.outcomes()[0] == "busy", faults.report()
    assert "lost" not in honest.outcomes()
    charge = chat.tool_calls.get(name="slow_charge")
    assert charge.result.content == "charged slowly"  # the honest run's own result
    faults.check()


def invariants_runs(faults) -> list[str]:
    return [name for *_, name in invariants.runs(faults.workers.run_log)]


def test_a_new_process_carries_on_at_once_after_an_in_process_holder_died(
    postgresql, user, tmp_path, monkeypatch
):
    from agentloop.exceptions import ChatBusyError

    run_log = tmp_path / "runs.log"
    monkeypatch.setenv("AGENTLOOP_TEST_RUN_LOG", str(run_log))
    chat = Chat.objects.create(model="rules:test", owner=user)
    chat.with_tools(*TOOLS)
    chat.ask_later("tools:slow_charge|lookup")
    holder = start_script(
        "drive_chat.py",
        chat.pk,
        '{"verb": "complete"}',
        env={"AGENTLOOP_TEST_RUN_LOG": run_log, "AGENTLOOP_TEST_FLAG": tmp_path / "never"},
    )
    try:
        wait_for(lambda: run_log.exists() and "slow_charge" in run_log.read_text(), "the tool")
        os.kill(holder.pid, signal.SIGKILL)  # dies holding the chat (LEASE_SECONDS: 30)
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.communicate(timeout=30)  # reaps it and closes its pipes

    died = time.monotonic()
    try:
        Chat.objects.get(pk=chat.pk).complete()  # a new process on the same host carries on
    except ChatBusyError as exc:
        raise AssertionError(f"the dead holder still locks the chat: {exc}") from exc
    record_recovery("in-process holder killed (same host)", time.monotonic() - died)

    invariants.assert_invariants([invariants.Sent(chat.pk, "tools:slow_charge|lookup")], run_log)
    charge = chat.tool_calls.get(name="slow_charge")
    assert charge.result.is_error  # cut mid-run and not idempotent: never run again

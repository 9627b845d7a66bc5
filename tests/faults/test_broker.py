"""The broker goes away and comes back (issue 21, defect 5): chats in flight finish alone.

The private Redis is the Celery broker and ``REDIS_URL``; it runs without persistence, so a
restart loses every job it held, the ones a worker had taken but not acknowledged too.
"""

from __future__ import annotations

import time

import pytest

from agentloop.models import Chat
from tests.faults import invariants
from tests.faults.parts import record_recovery

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.subprocess,
    pytest.mark.timeout(300),
]

#: how long the broker stays down (the issue's report: 3 s).
OUTAGE = 3.0
#: how often the sweeper runs (the issue's report: every 2 s).
SWEEP_EVERY = 2.0


def first_step_done(chat: Chat) -> bool:
    return chat.tool_calls.exists()


def test_after_a_broker_restart_the_chats_in_flight_complete_without_a_person(faults, user):
    faults.workers.start("w1")
    chats = [faults.send(user, f"tools:lookup|charge|lookup chat-{i}") for i in range(4)]
    faults.wait(lambda: all(first_step_done(c) for c in chats), "every chat's first step")

    faults.redis.kill()
    assert not faults.all_settled()  # the chats are in flight when the broker goes
    time.sleep(OUTAGE)  # the outage itself, not a wait for something to happen
    faults.redis.start()
    back = time.monotonic()
    faults.sweep_every = SWEEP_EVERY

    faults.wait(faults.all_settled, "every chat to complete after the broker came back")
    record_recovery("broker restart", time.monotonic() - back)
    faults.check()


def test_a_worker_reconnecting_to_a_restarted_broker_resends_the_jobs_it_lost(faults, user):
    """No sweeper at all: the jobs the broker lost are sent again by the worker itself when
    its connection comes back (the chats were queued before the connection was lost)."""
    worker = faults.workers.start("w1")
    chats = [faults.send(user, f"tools:lookup|charge chat-{i}") for i in range(3)]
    faults.wait(lambda: all(first_step_done(c) for c in chats), "every chat's first step")

    faults.redis.kill()
    assert not faults.all_settled()  # the chats are in flight when the broker goes
    time.sleep(OUTAGE)
    faults.redis.start()
    back = time.monotonic()

    faults.wait(faults.all_settled, "every chat to complete with no sweeper")
    record_recovery("broker restart, no sweeper", time.monotonic() - back)
    assert "re-sent the jobs of" in worker.output()
    faults.check()


def test_a_job_sent_while_the_broker_is_down_is_sent_by_the_next_sweep(faults, user):
    """complete_later() with the broker down doesn't fail the caller: the chat is queued and
    marked stalled at once, so the sweeper's next run sends it (not STALE_QUEUED_SECONDS
    later)."""
    from agentloop.runners.sweeper import stalled_chats

    faults.redis.kill()
    chat = faults.send(user, "tools:charge")  # the broker refuses the job: nothing raised

    chat.refresh_from_db()
    assert chat.state == "queued"
    assert list(stalled_chats().values_list("pk", flat=True)) == [chat.pk]
    faults.redis.start()
    faults.workers.start("w1")
    faults.sweep()

    faults.wait(faults.all_settled, "the chat to complete after one sweep")
    faults.check()


#: how long the broker stays down in the supervised scenario (issue 41's report: 4 s).
LONGER_OUTAGE = 4.0
#: how soon after the broker is back the chat must complete: a few sweeper periods and a
#: worker's restart, far below STALE_QUEUED_SECONDS (300 s), the wait of a job lost unseen.
SOON = 30.0


def test_a_job_lost_while_the_broker_is_down_is_sent_by_a_sweep_whatever_the_worker_did(
    faults, user
):
    """Issue 41, defect 12 (the documented setup): the broker is killed while a 1 s tool runs
    and is back 4 s later; a supervisor restarts the worker whenever it exits; the sweeper
    runs every 2 s. The step ends during the outage, so its next job can't be sent; then the
    worker dies (its consumer shut down on an acknowledgement it couldn't make, in the
    report: here it is killed), and the worker started afresh doesn't re-send what a
    reconnecting one would. The chat goes on within a few sweeps."""
    supervised = [faults.workers.start("w1")]

    def restart_if_exited() -> None:
        worker = supervised[-1]
        if worker.process.poll() is not None:
            supervised.append(faults.workers.start(f"w{len(supervised) + 1}", wait=False))

    faults.send(user, "tools:nap")
    faults.wait(lambda: "nap" in ran(faults), "the tool to start")

    faults.redis.kill()
    time.sleep(LONGER_OUTAGE)  # the outage itself; the step ends in it
    supervised[-1].kill()  # it dies before the broker is back; the supervisor restarts it
    faults.redis.start()
    back = time.monotonic()
    faults.sweep_every = SWEEP_EVERY

    def settled() -> bool:
        restart_if_exited()
        return faults.all_settled()

    faults.wait(settled, "the chat to complete soon after the broker came back", timeout=SOON)
    record_recovery("broker restart mid-tool, worker restarted", time.monotonic() - back)
    faults.check()


def ran(faults) -> list[str]:
    return [name for *_, name in invariants.runs(faults.workers.run_log)]


def test_jobs_a_restarted_broker_lost_are_sent_by_the_next_sweep_though_no_worker_saw_it(
    faults, user
):
    """Issue 41, defect 12: chats queued with their jobs in the broker, and no worker that
    saw the broker go (none ran, or the one that did died with it): a worker started afresh
    re-sends nothing. The sweeper sees that the broker lost its data and sends the queued
    chats' jobs again at its next run, not STALE_QUEUED_SECONDS (300 s) later."""
    faults.sweep()  # the sweeper's run before the restart
    chats = [faults.send(user, f"tools:lookup chat-{i}") for i in range(3)]

    faults.redis.kill()  # every job goes with it; no worker is connected to see it
    faults.redis.start()
    faults.workers.start("w1")  # a fresh worker: its first connection, nothing to re-send
    back = time.monotonic()
    faults.sweep_every = SWEEP_EVERY

    faults.wait(faults.all_settled, "the chats to complete after a sweep", timeout=SOON)
    record_recovery("broker restart, no worker connected", time.monotonic() - back)
    assert all(chat.tool_calls.count() == 1 for chat in chats)
    faults.check()

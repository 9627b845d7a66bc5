"""One clock and known holders: every lease decision is the database's, and a lease whose
holder is gone on this host is taken at once (DESIGN §19)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
import time_machine
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.utils import timezone

from agentloop.django_store import leases as _leases
from agentloop.django_store.leases import (
    Lease,
    LeaseStatements,
    beat,
    claim_row,
    holder_alive,
    holder_id,
)
from agentloop.models import Chat, ChatState, ToolCall
from agentloop.runners import run_step
from agentloop.testing import tool_call
from tests.helpers import wait_until
from tests.processes import start_script
from tests.tools import slow, transfer, wait_for_flag

pytestmark = pytest.mark.django_db(transaction=True)

postgres_only = pytest.mark.skipif(
    os.environ.get("DATABASE_URL", "").split(":")[0] not in ("postgres", "postgresql"),
    reason="SQLite is one file on one host: its processes share that host's clock",
)
LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")


def hold(chat, holder, seconds=60):
    """The chat held by ``holder`` as another process would leave it."""
    Chat.objects.filter(pk=chat.pk).update(
        lease_token="theirs",
        lease_holder=holder,
        lease_expires_at=timezone.now() + timedelta(seconds=seconds),
        state=ChatState.RUNNING,
    )


def started(pid):
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


@pytest.fixture
def chat(user):
    return Chat.objects.create(model="scripted:test", owner=user)


@pytest.fixture
def sleeper():
    """A live process on this host, killed (and reaped) at the end."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # noqa: S603
    yield process
    process.kill()
    process.wait()


# -- one clock ------------------------------------------------------------------------------
@postgres_only
def test_a_process_whose_clock_is_two_minutes_ahead_cannot_take_a_live_lease(chat):
    held = Lease.take(Chat, chat.pk, seconds=10)
    assert held is not None

    with time_machine.travel(timezone.now() + timedelta(seconds=120), tick=True):
        # By this process's clock the lease ran out long ago; by the database's it holds.
        assert Lease.take(Chat, chat.pk, seconds=10) is None

    assert Chat.objects.get(pk=chat.pk).lease_token == held.token


@postgres_only
def test_a_renewal_by_a_process_whose_clock_is_behind_still_holds_the_lease(chat):
    held = Lease.take(Chat, chat.pk, seconds=10)
    assert held is not None
    with time_machine.travel(timezone.now() - timedelta(seconds=120), tick=True):
        assert held.renew()
        beat(held)

    expires = Chat.objects.get(pk=chat.pk).lease_expires_at
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        database_now = cursor.fetchone()[0]
    # Set by the database's clock: about ten seconds ahead of it, not two minutes behind.
    assert timedelta(seconds=5) < expires - database_now <= timedelta(seconds=10)
    assert not held.lost.is_set()


@pytest.mark.subprocess
@pytest.mark.skipif(
    not LIBFAKETIME.exists() and os.environ.get("CI") != "true",
    reason="libfaketime is not installed (apt-get install libfaketime)",
)
def test_an_approval_by_a_person_whose_clock_is_behind_is_not_stranded(
    chat, monkeypatch, tmp_path, scripted
):
    """A decision made while a step runs wakes the chat when the step releases it as
    waiting, whatever the approver's clock said (it compared the approver's clock with the
    worker's: two minutes behind, the chat waited forever)."""
    flag = tmp_path / "flag"
    monkeypatch.setenv("AGENTLOOP_TEST_FLAG", str(flag))
    monkeypatch.setenv("AGENTLOOP_TEST_RUN_LOG", str(tmp_path / "runs.log"))
    chat.with_tools(transfer, wait_for_flag)
    scripted.add(
        [tool_call("transfer", {"amount": 5, "to": "bob"}, id="t1"), tool_call("wait_for_flag")]
    )
    chat.ask_later("pay bob")
    Chat.objects.filter(pk=chat.pk).update(state="queued")  # as complete_later() leaves it
    assert run_step(chat.pk).action == "again"  # the model asked for the two tools
    outcomes = []

    def step():
        try:
            outcomes.append(run_step(chat.pk))
        finally:
            connections.close_all()  # this thread's own connection

    scripted_step = threading.Thread(target=step)
    scripted_step.start()
    try:
        wait_until(
            lambda: (
                ToolCall.objects.filter(chat=chat, call_id="t1", state="waiting").exists()
                or outcomes
            ),
            "the transfer to wait for approval",
        )
        assert not outcomes, outcomes
        approve = ToolCall.objects.get(chat=chat, call_id="t1").pk
        go = tmp_path / "go"
        go.touch()
        approver = start_script(
            "decide.py",
            chat.pk,
            approve,
            "approve",
            go,
            env={
                "LD_PRELOAD": LIBFAKETIME,
                "FAKETIME": "-120s",
                "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            },
        )
        out, err = approver.communicate(timeout=60)
        assert '"outcome": "ok"' in out, err
    finally:
        flag.touch()
        scripted_step.join(timeout=60)

    chat.refresh_from_db()
    assert chat.state == ChatState.QUEUED  # the approval's step comes next


# -- holders --------------------------------------------------------------------------------
def test_a_lease_records_this_process_as_its_holder(chat):
    lease = Lease.take(Chat, chat.pk)
    assert lease is not None

    stored = Chat.objects.get(pk=chat.pk).lease_holder
    assert stored == holder_id()
    assert stored.rsplit(":", 2)[1] == str(os.getpid())
    assert holder_alive(stored) is True


def test_a_live_holder_on_this_host_keeps_the_chat(chat, sleeper):
    host = holder_id().rsplit(":", 2)[0]
    hold(chat, f"{host}:{sleeper.pid}:{started(sleeper.pid)}")

    assert claim_row(Chat, chat.pk) is None


def test_a_dead_holder_on_this_host_is_taken_over_at_once(chat, sleeper):
    host = holder_id().rsplit(":", 2)[0]
    hold(chat, f"{host}:{sleeper.pid}:{started(sleeper.pid)}", seconds=600)
    sleeper.send_signal(signal.SIGKILL)
    sleeper.wait()

    claimed = claim_row(Chat, chat.pk)

    assert claimed is not None
    assert Chat.objects.get(pk=chat.pk).lease_token == claimed[0].token


def test_a_zombie_holder_is_gone_too(chat, sleeper):
    host = holder_id().rsplit(":", 2)[0]
    hold(chat, f"{host}:{sleeper.pid}:{started(sleeper.pid)}", seconds=600)
    sleeper.send_signal(signal.SIGKILL)
    wait_until(lambda: Path(f"/proc/{sleeper.pid}/stat").read_text().split(") ")[1][0] == "Z", "Z")

    assert claim_row(Chat, chat.pk) is not None


def test_a_pid_that_names_another_process_now_is_a_dead_holder(chat, sleeper):
    host = holder_id().rsplit(":", 2)[0]
    hold(chat, f"{host}:{sleeper.pid}:{int(started(sleeper.pid)) - 1}")  # started earlier

    assert claim_row(Chat, chat.pk) is not None


def test_a_holder_on_another_host_is_waited_for_until_its_lease_expires(chat):
    hold(chat, "elsewhere/0badf00d:1:1", seconds=60)
    assert claim_row(Chat, chat.pk) is None

    Chat.objects.filter(pk=chat.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert claim_row(Chat, chat.pk) is not None


def test_a_lease_this_process_left_behind_is_taken_again_but_a_held_one_is_not(chat):
    held = Lease.take(Chat, chat.pk)
    assert held is not None
    assert claim_row(Chat, chat.pk) is None  # a lease here still holds it: busy

    held.forget()  # an error made this process let go without releasing it in the database
    claimed = claim_row(Chat, chat.pk)

    assert claimed is not None
    assert claimed[0].token != held.token


def test_only_one_of_two_takers_of_a_dead_holders_lease_wins(chat, sleeper, monkeypatch):
    """The takeover is conditional on the dead holder's token: a second taker that read the
    same holder finds it changed and gets nothing."""
    host = holder_id().rsplit(":", 2)[0]
    hold(chat, f"{host}:{sleeper.pid}:{started(sleeper.pid)}", seconds=600)
    sleeper.kill()
    sleeper.wait()
    first = claim_row(Chat, chat.pk)
    assert first is not None
    # The second taker still believes the dead holder holds it.
    monkeypatch.setattr(LeaseStatements, "holder", lambda self, using, pk: ("theirs", "x"))
    monkeypatch.setattr(_leases, "_gone", lambda token, holder: True)

    assert claim_row(Chat, chat.pk) is None
    assert Chat.objects.get(pk=chat.pk).lease_token == first[0].token


# -- a verb inside a caller's transaction -----------------------------------------------------
def test_a_verb_inside_a_transaction_outlasting_a_heartbeat_period_keeps_its_claim(
    chat, scripted, settings
):
    """ATOMIC_REQUESTS or a caller's transaction.atomic(): the claim is uncommitted, so the
    heartbeat's own connection can't renew it; its row lock keeps others off instead (the
    heartbeat found no such lease and the verb lost its claim mid-tool)."""
    settings.AGENTLOOP = {**settings.AGENTLOOP, "LEASE_SECONDS": 1}  # a beat every 0.33 s
    chat.with_tools(slow)
    scripted.add(tool_call("slow", {"seconds": 1.0}), "rested")

    with transaction.atomic():
        answer = chat.ask("take your time")

    assert answer.content == "rested"
    chat.refresh_from_db()
    assert (chat.state, chat.lease_token) == (ChatState.IDLE, "")


# -- by hand --------------------------------------------------------------------------------
def test_unlock_frees_a_chat_held_on_another_host_and_sends_it_on(chat, scripted):
    scripted.add("back on track")
    chat.ask_later("hello")
    hold(chat, "elsewhere/0badf00d:1:1", seconds=600)
    out, err = StringIO(), StringIO()

    call_command("agentloop", "unlock", str(chat.pk), "--yes", stdout=out, stderr=err)

    assert "held by elsewhere/0badf00d:1:1" in err.getvalue()
    assert "a tool it is running finishes" in err.getvalue()
    assert f"Unlocked chat {chat.pk}" in out.getvalue()
    chat.refresh_from_db()
    assert (chat.state, chat.lease_token) == (ChatState.IDLE, "")
    assert chat.messages.last().content == "back on track"  # its next step ran


def test_unlock_without_a_lease_changes_nothing(chat):
    out = StringIO()
    call_command("agentloop", "unlock", str(chat.pk), "--yes", stdout=out, stderr=StringIO())
    assert "holds no lease; nothing to do" in out.getvalue()


def test_a_claim_the_database_lost_sends_the_step_again_at_once(
    chat, scripted, monkeypatch, tmp_path
):
    """A claim commits without waiting for the disk; a database crash can lose it. The job
    then finds its lease gone with nobody holding the chat: it sends the step again at once
    (it logged "taken over" and left the chat to the sweeper, STALE_QUEUED_SECONDS later)."""
    flag = tmp_path / "flag"
    monkeypatch.setenv("AGENTLOOP_TEST_FLAG", str(flag))
    monkeypatch.setenv("AGENTLOOP_TEST_RUN_LOG", str(tmp_path / "runs.log"))
    chat.with_tools(wait_for_flag)
    scripted.add(tool_call("wait_for_flag", id="w1"))
    chat.ask_later("wait")
    Chat.objects.filter(pk=chat.pk).update(state="queued")  # as complete_later() leaves it
    assert run_step(chat.pk).action == "again"
    outcomes = []

    def step():
        try:
            outcomes.append(run_step(chat.pk))
        finally:
            connections.close_all()

    worker = threading.Thread(target=step)
    worker.start()
    try:
        wait_until(
            lambda: Chat.objects.filter(pk=chat.pk).exclude(lease_token="").exists(), "claim"
        )
        # What the server has after a crash that lost the claim: the row as before it.
        Chat.objects.filter(pk=chat.pk).update(
            lease_token="", lease_expires_at=None, state=ChatState.QUEUED
        )
    finally:
        flag.touch()
        worker.join(timeout=60)

    assert [outcome.action for outcome in outcomes] == ["again"]
    assert not chat.messages.filter(role="tool").exists()  # it wrote nothing

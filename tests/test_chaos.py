"""Chaos: random SIGKILLs of Celery workers and of in-process callers (DESIGN §3, §12).

Twenty chats each run one turn of two tool rounds (``tools:chaos_a,chaos_b|chaos_c``; the
tools log ``<chat pk>:<call id>:<pid>`` and sleep a little, so kills often land mid-tool).
Real ``celery worker`` processes run half of them (``complete_later()``); OS processes calling
``chat.complete()`` (tests/processes/chaos_driver.py) run the other half, and also try some of
the workers' chats, where they find the chat busy, or settled, or take a step between two jobs
(one writer at a time either way). A seeded RNG decides when to kill and whom; every killed
process is replaced at once. Leases are 2 s, so a killed claim expires fast. Then the sweeper
and the callers finish every chat, and the transcripts must be exact: nothing lost, nothing
written twice, and a tool run again only where a kill cut its run.

Set ``AGENTLOOP_CHAOS_SEED`` to replay a schedule; the seed and a one-line tally are printed.
Skipped when Redis doesn't answer, except under ``CI=true`` (as tests/test_celery_worker.py:
the ``background`` fixture of tests/conftest.py).
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

from agentloop.models import Chat, ToolCall, Usage
from agentloop.runners.sweeper import resume_stalled
from tests import workers as celery_workers
from tests.processes import REPO_ROOT, command, process_env, summary
from tests.tools import ChaosA, ChaosB, ChaosC
from tests.worker_provider import logged_requests

CHATS = 20
WORKER_CHATS = 10  # the first ten run on workers, the rest on in-process callers
RULE = "tools:chaos_a,chaos_b|chaos_c"
ONE_TURN = ["user", "assistant", "tool", "tool", "assistant", "tool", "assistant"]
CALL_IDS = ["call_1_0_0", "call_1_0_1", "call_1_1_0"]
LEASE_SECONDS = 2
TOOL_SLEEP = 0.5  # seconds each tool sleeps
SETTLE_DEADLINE = 150.0  # seconds for the whole run before it fails with the logs
SWEEP_EVERY = 1.0  # seconds, as celery beat would (but faster)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]


@dataclass
class Driver:
    """An OS process calling ``chat.complete()`` on some chats (tests/processes/chaos_driver.py)."""

    name: str
    chats: list[int]
    process: subprocess.Popen
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass
class Chaos:
    """The processes under test, what was killed, and the files every process logs to."""

    background: celery_workers.Background
    env: dict[str, Any]
    drivers: list[Driver] = field(default_factory=list)
    kills: list[tuple[str, set[int]]] = field(default_factory=list)
    starting: list[threading.Thread] = field(default_factory=list)
    numbers: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def start_worker(self) -> celery_workers.Worker:
        name = f"worker{next(self.numbers)}"
        return self.background.start_worker(name, **self.env["settings"])

    def start_driver(self, chats: list[int]) -> Driver:
        name = f"caller{next(self.numbers)}"
        log = self.background.tmp / f"{name}.log"
        with log.open("w") as output:
            process = subprocess.Popen(  # noqa: S603 - our own interpreter and script
                command("chaos_driver.py", ",".join(str(pk) for pk in chats)),
                env=process_env(**self.env["process"]),
                cwd=REPO_ROOT,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        driver = Driver(name, chats, process, log)
        self.drivers.append(driver)
        return driver

    def alive(self) -> list[Any]:
        workers = [
            w
            for w in self.background.workers
            if w.process.poll() is None and w.ready is not None and w.ready.exists()
        ]  # a worker still starting is left alone: its starter waits for it
        return workers + [d for d in self.drivers if d.process.poll() is None]

    def kill(self, victim: Any) -> None:
        """SIGKILL a worker (its whole process group) or a caller, and start its replacement."""
        pids = _group(victim.process.pid)
        os.killpg(victim.process.pid, signal.SIGKILL)
        victim.process.wait(timeout=30)
        self.kills.append((victim.name, pids))
        if isinstance(victim, Driver):
            self.start_driver(victim.chats)
        else:
            # A worker takes seconds to start: the kills and sweeps go on meanwhile.
            replacement = threading.Thread(target=self.start_worker, daemon=True)
            replacement.start()
            self.starting.append(replacement)

    def killed_pids(self) -> set[int]:
        return {pid for _, pids in self.kills for pid in pids}

    def logs(self) -> str:
        callers = "\n".join(
            f"--- {d.name} (exit {d.process.poll()}) ---\n{d.output()[-3000:]}"
            for d in self.drivers
        )
        return f"{self.background.logs()}\n{callers}"


def _group(pgid: int) -> set[int]:
    """The pids of a process group (a worker's main process and its pool), read from /proc."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # the process ended meanwhile
            continue
        # The fields after the parenthesised command: state, ppid, pgrp, ...
        if int(stat.rsplit(")", 1)[1].split()[2]) == pgid:
            pids.add(int(entry.name))
    return pids | {pgid}


def _settled(chat_pks: list[int]) -> list[int]:
    """The chats among ``chat_pks`` that are idle, unleased and complete."""
    done = []
    for chat in Chat.objects.filter(pk__in=chat_pks, state="idle", lease_token=""):
        if chat.is_complete():
            done.append(chat.pk)
    return done


def _tally_messages(chat: Chat) -> tuple[list[str], int, int]:
    """The chat's roles, and how many messages are missing from / extra to one exact turn."""
    roles = [m.role for m in chat.messages.order_by("id")]
    expected, actual = Counter(ONE_TURN), Counter(roles)
    return roles, sum((expected - actual).values()), sum((actual - expected).values())


def test_random_kills_of_workers_and_callers_lose_nothing_and_write_nothing_twice(
    background, user, capsys, monkeypatch
):
    seed = int(os.environ.get("AGENTLOOP_CHAOS_SEED") or random.SystemRandom().randrange(10**6))
    rng = random.Random(seed)
    print(f"chaos seed: {seed} (replay with AGENTLOOP_CHAOS_SEED={seed})")
    run_log, provider_log = background.run_log, background.provider_log
    settings = {"LEASE_SECONDS": LEASE_SECONDS}
    chaos = Chaos(
        background,
        {
            "settings": settings,
            "process": {
                "AGENTLOOP_TEST_SETTINGS": f'{{"LEASE_SECONDS": {LEASE_SECONDS}}}',
                "AGENTLOOP_TEST_RUN_LOG": run_log,
                "AGENTLOOP_TEST_PROVIDER_LOG": provider_log,
                "AGENTLOOP_TEST_CHAOS_SLEEP": TOOL_SLEEP,
            },
        },
    )
    monkeypatch.setenv("AGENTLOOP_TEST_CHAOS_SLEEP", str(TOOL_SLEEP))  # workers inherit it

    chats = []
    for index in range(CHATS):
        chat = Chat.objects.create(model="rules:chaos", owner=user)
        chat.with_tools(ChaosA, ChaosB, ChaosC).ask_later(f"{RULE} chat{index}")
        chats.append(chat.pk)
    worker_chats, caller_chats = chats[:WORKER_CHATS], chats[WORKER_CHATS:]
    shared = rng.sample(worker_chats, 4)  # callers try these too while workers run them

    # The test process sweeps; a queued chat is stale after 3 s (not 5 minutes).
    with override_settings(
        AGENTLOOP={
            **background_settings(),
            "LEASE_SECONDS": LEASE_SECONDS,
            "STALE_QUEUED_SECONDS": 3,
        }
    ):
        for _ in range(2):
            chaos.start_worker()
        for pk in worker_chats:
            Chat.objects.get(pk=pk).complete_later()
        chaos.start_driver(caller_chats[:5] + shared[:2])
        chaos.start_driver(caller_chats[5:] + shared[2:])

        planned = rng.randint(8, 15)
        next_kill = time.monotonic() + rng.uniform(0.5, 1.5)
        started = last_sweep = time.monotonic()
        finishers = 0
        while True:
            now = time.monotonic()
            done = _settled(chats)
            if len(done) == CHATS:
                break
            if now - started > SETTLE_DEADLINE:
                raise AssertionError(
                    f"seed {seed}: only {len(done)} of {CHATS} chats settled\n{chaos.logs()}"
                )
            if now - last_sweep >= SWEEP_EVERY:
                resume_stalled()
                last_sweep = now
            if len(chaos.kills) < planned and now >= next_kill:
                victims = sorted(chaos.alive(), key=lambda p: p.name)
                chaos.kill(rng.choice(victims))
                next_kill = time.monotonic() + rng.uniform(0.2, 0.6)
            elif len(chaos.kills) >= planned and finishers == 0:
                # The kills are over: a caller finishes whatever a killed caller left held.
                chaos.start_driver(chats)
                finishers += 1
            time.sleep(0.1)
        elapsed = time.monotonic() - started
        for starter in chaos.starting:
            starter.join(timeout=celery_workers.DEADLINE)

    outcome = _check(chaos, chats, run_log, provider_log, seed)
    with capsys.disabled():
        print(
            f"\nchaos: seed={seed} kills={len(chaos.kills)} "
            f"(workers={outcome['worker_kills']}, callers={outcome['caller_kills']}) "
            f"chats_completed={len(done)}/{CHATS} "
            f"lost_messages={outcome['lost']} duplicated_messages={outcome['duplicated']} "
            f"tool_runs={outcome['runs']} tool_reruns={outcome['reruns']} "
            f"cut_model_calls={outcome['cut_model_calls']} busy={outcome['busy']} "
            f"elapsed={elapsed:.1f}s"
        )
    assert len(chaos.kills) == planned, "the chats were done before the planned kills"


def background_settings() -> dict[str, Any]:
    """The AGENTLOOP settings the ``background`` fixture put in place."""
    from django.conf import settings

    return dict(settings.AGENTLOOP)


def _check(
    chaos: Chaos, chats: list[int], run_log: Path, provider_log: Path, seed: int
) -> dict[str, Any]:
    """Assert the end state is exact; returns the tally."""
    context = f"seed {seed}\n{chaos.logs()}"
    lost = duplicated = 0
    for pk in chats:
        chat = Chat.objects.get(pk=pk)
        roles, missing, extra = _tally_messages(chat)
        lost, duplicated = lost + missing, duplicated + extra
        # (Its state may flicker to "running" meanwhile: a late redelivered or swept job
        # takes the chat, finds nothing to do and lets it go.)
        assert chat.is_complete(), f"chat {pk}\n{context}"
        assert roles == ONE_TURN, f"chat {pk}: {roles}\n{context}"
        assert all(m.status == "complete" for m in chat.messages.all()), context
        calls = list(ToolCall.objects.filter(chat=chat).order_by("id"))
        assert [call.call_id for call in calls] == CALL_IDS, context
        for call in calls:
            assert chat.messages.filter(tool_call=call).count() == 1, f"{call}\n{context}"
    assert (lost, duplicated) == (0, 0)

    # A call ran more than once only if a kill cut it: every run but the last was in a
    # process that was killed; a non-idempotent tool never ran twice.
    cut_runs = 0
    by_call: dict[tuple[str, str], list[int]] = {}
    for line in run_log.read_text().split():
        chat_pk, call_id, pid = line.split(":")
        by_call.setdefault((chat_pk, call_id), []).append(int(pid))
    killed = chaos.killed_pids()
    for (chat_pk, call_id), pids in by_call.items():
        assert set(pids[:-1]) <= killed, f"chat {chat_pk} {call_id} ran in {pids}\n{context}"
        if len(pids) > 1:
            cut_runs += len(pids) - 1
            assert call_id != "call_1_0_1", f"chaos_b ran twice: {chat_pk} {pids}\n{context}"
    calls = ToolCall.objects.filter(chat_id__in=chats)
    every_call = {(str(call.chat_id), call.call_id) for call in calls}
    succeeded = {(str(call.chat_id), call.call_id) for call in calls if call.state == "succeeded"}
    assert succeeded <= set(by_call) <= every_call, context
    assert cut_runs <= len(chaos.kills)
    interrupted = ToolCall.objects.filter(chat_id__in=chats, name="chaos_b", state="failed")
    for call in interrupted:
        assert "not idempotent" in call.result.content, context

    # One usage row per answer, none for a call a kill cut; no failed or cancelled attempts.
    usage = Counter(Usage.objects.filter(chat_id__in=chats).values_list("status", flat=True))
    answers = sum(Chat.objects.get(pk=pk).messages.filter(role="assistant").count() for pk in chats)
    assert usage == {"succeeded": answers}
    model_calls = len(logged_requests(provider_log))
    cut_model_calls = model_calls - answers
    assert 0 <= cut_model_calls <= len(chaos.kills)

    worker_kills = sum(1 for name, _ in chaos.kills if name.startswith("worker"))
    busy = 0
    for driver in chaos.drivers:
        if driver.process.poll() is None:
            driver.process.wait(timeout=30)
        if driver.process.returncode == 0:
            result = summary(driver.output())
            assert result["errors"] == [], f"{driver.name}: {result['errors']}"
            busy += result["busy"]
    return {
        "lost": lost,
        "duplicated": duplicated,
        "runs": sum(len(pids) for pids in by_call.values()),
        "reruns": cut_runs,
        "cut_model_calls": cut_model_calls,
        "worker_kills": worker_kills,
        "caller_kills": len(chaos.kills) - worker_kills,
        "busy": busy,
    }


# -- what the chaos run found --------------------------------------------------------------
def test_the_sweeper_resumes_a_queued_chat_whose_in_process_caller_died_holding_it(user):
    from agentloop.django_store.leases import claim_row
    from agentloop.runners.sweeper import stalled_chats

    chat = Chat.objects.create(model="rules:chaos", owner=user)
    chat.ask_later("hello")
    # A worker's step ended with more to do: the chat is queued and its next job enqueued.
    Chat.objects.filter(pk=chat.pk).update(state="queued")
    # An in-process complete() takes the chat before that job (which then finds it busy and
    # ends), and its process is killed: the claim keeps state "queued" and expires unreleased.
    assert claim_row(Chat, chat.pk, state=None) is not None
    expired = timezone.now() - timedelta(seconds=1)
    Chat.objects.filter(pk=chat.pk).update(lease_expires_at=expired)
    with override_settings(AGENTLOOP={**background_settings(), "STALE_QUEUED_SECONDS": 0}):
        assert chat.pk in stalled_chats().values_list("pk", flat=True)


# -- guarantees docs/background.md cites that no other test pinned down --------------------
def test_a_stream_that_fails_for_good_leaves_a_failed_row_not_a_partial_one(user, scripted):
    from agentloop.exceptions import AuthenticationError
    from agentloop.messages import MessageStatus
    from agentloop.testing import stream

    chat = Chat.objects.create(model="scripted:test", owner=user)
    dropped = AuthenticationError("key revoked", status=401)
    scripted.add(stream("Once ", "upon ", "a time", fail_after=2, error=dropped))
    with override_settings(AGENTLOOP={**background_settings(), "PARTIAL_SAVE_INTERVAL": 0}):
        with pytest.raises(AuthenticationError):
            chat.ask("Tell me a story", stream=lambda chunk: None)

    chat.refresh_from_db()
    answer = chat.messages.get(role="assistant")
    assert (answer.status, answer.content) == (MessageStatus.FAILED, "Once upon ")
    assert not chat.messages.filter(status=MessageStatus.PARTIAL).exists()
    assert (chat.state, chat.error) == ("failed", "AuthenticationError: key revoked")


def test_an_approved_tool_runs_once_when_two_processes_step_the_chat_at_once(
    user, scripted, tmp_path
):
    from agentloop.testing import tool_call
    from tests.processes import start_script
    from tests.tools import transfer

    chat = Chat.objects.create(model="scripted:test", owner=user).with_tools(transfer)
    scripted.add(tool_call("transfer", {"amount": 5000, "to": "x"}))
    chat.ask("pay")
    call = ToolCall.objects.get(chat=chat, state="waiting")
    chat.approve(call.pk)
    run_log = tmp_path / "runs.log"
    spec = '{"verb": "step", "replies": [{"text": "sent"}]}'
    steppers = [
        start_script("drive_chat.py", chat.pk, spec, env={"AGENTLOOP_TEST_RUN_LOG": run_log})
        for _ in range(2)
    ]
    outputs = [stepper.communicate(timeout=60) for stepper in steppers]

    # Each process made a step or found the chat busy; the tool ran once, answered once.
    for stepper, (_out, err) in zip(steppers, outputs, strict=True):
        assert stepper.returncode == 0 or "ChatBusyError" in err, err
    assert run_log.read_text().split() == ["transfer"]
    call.refresh_from_db()
    assert (call.decision, call.state) == ("approved", "succeeded")
    assert [m.content for m in chat.messages.filter(tool_call=call)] == ["sent 5000 to x"]


def test_a_failed_job_logs_the_traceback_and_shows_users_one_line(user, scripted, caplog):
    from agentloop.exceptions import AuthenticationError
    from agentloop.runners import run_step

    chat = Chat.objects.create(model="scripted:test", owner=user)
    chat.ask_later("Hi")
    Chat.objects.filter(pk=chat.pk).update(state="queued")  # as complete_later() leaves it
    scripted.add(AuthenticationError("key revoked\nsecond line", status=401))

    with caplog.at_level("ERROR", logger="agentloop"):
        outcome = run_step(chat.pk)

    chat.refresh_from_db()
    assert (outcome.action, chat.state) == ("failed", "failed")
    assert chat.error == "AuthenticationError: key revoked"
    assert "Traceback" in chat.error_detail
    (record,) = [r for r in caplog.records if r.name == "agentloop" and r.exc_info]
    assert record.getMessage() == f"Chat {chat.pk}: AuthenticationError: key revoked"


def test_the_admin_shows_a_failed_chats_error_and_its_traceback_collapsed(admin_client, user):
    from django.urls import reverse
    from django.utils.html import escape

    chat = Chat.objects.create(model="nosuchprovider:model", owner=user)
    with pytest.raises(Exception, match="nosuchprovider"):
        chat.ask("Hi")
    chat.refresh_from_db()

    page = admin_client.get(reverse("admin:agentloop_chat_change", args=[chat.pk]))

    assert page.status_code == 200
    html = page.content.decode()
    assert escape(chat.error) in html
    assert "Traceback (most recent call last)" in html

"""Transactional tools on real ``celery worker`` processes (docs/transactional-tools.md):
SIGKILL at every point of the tool's run, and a worker whose lease is taken over mid-tool.

Each chat calls ``ledger`` (tests/transactional_tools.py), which writes a ``Note`` named by
its call in the step's transaction. A test arms a kill point for a chat
(tests/kill_points.py): the worker's process running it stops there and the test kills the
whole worker with SIGKILL. The invariant, read in one statement at every poll while the
chats are rescued: a call's Note exists if and only if its result row exists. After the
rescue each call has exactly one Note, its result, and a transcript that reads as if nothing
had happened; the tool ran again only where the kill came before the commit.

On PostgreSQL the campaign kills a worker of four processes with a chat stopped at each of
the four points, ten times (40 kills); on SQLite, whose one write lock a stopped transaction
holds, one chat at a time, twice per point. Skipped when Redis doesn't answer, except under
``CI=true`` (the ``background`` fixture of tests/conftest.py).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
from django.db import connection

from agentloop.messages import ToolCallState
from agentloop.models import Chat
from agentloop.runners.sweeper import free_chat, resume_stalled
from example_project.models import Note
from tests.helpers import transcript
from tests.kill_points import POINTS, arm, reached, release
from tests.transactional_tools import ledger, ledger_rows, notes_of
from tests.workers import Background, Worker, new_chat, settled

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]

LEASE_SECONDS = 2
CALL = "call_1_0_0"
#: how often the tool runs for a chat killed at each point: again unless the kill came after
#: the commit; never counted at ``before_body``, where the killed run hadn't logged yet.
RUNS = {"before_body": 1, "mid_body": 2, "before_commit": 2, "after_commit": 1}


def assert_all_or_nothing(chat_pks: list[Any]) -> None:
    """Every call's Note exists if and only if its result does (one snapshot)."""
    broken = [row for row in ledger_rows(*chat_pks) if row[2] != row[3]]
    assert broken == [], f"(chat, call, has its Note, has its result): {broken}"


def ledger_runs(background: Background, chat: Chat) -> int:
    return background.runs().count(f"ledger:{chat.pk}:{CALL}")


def assert_booked_once(chat: Chat) -> None:
    assert ledger_rows(chat.pk) == [(chat.pk, CALL, True, True)]
    assert notes_of(chat) == [CALL]
    assert transcript(chat, "role", "content") == [
        ("user", transcript(chat)[0][1]),
        ("assistant", ""),
        ("tool", f"booked {CALL}"),
        ("assistant", f"done: booked {CALL}"),
    ]


def rescue(background: Background, chats: list[Chat], every: list[Any]) -> None:
    """Wait for ``chats`` to settle, sweeping every second as celery beat would, checking the
    invariant over ``every`` chat so far at each poll."""
    last_sweep = 0.0

    def done() -> bool:
        nonlocal last_sweep
        assert_all_or_nothing(every)
        if time.monotonic() - last_sweep >= 1:
            resume_stalled()
            last_sweep = time.monotonic()
        return all(settled(chat) for chat in chats)

    background.wait(done, "the killed chats to be rescued", timeout=120)


def test_a_worker_runs_transactional_tools_each_committed_with_its_result(background, user):
    background.start_worker("w1")
    chat = new_chat(user, ledger)
    chat.ask_later("tools:ledger,ledger|ledger").complete_later()

    background.wait(lambda: settled(chat), "the chat to settle")

    calls = ["call_1_0_0", "call_1_0_1", "call_1_1_0"]
    assert ledger_rows(chat.pk) == [(chat.pk, call, True, True) for call in calls]
    assert notes_of(chat) == calls
    assert sorted(background.runs()) == sorted(f"ledger:{chat.pk}:{call}" for call in calls)
    assert chat.tool_calls.filter(state=ToolCallState.SUCCEEDED).count() == 3


# PostgreSQL only: marked ``database`` so it runs on both Pythons (tests/conftest.py _SCENARIOS).
@pytest.mark.database
@pytest.mark.skipif(
    "connection.vendor != 'postgresql'",
    reason="on SQLite the tool's transaction holds the one write lock: no one can take the "
    "lease over while the tool runs",
)
def test_a_worker_whose_lease_is_taken_over_mid_tool_commits_nothing_and_the_call_books_once(
    background, user
):
    folder = background.tmp / "points"
    folder.mkdir()
    first = background.start_worker("first", kill_points=folder, LEASE_SECONDS=LEASE_SECONDS)
    chat = new_chat(user, ledger)
    chat.ask_later("tools:ledger")
    arm(folder, chat.pk, "mid_body")
    chat.complete_later()
    background.wait(lambda: reached(folder, chat.pk, "mid_body"), "the tool to write its row")

    # An operator frees the chat (manage.py agentloop unlock): the next job takes it and runs
    # the call again, to its commit, while the first worker still holds mid-tool.
    background.start_worker("second", LEASE_SECONDS=LEASE_SECONDS)
    assert free_chat(chat.pk) is not None
    background.wait(lambda: settled(chat), "the second worker to finish the chat")
    assert_booked_once(chat)

    release(folder, chat.pk, "mid_body")  # the first worker's tool returns now
    background.wait(lambda: "lost" in first.outcomes(), "the first worker's job to end 'lost'")

    assert ledger_runs(background, chat) == 2
    assert_booked_once(chat)  # its write rolled back with its result


def test_sigkill_at_every_point_of_the_tools_run_leaves_all_or_nothing_and_books_once(
    background, user
):
    postgresql = connection.vendor == "postgresql"
    # A transaction stopped at a point holds SQLite's one write lock: one chat at a time.
    at_once, rounds = (len(POINTS), 10) if postgresql else (1, 2 * len(POINTS))
    folder = background.tmp / "points"
    folder.mkdir()

    def worker(index: int) -> Worker:
        return background.start_worker(
            f"w{index}", concurrency=at_once, kill_points=folder, LEASE_SECONDS=LEASE_SECONDS
        )

    victim = worker(0)
    every: list[Any] = []
    killed_at: dict[Any, str] = {}
    for index in range(rounds):
        chats = []
        for slot in range(at_once):
            point = POINTS[(index * at_once + slot) % len(POINTS)]
            chat = new_chat(user, ledger)
            chat.ask_later(f"tools:ledger round-{index}-{point}")
            arm(folder, chat.pk, point)
            chats.append(chat)
            killed_at[chat.pk] = point
            every.append(chat.pk)
        for chat in chats:
            chat.complete_later()
        background.wait(
            lambda: all(reached(folder, c.pk, killed_at[c.pk]) for c in chats),  # noqa: B023
            f"round {index}'s runs to reach their points",
        )

        victim.kill()

        for chat in chats:
            committed = killed_at[chat.pk] == "after_commit"
            assert ledger_rows(chat.pk) == [(chat.pk, CALL, committed, committed)]
            if not committed:  # cut short: marked running, nothing of the run left
                assert chat.tool_calls.get().state == ToolCallState.RUNNING
        victim = worker(index + 1)  # the rescuer, and the next round's victim
        rescue(background, chats, every)
        for chat in chats:
            assert_booked_once(chat)
            assert ledger_runs(background, chat) == RUNS[killed_at[chat.pk]], killed_at[chat.pk]

    assert_all_or_nothing(every)
    assert Counter(killed_at.values()) == dict.fromkeys(POINTS, rounds * at_once // len(POINTS))
    assert Note.objects.filter(chat_id__in=every).count() == len(every)  # one per call

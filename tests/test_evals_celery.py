"""Eval runs on real ``celery worker`` processes (docs/evals.md): one case per job, recorded
tool results served in the worker, and a worker killed mid-run loses no case and records
none twice. Workers come from the ``background`` fixture (tests/conftest.py, tests/workers.py);
the candidate is ``EvalModel`` (tests/eval_helpers.py), made from settings in every process."""

from __future__ import annotations

import io
from collections import Counter
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from agentloop import providers
from agentloop.evals.running import start_run
from agentloop.evals.sets import set_from_chats
from agentloop.models import Chat, EvalCase, EvalCaseState, Usage
from tests.eval_helpers import EvalModel, lookup_order
from tests.worker_provider import logged_requests

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]

#: the worker's providers: the candidate, made from settings in its processes.
PROVIDERS = {"evalmodel": {"class": "tests.eval_helpers.EvalModel"}}


@pytest.fixture(autouse=True)
def evalmodel() -> Any:
    providers.register("evalmodel", EvalModel())  # this process's source chats answer with it
    yield
    providers.unregister("evalmodel")


def stored_chats(user: Any, questions: list[str]) -> list[Chat]:
    chats = []
    for question in questions:
        chat = Chat.objects.create(model="evalmodel:v1", owner=user).with_tools(lookup_order)
        chat.ask(question)
        chats.append(chat)
    return chats


def finished(run: Any) -> bool:
    return not run.cases.unfinished().exists()


def test_two_hundred_chats_replay_through_a_worker_with_recorded_tool_results(background, user):
    chats = stored_chats(user, [f"Where is order {n}?" for n in range(200)])
    usage = Usage.objects.count()
    background.start_worker("w1", PROVIDERS=PROVIDERS)

    run = start_run(set_from_chats("orders", chats), "evalmodel:v2")
    background.wait(lambda: finished(run), "every case to finish", timeout=120)

    cases = list(run.cases.order_by("position"))
    assert [c.state for c in cases] == [EvalCaseState.PASSED] * 200
    assert cases[42].answer == "Order 42: order 42: shipped"
    assert {c.tool_calls[0]["source"] for c in cases} == {"recorded"}
    assert sum(c.unmatched_calls for c in cases) == 0
    assert background.runs() == []  # the tool's body never ran in the worker
    assert len(background.model_calls()) == 400  # a call and an answer per case, none again
    assert Chat.objects.count() == 200 and Usage.objects.count() == usage


def test_a_worker_killed_mid_run_loses_no_case_and_records_none_twice(background, user):
    chats = stored_chats(user, [f"question {n} sleep=0.3" for n in range(16)])
    first = background.start_worker("w1", PROVIDERS=PROVIDERS, LEASE_SECONDS=2)

    run = start_run(set_from_chats("slow", chats), "evalmodel:v2")
    background.wait(
        lambda: run.progress()["passed"] >= 4 and run.progress()["running"] == 1,
        "some cases to finish and one to be running",
    )
    first.kill()
    done_before = set(run.cases.filter(state=EvalCaseState.PASSED).values_list("input", flat=True))
    in_flight = set(run.cases.filter(state=EvalCaseState.RUNNING).values_list("input", flat=True))
    background.start_worker("w2", PROVIDERS=PROVIDERS, LEASE_SECONDS=2)
    background.wait(lambda: finished(run), "every case to finish", timeout=90)

    cases = list(run.cases.all())
    assert [c.state for c in cases] == [EvalCaseState.PASSED] * 16
    assert all(c.answer == f"answer: {c.input}" and c.lease_token == "" for c in cases)
    asked = Counter(entry["message"] for entry in logged_requests(background.provider_log))
    assert set(asked) == {c.input for c in cases}  # none lost
    # A case finished before the kill never ran again; the one in flight ran once more.
    assert all(asked[message] == 1 for message in done_before)
    assert len(in_flight) <= 1  # 0 when the kill fell between a write and the next claim
    assert all(asked[message] <= 2 for message in in_flight)
    attempts = {c.input: c.attempts for c in cases}
    assert all(attempts[m] == 1 for m in set(attempts) - in_flight)
    assert EvalCase.objects.filter(run=run).count() == 16


def test_the_command_runs_a_set_in_the_background_and_shows_progress(background, user):
    stored_chats(user, [f"Where is order {n}? sleep=0.1" for n in range(6)] + ["hello"])
    background.start_worker("w1", PROVIDERS=PROVIDERS)
    call_command("agentloop", "eval", "set", "orders", "--latest", "7", stdout=io.StringIO())
    out = io.StringIO()

    with pytest.raises(CommandError) as failed:
        call_command(
            "agentloop", "eval", "run", "orders", "--model", "evalmodel:v2", "--background",
            "--scorer", '{"kind": "contains", "value": "shipped"}', "--fail-under", "0.9",
            stdout=out,
        )  # fmt: skip

    lines = out.getvalue().splitlines()
    assert lines[0].endswith("7 cases of 'orders' on evalmodel:v2.")
    progress = [line for line in lines if " done (" in line]
    assert progress[-1] == "  7/7 done (6 passed, 1 failed, 0 errors, 0 running)"
    assert len(progress) >= 2  # shown as it went, not only at the end
    assert "Pass rate 85.7% (6/7)" in out.getvalue()
    assert failed.value.returncode == 1
    assert background.runs() == []

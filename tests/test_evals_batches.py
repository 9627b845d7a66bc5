"""Batch-mode eval runs (docs/evals.md, "Through a batch API"): each round of the cases' model
calls is one provider batch, tool rounds answered from the recording, scored at the batch
price; resumable.

The provider is the real ``AnthropicProvider`` talking Anthropic's Message Batches wire
format to ``tests.batch_server.FakeBatches`` (each batch reads as in progress once, then
ended; answers follow the rule in each request's latest user message).
"""

from __future__ import annotations

import io
import json
from decimal import Decimal
from typing import Any

import pytest
from django.core.management import CommandError, call_command

import agentloop
from agentloop import providers
from agentloop.batches import poll as poll_chat_batches
from agentloop.batches import refresh as refresh_chat_batch
from agentloop.budgets import spend_of
from agentloop.evals import batch_rounds
from agentloop.evals.outcomes import EVAL_SUBJECT
from agentloop.evals.running import run_case, send_cases, start_run
from agentloop.evals.sets import set_from_jsonl
from agentloop.exceptions import BatchError, ConfigurationError, ProviderError
from agentloop.messages import TokenUsage
from agentloop.models import Batch, BatchStatus, Budget, Chat, EvalCaseState, EvalRun, Usage
from agentloop.providers.anthropic import AnthropicProvider
from agentloop.providers.catalog import price_of
from agentloop.testing import OfflineProvider
from tests.batch_server import USAGE, FakeBatches

pytestmark = pytest.mark.django_db

MODEL = "anthropic:claude-haiku-4-5"
#: one answer of the fake server at the batch price: half the catalog price.
BATCH_COST = price_of("claude-haiku-4-5", TokenUsage(**USAGE)) / 2
TOOLS = ["tests.tools.step_one", "tests.tools.step_two"]


@pytest.fixture
def fake() -> Any:
    server = FakeBatches()
    providers.register(
        "anthropic", AnthropicProvider(api_key="test-key", transport=server.transport())
    )
    yield server
    providers.unregister("anthropic")


@pytest.fixture
def tool_runs(tmp_path, monkeypatch) -> Any:
    """The file the test tools note each real run in (none should, in an eval)."""
    path = tmp_path / "runs.log"
    monkeypatch.setenv("AGENTLOOP_TEST_RUN_LOG", str(path))
    return path


def conversation(question: str, *rounds: tuple[str, str], answer: str) -> str:
    """A JSONL line: ``question``, one round of a recorded tool call per ``(tool, result)``,
    and the recorded ``answer``."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
    for number, (name, result) in enumerate(rounds):
        call = {"id": f"c{number}", "name": name, "arguments": {}}
        messages.append({"role": "assistant", "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{number}", "content": result})
    messages.append({"role": "assistant", "content": answer})
    return json.dumps({"messages": messages, "tools": TOOLS})


def eval_set(name: str = "batched") -> Any:
    return set_from_jsonl(
        name,
        [
            conversation("hello", answer="echo: hello"),
            conversation(
                "tools:step_one|step_two",
                ("step_one", "recorded one"),
                ("step_two", "recorded two"),
                answer="done: recorded two",
            ),
            conversation("fail", answer="never"),
        ],
    )


def poll_until_finished(run: EvalRun, polls: int = 12) -> None:
    for _ in range(polls):
        batch_rounds.poll()
        if not run.cases.unfinished().exists():
            return
    raise AssertionError(f"run {run.pk} unfinished after {polls} polls: {run.progress()}")


def test_a_batch_run_goes_through_the_batch_api_round_by_round_at_the_batch_price(
    fake, tool_runs, settings
):
    settings.AGENTLOOP = {**settings.AGENTLOOP, "BUDGETS": {}}
    chats_before = Chat.objects.count()
    run = start_run(eval_set(), MODEL, batch=True, scorers=[{"kind": "exact"}])

    # The first round: every case's first model call, in one batch, in Anthropic's format.
    (first,) = fake.submitted()
    assert [item["custom_id"] for item in first] == ["0", "1", "2"]
    assert [item["params"]["messages"][-1]["content"][0]["text"] for item in first] == [
        "hello",
        "tools:step_one|step_two",
        "fail",
    ]
    (batch,) = Batch.objects.filter(eval_run=run)
    assert (batch.provider, batch.model, batch.status) == (
        "anthropic",
        "claude-haiku-4-5",
        "in_progress",
    )
    assert run.progress()["running"] == 3

    poll_until_finished(run)

    cases = {case.position: case for case in run.cases.all()}
    assert (cases[0].state, cases[0].answer) == (EvalCaseState.PASSED, "echo: hello")
    assert cases[0].cost == BATCH_COST
    # Two tool rounds answered from the recording, each followed by a batched model call.
    tools_case = cases[1]
    assert (tools_case.state, tools_case.answer) == (EvalCaseState.PASSED, "done: recorded two")
    assert [(c["name"], c["result"], c["source"]) for c in tools_case.tool_calls] == [
        ("step_one", "recorded one", "recorded"),
        ("step_two", "recorded two", "recorded"),
    ]
    assert tools_case.cost == 3 * BATCH_COST
    assert (tools_case.input_tokens, tools_case.output_tokens) == (300, 60)
    assert tools_case.scores == [
        {"name": "exact", "score": 1.0, "passed": True, "reason": "the answer is the expected one"}
    ]
    assert (cases[2].state, cases[2].batch_id) == (EvalCaseState.ERROR, None)
    assert "scripted failure" in cases[2].error
    # Three rounds (one per model call of the longest case), each of the cases still going.
    assert [len(requests) for requests in fake.submitted()] == [3, 1, 1]
    assert all(b.collected_at is not None for b in Batch.objects.filter(eval_run=run))
    assert not tool_runs.exists()  # no tool body ran
    # Apart from owners: no chat, no usage row; the cost is the evals' own budget subject's.
    assert Chat.objects.count() == chats_before and not Usage.objects.exists()
    assert list(Budget.objects.values_list("subject", flat=True)) == [EVAL_SUBJECT.key]
    assert spend_of(EVAL_SUBJECT.key).cost_per_day == run.spent() == 4 * BATCH_COST


def test_the_batch_price_is_half_of_what_the_job_path_records(fake):
    run = start_run(eval_set(), MODEL, batch=True)
    poll_until_finished(run)

    full = price_of("claude-haiku-4-5", TokenUsage(**USAGE))
    assert run.cases.get(position=0).cost == full / 2


def test_a_round_recorded_but_not_sent_is_sent_by_the_next_poll(fake):
    fake.failures = [529]  # the provider is overloaded when the first round goes out

    run = start_run(eval_set(), MODEL, batch=True)

    (batch,) = Batch.objects.filter(eval_run=run)
    assert batch.status == BatchStatus.CREATED and "Not sent yet" in batch.error
    assert fake.submitted() == []
    batch_rounds.poll()  # sends it
    assert [len(requests) for requests in fake.submitted()] == [3]
    poll_until_finished(run)
    assert run.cases.get(position=0).state == EvalCaseState.PASSED


class Killed(BaseException):
    """A poller's process dying mid-collection."""


def test_a_poller_killed_mid_collection_loses_no_case_and_takes_none_twice(fake, monkeypatch):
    run = start_run(eval_set(), MODEL, batch=True)
    batch_rounds.poll()  # in progress
    answered = []
    real = batch_rounds._answer

    def dies_after_one(*args: Any) -> None:
        if answered:
            raise Killed
        answered.append(args[3].position)
        real(*args)

    monkeypatch.setattr(batch_rounds, "_answer", dies_after_one)
    with pytest.raises(Killed):
        batch_rounds.poll()
    monkeypatch.setattr(batch_rounds, "_answer", real)
    first = run.cases.get(position=0)
    assert first.state == EvalCaseState.PASSED and first.batch_id is None
    # The killed poller's claim on the batch runs out; then the next poll collects the rest.
    Batch.objects.filter(eval_run=run).update(claimed_until=None)

    poll_until_finished(run)

    again = run.cases.get(position=0)
    assert (again.attempts, again.finished_at, again.cost) == (1, first.finished_at, BATCH_COST)
    assert run.cases.get(position=1).answer == "done: recorded two"
    assert run.progress()["running"] == run.progress()["pending"] == 0


def test_a_case_stopped_by_its_limit_is_not_sent_again(fake):
    run = start_run(eval_set(), MODEL, batch=True, settings={"limits": {"max_model_calls": 2}})

    poll_until_finished(run)

    case = run.cases.get(position=1)
    assert case.state == EvalCaseState.ERROR
    assert case.error == "stopped: max_model_calls reached (2 of 2)"
    assert case.cost == 2 * BATCH_COST
    assert [len(requests) for requests in fake.submitted()] == [3, 1]


def test_a_provider_without_a_batch_api_is_refused_and_nothing_is_saved(scripted):
    with pytest.raises(ConfigurationError, match="has no batch API"):
        start_run(eval_set(), "scripted:x", batch=True)

    assert not EvalRun.objects.exists()


def test_the_chat_poller_leaves_eval_batches_to_the_eval_poller(fake):
    run = start_run(eval_set(), MODEL, batch=True)
    (batch,) = Batch.objects.filter(eval_run=run)

    assert poll_chat_batches() == []
    with pytest.raises(BatchError, match="holds eval run"):
        refresh_chat_batch(batch)
    batch.refresh_from_db()
    assert batch.collected_at is None and run.progress()["running"] == 3


def test_the_poll_task_moves_batch_runs_on(fake):
    from agentloop.tasks import poll_batches

    run = start_run(eval_set(), MODEL, batch=True)
    for _ in range(8):
        poll_batches()

    assert not run.cases.unfinished().exists()
    assert run.cases.get(position=1).answer == "done: recorded two"


def test_the_command_runs_a_set_through_batches_showing_progress(fake):
    eval_set("cli")
    out = io.StringIO()

    with pytest.raises(CommandError) as failed:
        call_command(
            "agentloop", "eval", "run", "cli", "--model", MODEL, "--batch",
            "--poll-seconds", "0", "--scorer", '{"kind": "contains", "value": "echo"}',
            "--fail-under", "0.5", stdout=out,
        )  # fmt: skip

    text = out.getvalue()
    assert "0/3 done (0 passed, 0 failed, 0 errors, 3 running); open batches: #" in text
    assert "3/3 done (1 passed, 1 failed, 1 errors, 0 running); open batches: none" in text
    assert f"cost ${4 * BATCH_COST:.4f}" in text
    assert failed.value.returncode == 1 and "pass rate 33.3% is under 50.0%" in str(failed.value)


def test_the_command_can_send_a_batch_run_and_return(fake):
    eval_set("later")
    out = io.StringIO()

    call_command(
        "agentloop", "eval", "run", "later", "--model", MODEL, "--batch", "--no-wait", stdout=out
    )

    run = EvalRun.objects.get()
    assert run.batched and run.progress()["running"] == 3
    assert "Sent. The poll_batches task moves it on" in out.getvalue()
    shown = io.StringIO()
    call_command("agentloop", "eval", "show", str(run.pk), stdout=shown)
    assert "; open batches: #" in shown.getvalue()


def test_agentloop_batch_and_eval_batches_live_side_by_side(fake, user):
    chat = Chat.objects.create(model=MODEL, owner=user).ask_later("bonjour")
    chats_batch = agentloop.batch([chat])
    run = start_run(eval_set(), MODEL, batch=True)

    poll_chat_batches()
    poll_chat_batches()
    poll_until_finished(run)

    chats_batch.refresh_from_db()
    assert chats_batch.collected_at is not None and chats_batch.eval_run_id is None
    assert chat.messages.last().content == "echo: bonjour"
    assert run.cases.get(position=0).answer == "echo: hello"
    assert Decimal(0) < run.spent()


def test_the_offline_provider_serves_batches_in_the_process_that_sent_them(user):
    offline = OfflineProvider("offline", reply="Offline: {message}")
    providers.register("offline", offline)
    try:
        chats = [Chat.objects.create(model="offline:x", owner=user).ask_later(q) for q in "ab"]
        batch = agentloop.batch(chats)
        assert batch.status == "in_progress"
        poll_chat_batches()  # ended at its first status read

        assert [chat.messages.last().content for chat in chats] == ["Offline: a", "Offline: b"]
        elsewhere = OfflineProvider("offline").batch_api()  # as another process would have it
        with pytest.raises(ProviderError, match="polled in the process that sent it"):
            elsewhere.status(batch.provider_batch_id)
    finally:
        providers.unregister("offline")


def test_the_admin_polls_a_batched_runs_batches_and_shows_where_it_is(fake, admin_client):
    run = start_run(eval_set(), MODEL, batch=True)
    changelist = "/admin/agentloop/evalrun/"
    (first,) = run.batches.all()

    assert f"through batches, open: #{first.pk} in_progress" in (
        admin_client.get(changelist).content.decode()
    )
    for _ in range(2):
        admin_client.post(changelist, {"action": "poll_run_batches", "_selected_action": [run.pk]})

    first.refresh_from_db()
    assert first.collected_at is not None
    (second,) = run.batches.filter(collected_at__isnull=True)  # the tools case's next round
    page = admin_client.get(changelist).content.decode()
    assert (
        f"2/3 (1 passed, 0 failed, 1 errors, 1 running); through batches, open: #{second.pk}"
        in page
    )
    batches = admin_client.get("/admin/agentloop/batch/").content.decode()
    assert second.provider_batch_id in batches  # eval batches are listed with the others


def test_the_job_path_leaves_a_batched_runs_cases_to_their_rounds(fake):
    run = start_run(eval_set(), MODEL, batch=True)
    batch_rounds.poll()
    batch_rounds.poll()  # the tools case waits in round 2, its replay so far on its row
    waiting = run.cases.get(position=1)
    assert waiting.state == EvalCaseState.RUNNING and len(waiting.replayed) == 2

    assert run_case(waiting.pk).action == "batched"
    assert send_cases(run) == 0  # nothing waits outside a batch: no round to send

    waiting.refresh_from_db()
    assert (waiting.attempts, len(waiting.replayed)) == (2, 2)

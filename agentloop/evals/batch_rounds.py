"""Batch-mode eval runs: a run's model calls sent through the provider's batch API, at the
batch price, a round at a time.

A round is one provider batch holding the next model call of each of the run's waiting
cases (a :class:`~agentloop.models.Batch` whose ``eval_run`` is the run; each case points at
it with ``batch`` and is named in it by its position). When the provider has ended the
batch, each answer goes into its case's replay (in memory, as the job path's), its tools
answer from the recording, and then:

- the candidate answered: the case is scored and finished;
- it wants another model call (its tools gave it results): the case waits, its replay so
  far kept on its row (``replayed``), for the **next round**: every model call of a batch
  run is batched, so the whole run costs the batch price (the job path would pay the full
  price for every call after the first), and its limit (``max_model_calls``) bounds the
  rounds;
- its request failed, or the batch ended without running it: the case is an error.

Every step is resumable: a round is recorded (the batch, its cases taken with the run's row
locked) before it is sent, and a round recorded but not sent is sent by the next poll; each
answer moves its case out of the batch with a conditional UPDATE, so a poller killed
mid-collection leaves the rest to the next poll and none is taken twice. :func:`poll` (run
by the ``agentloop.poll_batches`` task and by ``eval run --batch``) does all of it.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import replace
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from .. import providers
from ..batches import records
from ..conf import get_chat_model
from ..engine._transcript_reading import next_move
from ..exceptions import (
    AgentloopError,
    ConfigurationError,
    LimitReachedError,
    ProviderError,
)
from ..messages import Message, ModelResponse
from ..models import Batch, BatchStatus, EvalCase, EvalCaseState, EvalRun
from ..providers.batch_apis import BatchAPI, BatchInfo, batch_api
from .outcomes import candidate_of, case_values, charge_written, evals_budget_reached
from .replay import Attempt, Replaying, attempt_of, start_replay
from .sets import item_turn

__all__ = ["check_batchable", "poll", "refresh", "send_round"]

logger = logging.getLogger(__name__)


def check_batchable(model: str, provider: str | None = None) -> None:
    """ConfigurationError unless ``model``'s provider has a batch API."""
    found, _ = providers.resolve(model, provider)
    if batch_api(found) is None:
        raise ConfigurationError(
            f"The provider of {model!r} has no batch API: run this eval without batches "
            "(the OpenAI, Anthropic and Gemini providers have one)."
        )


# -- sending a round ----------------------------------------------------------------------------
#: what a case that can't be replayed (its item, candidate or recording gone or broken) raises.
_CANT_REPLAY = (AgentloopError, ImportError, KeyError, ValueError)


def _resume(case: EvalCase, run: EvalRun) -> Replaying:
    """The case's replay as its last round left it."""
    turn = item_turn(case.item, get_chat_model())
    so_far = [Message.model_validate(raw) for raw in case.replayed]
    return start_replay(turn, candidate_of(run), so_far=so_far, calls_so_far=case.tool_calls)


def _resumed(case: EvalCase, run: EvalRun, **match: Any) -> Replaying | None:
    """:func:`_resume`, or None when the case can't be replayed: it is then an error (if it
    is still where ``match`` says)."""
    try:
        return _resume(case, run)
    except _CANT_REPLAY as exc:
        _error(case, f"The case can't be replayed: {exc}", **match)
        return None


def _so_far(case: EvalCase, attempt: Attempt, waited_ms: int) -> Attempt:
    """``attempt`` (this round's) with the case's earlier rounds' cost, tokens and time."""
    costs = [cost for cost in (case.cost, attempt.cost) if cost is not None]
    return replace(
        attempt,
        cost=sum(costs, Decimal(0)) if costs else None,
        input_tokens=case.input_tokens + attempt.input_tokens,
        output_tokens=case.output_tokens + attempt.output_tokens,
        latency_ms=(case.latency_ms or 0) + waited_ms,
    )


def _finish(case: EvalCase, run: EvalRun, attempt: Attempt, **match: Any) -> bool:
    """Score and write the case's outcome, if it is still where ``match`` says."""
    values = case_values(case, run, attempt)
    values["replayed"] = [m.model_dump(mode="json") for m in attempt.messages]
    return _write(case, {**values, "finished_at": timezone.now()}, **match)


def _write(case: EvalCase, values: dict[str, Any], **match: Any) -> bool:
    """``values`` into the case, out of its batch, if it is still where ``match`` says
    (one conditional UPDATE: a case is never moved on twice)."""
    with transaction.atomic():  # the case and the evals' budget, together
        written = EvalCase.objects.filter(pk=case.pk, **match).update(batch=None, **values)
        if written:
            charge_written(case, values)
    return bool(written)


def _error(case: EvalCase, text: str, **match: Any) -> bool:
    values = {"state": EvalCaseState.ERROR, "error": text, "score": 0.0}
    return _write(case, {**values, "finished_at": timezone.now()}, **match)


def send_round(run: EvalRun) -> list[Batch]:
    """Send the next model call of each of ``run``'s waiting cases, as one batch per provider
    and model; returns the batches sent (none when no case waits). Cases that can't make
    their request (their chat is gone, a limit stops them) are finished as errors here."""
    waiting = {"state": EvalCaseState.PENDING, "batch__isnull": True}
    over = run.max_cost is not None and run.spent() >= run.max_cost
    why = "the run's cost limit was reached" if over else evals_budget_reached()
    if why:
        run.cases.filter(**waiting).update(
            state=EvalCaseState.SKIPPED, error=f"not run: {why}", finished_at=timezone.now()
        )
        return []
    groups: dict[tuple[str, str], list[tuple[EvalCase, Any]]] = {}
    for case in run.cases.filter(**waiting).order_by("position"):
        replaying = _resumed(case, run, **waiting)
        if replaying is None:
            continue
        conversation = replaying.conversation
        try:
            prepared = conversation.prepare_model_call()
        except LimitReachedError as exc:
            attempt = _so_far(case, attempt_of(replaying, f"stopped: {exc.reason}"), 0)
            _finish(case, run, attempt, **waiting)
            continue
        key = (prepared.provider_name, prepared.model_id)
        groups.setdefault(key, []).append((case, prepared))
    sent = []
    for (provider_name, model_id), calls in groups.items():
        api = batch_api(calls[0][1].provider)
        if api is None:
            for case, _ in calls:
                _error(case, f"Provider {provider_name!r} has no batch API.", **waiting)
            continue
        batch = _record(run, provider_name, model_id, calls)
        if batch is not None:
            taken = set(batch.eval_cases.values_list("pk", flat=True))
            _send(batch, api, [(case, call) for case, call in calls if case.pk in taken])
            sent.append(batch)
    return sent


def _record(
    run: EvalRun, provider_name: str, model_id: str, calls: list[tuple[EvalCase, Any]]
) -> Batch | None:
    """The round's batch, with the cases still waiting taken into it (the run's row locked,
    so two pollers never put one case in two batches); None when another took them all."""
    now = timezone.now()
    with transaction.atomic():
        EvalRun.objects.select_for_update().filter(pk=run.pk).first()
        keys = list(
            EvalCase.objects.filter(
                pk__in=[case.pk for case, _ in calls],
                state=EvalCaseState.PENDING,
                batch__isnull=True,
            ).values_list("pk", flat=True)
        )
        if not keys:
            return None
        batch = Batch.objects.create(
            provider=provider_name, model=model_id, eval_run=run, request_count=len(keys),
            claim_token=secrets.token_hex(16),
            claimed_until=now + timedelta(seconds=records.CLAIM_SECONDS),
        )  # fmt: skip
        EvalCase.objects.filter(pk__in=keys).update(
            state=EvalCaseState.RUNNING, batch=batch, attempts=F("attempts") + 1
        )
    return batch


def _send(batch: Batch, api: BatchAPI, calls: list[tuple[EvalCase, Any]]) -> None:
    """Send a recorded round. A provider too busy leaves it to the next poll; any other
    refusal ends it, its cases errors (nothing was sent, nothing is charged)."""
    try:
        info = api.submit(
            [(str(case.position), prepared.request) for case, prepared in calls],
            display_name=f"agentloop-eval-{batch.eval_run_id}-batch-{batch.pk}",
        )
        records.update(
            batch, provider_batch_id=info.id, submitted_at=timezone.now(), **records.counts(info)
        )
    except ProviderError as exc:
        text = f"{type(exc).__name__}: {exc}"
        if exc.retryable:  # recorded, not sent: the next poll sends it
            records.update(batch, error=f"Not sent yet: {text}"[:2000])
        else:
            _fail_unsent(batch, text)
    except Exception as exc:
        logger.exception("Sending eval batch %s failed", batch.pk)
        _fail_unsent(batch, f"{type(exc).__name__}: {exc}")
    finally:
        records.release(batch)


def _fail_unsent(batch: Batch, text: str) -> None:
    now = timezone.now()
    records.update(batch, status=BatchStatus.FAILED, error=text, collected_at=now)
    for case in batch.eval_cases.filter(state=EvalCaseState.RUNNING):
        _error(case, f"Batch #{batch.pk} could not be sent: {text}", batch=batch)


# -- polling ------------------------------------------------------------------------------------
def poll(run: EvalRun | None = None) -> list[Batch]:
    """Refresh every open eval batch (of ``run``, or of every run), then send the next
    round of each batched run with cases waiting. Returns the batches polled."""
    batches = Batch.objects.open().filter(eval_run__isnull=False)
    if run is not None:
        batches = batches.filter(eval_run=run)
    polled = records.refresh_each(batches.order_by("created_at"), refresh)
    runs = EvalRun.objects.filter(
        batched=True, cases__state=EvalCaseState.PENDING, cases__batch__isnull=True
    )
    if run is not None:
        runs = runs.filter(pk=run.pk)
    for waiting in runs.distinct().order_by("pk"):
        send_round(waiting)
    return polled


def _run_of(batch: Batch) -> EvalRun:
    run = batch.eval_run
    if run is None:  # its run was deleted: nothing is left to put its answers into
        raise ConfigurationError(f"Batch #{batch.pk} belongs to no eval run any more.")
    return run


def refresh(batch: Batch) -> Batch:
    """Poll the provider for an eval ``batch``; once it has ended, put each answer into its
    case. Does nothing while another process holds the batch."""
    return records.poll(batch, resend=_resend, collect=_collect)


def _resend(batch: Batch, api: BatchAPI) -> None:
    run = _run_of(batch)
    calls = []
    for case in batch.eval_cases.filter(state=EvalCaseState.RUNNING).order_by("position"):
        try:
            replaying = _resume(case, run)
            prepared = replaying.conversation.prepare_model_call(check_limits=False)
        except _CANT_REPLAY as exc:
            _error(case, f"The case can't be replayed: {exc}", batch=batch)
            continue
        calls.append((case, prepared))
    if not calls:
        records.update(batch, status=BatchStatus.CANCELLED, collected_at=timezone.now())
        return
    _send(batch, api, calls)  # under refresh()'s claim


def _collect(batch: Batch, api: BatchAPI, info: BatchInfo) -> None:
    """Each answer into its case; the batch is collected when none is left in it."""
    cases = list(batch.eval_cases.filter(state=EvalCaseState.RUNNING).order_by("position"))
    results = records.outcomes(batch, api, info, (str(case.position) for case in cases))
    waited = timezone.now() - (batch.submitted_at or batch.created_at)
    waited_ms = int(waited.total_seconds() * 1000)
    run = _run_of(batch)
    for case in cases:
        _answer(batch, api, run, case, results[str(case.position)], waited_ms)
    records.update(batch, collected_at=timezone.now())


def _answer(
    batch: Batch, api: BatchAPI, run: EvalRun, case: EvalCase, result: Any, waited_ms: int
) -> None:
    """One result into its case: the answer, its tools (from the recording), then the case
    finished or waiting for the next round."""
    here = {"batch": batch, "state": EvalCaseState.RUNNING}
    latency = {"latency_ms": (case.latency_ms or 0) + waited_ms}
    if not isinstance(result, ModelResponse):
        values = {"state": EvalCaseState.ERROR, "error": f"{type(result).__name__}: {result}",
                  "score": 0.0, "finished_at": timezone.now(), **latency}  # fmt: skip
        _write(case, values, **here)
        return
    replaying = _resumed(case, run, **here)
    if replaying is None:
        return
    conversation = replaying.conversation
    prepared = conversation.prepare_model_call(check_limits=False)
    conversation.accept_response(
        prepared, result, cost=api.cost(prepared.model_id, result.usage), duration_ms=waited_ms
    )
    error, move = "", "done"
    try:
        move = next_move(conversation.messages)
        if move == "tools":
            conversation.run_tools()  # answered from the recording (or live, if opted in)
            move = next_move(conversation.messages)
        if move == "generate":
            conversation.prepare_model_call()  # the limits, checked before the next round
        elif move == "wait":
            error = "A tool waits for a person: an eval has no one to answer it."
    except LimitReachedError as exc:
        error = f"stopped: {exc.reason}"
    except AgentloopError as exc:
        error = str(exc) or type(exc).__name__
    attempt = _so_far(case, attempt_of(replaying, error), waited_ms)
    if move == "generate" and not error:
        values = {
            "state": EvalCaseState.PENDING, "answer": attempt.answer,
            "replayed": [m.model_dump(mode="json") for m in attempt.messages],
            "tool_calls": attempt.tool_calls, "unmatched_calls": attempt.unmatched_calls,
            "cost": attempt.cost, "input_tokens": attempt.input_tokens,
            "output_tokens": attempt.output_tokens, "latency_ms": attempt.latency_ms,
        }  # fmt: skip
        _write(case, values, **here)
        return
    _finish(case, run, attempt, **here)

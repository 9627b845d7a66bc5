"""Running an eval: a run's cases made, sent one job each, and each case's job body.

A case is taken by one job at a time with a conditional UPDATE (pending, or running with an
expired lease, becomes running with this job's token and a lease on the database's clock);
the job renews the lease while the candidate answers and writes the outcome with a second
conditional UPDATE on its token. A worker killed mid-case wrote nothing: its job comes back
(``acks_late``), waits for the lease to expire, and replays the case; a job that lost its
lease writes nothing. So no case is lost and none is recorded twice.
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.db import DatabaseError, connection, transaction
from django.db.models import DateTimeField, ExpressionWrapper, F, Q
from django.db.models.functions import Now
from django.utils import timezone

from ..conf import agentloop_settings, get_chat_model
from ..exceptions import ConfigurationError
from ..models import EvalCase, EvalCaseState, EvalRun, EvalSet
from ..runners import runner_name
from .batch_rounds import check_batchable, send_round
from .outcomes import candidate_of, case_values, charge_written, evals_budget_reached
from .replay import replay
from .scorers import check_scorers
from .sets import item_turn

__all__ = [
    "CASE_TASK",
    "CaseOutcome",
    "candidate_of",
    "run_case",
    "run_here",
    "send_cases",
    "send_jobs",
    "start_run",
]

#: the registered name of the case task (``agentloop.tasks.run_eval_case``).
CASE_TASK = "agentloop.run_eval_case"


def start_run(
    eval_set: EvalSet,
    model: str,
    *,
    provider: str | None = None,
    instructions: str | None = None,
    tools: list[str] | tuple[str, ...] = (),
    agent_path: str = "",
    settings: dict[str, Any] | None = None,
    live_tools: list[str] | tuple[str, ...] = (),
    scorers: list[dict[str, Any]] | None = None,
    fail_under: float | None = None,
    max_cost: Decimal | str | None = None,
    baseline: EvalRun | None = None,
    name: str = "",
    batch: bool = False,
    send: bool = True,
) -> EvalRun:
    """A run of ``model`` (with the rest of the candidate) over ``eval_set``, one case per
    item; with ``send``, its cases go to the background (:func:`send_cases`), or, with
    ``batch``, their first model calls go out as one provider batch
    (:mod:`~agentloop.evals.batch_rounds`: polled by ``agentloop.poll_batches``). Scorers
    default to one ``exact`` comparison with the recorded answer."""
    specs = check_scorers([{"kind": "exact"}] if scorers is None else scorers)
    if fail_under is not None and not 0 <= fail_under <= 1:
        raise ConfigurationError(f"fail_under is a pass rate from 0 to 1, not {fail_under}")
    if batch:
        check_batchable(model, provider)
    with transaction.atomic():
        run = EvalRun.objects.create(
            eval_set=eval_set, name=name, model=model, provider=provider or "",
            instructions=instructions, tools=list(tools), agent_path=agent_path,
            settings=dict(settings or {}), live_tools=list(live_tools), scorers=specs,
            fail_under=fail_under, max_cost=None if max_cost is None else Decimal(str(max_cost)),
            baseline=baseline, batched=batch,
        )  # fmt: skip
        items = eval_set.items
        EvalCase.objects.bulk_create(
            EvalCase(
                run=run,
                position=position,
                source_chat_id=item.get("chat"),
                source_message_id=item.get("turn"),
                item=item,
                input=item.get("input", ""),
                reference=item.get("reference", ""),
            )
            for position, item in enumerate(items)
        )
    if send and batch:
        send_round(run)
    elif send:  # after the commit: a case run here holds no transaction open meanwhile
        send_cases(run)
    return run


def _runs_in_background() -> bool:
    return runner_name() == "celery"


def send_cases(run: EvalRun, cases: list[Any] | None = None) -> int:
    """Send a job per unfinished case of ``run`` (after the transaction commits) when the
    runner is Celery; otherwise run them in this process now. A batched run's waiting
    cases go out as its next batch round instead. Returns how many."""
    if run.batched:
        return sum(batch.request_count for batch in send_round(run))
    keys = cases if cases is not None else list(run.cases.unfinished().values_list("pk", flat=True))
    if not _runs_in_background():
        for key in keys:
            run_case(key)
        return len(keys)
    transaction.on_commit(lambda: send_jobs(keys))
    return len(keys)


def send_jobs(keys: list[Any], countdown: float | None = None) -> None:
    """Send one case job per key to Celery now (``countdown``: seconds before it runs)."""
    from celery import current_app  # the celery extra: only a Celery runner gets here

    with current_app.producer_or_acquire() as producer:
        for key in keys:
            signature = current_app.signature(CASE_TASK, args=(key,))
            signature.apply_async(countdown=countdown, producer=producer)


def run_here(run: EvalRun) -> int:
    """Run ``run``'s unfinished cases in this process, one after another (the command's
    default: no worker needed). Returns how many it ran."""
    ran = 0
    for key in list(run.cases.unfinished().values_list("pk", flat=True)):
        ran += run_case(key).action == "done"
    return ran


@dataclass(frozen=True)
class CaseOutcome:
    """What a case's job did: ``done`` (ran and wrote it), ``finished`` (already was),
    ``held`` (another job holds it: try again in ``retry_in`` seconds), ``lost`` (its lease
    was taken: nothing written), ``skipped`` (the run's cost limit), ``gone``, ``batched``
    (its run goes through batches: :mod:`.batch_rounds` runs it)."""

    action: str
    retry_in: float | None = None


def _lease_expiry() -> Any:
    seconds = float(agentloop_settings.LEASE_SECONDS)
    return ExpressionWrapper(Now() + timedelta(seconds=seconds), output_field=DateTimeField())


def _claim(case_id: Any, token: str) -> int:
    claimable = Q(state=EvalCaseState.PENDING) | Q(
        state=EvalCaseState.RUNNING, lease_expires_at__lt=Now()
    )
    return EvalCase.objects.filter(claimable, pk=case_id).update(
        state=EvalCaseState.RUNNING, lease_token=token, lease_expires_at=_lease_expiry(),
        attempts=F("attempts") + 1,
    )  # fmt: skip


class _Heartbeat:
    """Renews a case's lease while its candidate answers (a third of the lease each time)."""

    def __init__(self, case_id: Any, token: str) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, args=(case_id, token), daemon=True)

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self, case_id: Any, token: str) -> None:
        try:
            while not self._stop.wait(float(agentloop_settings.LEASE_SECONDS) / 3):
                try:
                    EvalCase.objects.filter(pk=case_id, lease_token=token).update(
                        lease_expires_at=_lease_expiry()
                    )
                except DatabaseError:
                    # Tried again at the next beat; a lease that ends meanwhile may be taken
                    # over, and then this job's outcome is not written (never twice).
                    connection.close()
        finally:
            connection.close()  # this thread's own connection


def _over_budget(run: EvalRun) -> bool:
    return run.max_cost is not None and run.spent() >= run.max_cost


def run_case(case_id: Any) -> CaseOutcome:
    """Replay and score one case, if no other job holds it (the job body of every runner)."""
    case = EvalCase.objects.select_related("run").filter(pk=case_id).first()
    if case is None:
        return CaseOutcome("gone")
    if case.state not in (EvalCaseState.PENDING, EvalCaseState.RUNNING):
        return CaseOutcome("finished")
    run = case.run
    if run.batched:  # a job must not replay from scratch what a batch round holds
        return CaseOutcome("batched")
    why = "the run's cost limit was reached" if _over_budget(run) else evals_budget_reached()
    if why:
        skipped = EvalCase.objects.filter(pk=case_id, state=EvalCaseState.PENDING).update(
            state=EvalCaseState.SKIPPED, error=f"not run: {why}", finished_at=timezone.now()
        )
        if skipped:
            return CaseOutcome("skipped")
    token = uuid.uuid4().hex
    if not _claim(case_id, token):
        held = EvalCase.objects.filter(pk=case_id, state=EvalCaseState.RUNNING).first()
        if held is None or held.lease_expires_at is None:
            return CaseOutcome("finished")
        left = (held.lease_expires_at - timezone.now()).total_seconds()
        return CaseOutcome("held", retry_in=max(left, 0.0) + 0.5)
    with _Heartbeat(case_id, token):
        values = _outcome(case, run)
    with transaction.atomic():  # the case and the evals' budget, together
        written = EvalCase.objects.filter(
            pk=case_id, lease_token=token, state=EvalCaseState.RUNNING
        ).update(**values, lease_token="", lease_expires_at=None, finished_at=Now())
        if written:
            charge_written(case, values)
    return CaseOutcome("done" if written else "lost")


def _outcome(case: EvalCase, run: EvalRun) -> dict[str, Any]:
    """The case's row values once replayed and scored (errors become the case's error)."""
    try:
        turn = item_turn(case.item, get_chat_model())
    except (ConfigurationError, KeyError, ValueError) as exc:
        return {"state": EvalCaseState.ERROR, "error": f"The case can't be replayed: {exc}"}
    return case_values(case, run, replay(turn, candidate_of(run)))

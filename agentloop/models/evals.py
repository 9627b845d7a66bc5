"""Evals as rows: ``EvalSet`` (what to replay), ``EvalRun`` (a candidate and its scorers) and
``EvalCase`` (one replayed turn of one run, with its answer, scores, cost and latency).

A set is a saved selection: each item names a stored chat and one of its user turns (or
carries a conversation of its own, from a JSONL file), with the turn's input and the answer
recorded then. A run makes one case per item; a case is claimed by one job at a time (a
conditional UPDATE with a lease on the database's clock), so a worker killed mid-case loses
nothing and no case is written twice. See docs/evals.md.
"""

from __future__ import annotations

from decimal import Decimal

from django.db import models
from django.db.models import Count, Q, Sum
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from ..django_store.fields import StorableCharField, StorableJSONField, StorableTextField
from .chat import Chat
from .message import Message

__all__ = ["EvalCase", "EvalCaseQuerySet", "EvalCaseState", "EvalRun", "EvalSet"]


class EvalSet(models.Model):
    """A saved selection of chats and turns (``agentloop.evals.sets`` makes them).

    ``items`` is a list of dicts, one per case: ``chat`` and ``turn`` (a chat's pk and the pk
    of its user message), or ``messages`` (a conversation of its own, engine messages as
    JSON, ending with the recorded answer); each with ``input`` (the user turn's text) and
    ``reference`` (the answer recorded then), and optionally ``expected`` (what scorers
    compare with instead of the reference)."""

    name = StorableCharField(_("name"), max_length=200, unique=True)
    description = StorableTextField(_("description"), blank=True)
    items = StorableJSONField(_("items"), default=list, blank=True)
    created_at = models.DateTimeField(_("created at"), default=timezone.now, editable=False)

    class Meta:
        verbose_name = _("eval set")
        verbose_name_plural = _("eval sets")
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({len(self.items)} cases)"


class EvalRun(models.Model):
    """A candidate (model, instructions, tools, settings) replayed over a set, and how its
    answers are scored. Made and started by ``agentloop.evals.running.start_run``."""

    eval_set = models.ForeignKey(
        EvalSet, verbose_name=_("eval set"), on_delete=models.CASCADE, related_name="runs"
    )
    name = StorableCharField(_("name"), max_length=200, blank=True)
    model = StorableCharField(_("model"), max_length=200)
    provider = StorableCharField(_("provider"), max_length=100, blank=True)
    #: replaces the recorded chat's instructions; null: each case keeps its chat's.
    instructions = StorableTextField(_("instructions"), null=True, blank=True)
    #: tool references (import paths); empty: each case offers its chat's own tools.
    tools = StorableJSONField(_("tools (import paths)"), default=list, blank=True)
    #: an agent's import path: its model, instructions and tools unless set above.
    agent_path = StorableCharField(_("agent import path"), max_length=300, blank=True)
    #: ``temperature``, ``max_output_tokens``, ``provider_options``, ``limits`` (a case's
    #: ``with_limits``; default ``{"max_model_calls": 20}``).
    settings = StorableJSONField(_("settings"), default=dict, blank=True)
    #: names of tools that run for real; every other tool answers from the recording.
    live_tools = StorableJSONField(_("tools run for real"), default=list, blank=True)
    #: scorer specs (``agentloop.evals.scorers``): a case passes when every one passes.
    scorers = StorableJSONField(_("scorers"), default=list, blank=True)
    #: the pass rate under which the run fails (``--fail-under``); null: never fails.
    fail_under = models.FloatField(_("fail under (pass rate)"), null=True, blank=True)
    #: the run's own spending limit in dollars: no case starts once its cases cost this much.
    max_cost = models.DecimalField(
        _("cost limit"), max_digits=12, decimal_places=6, null=True, blank=True
    )
    #: the run compared with in the admin (null: the recorded answers).
    baseline = models.ForeignKey(
        "self", verbose_name=_("baseline"), null=True, blank=True, on_delete=models.SET_NULL
    )
    #: its model calls go through the provider's batch API (at the batch price), a batch
    #: round at a time (``agentloop.evals.batch_rounds``), instead of one job per case.
    batched = models.BooleanField(_("through batches"), default=False)
    created_at = models.DateTimeField(_("created at"), default=timezone.now, editable=False)

    class Meta:
        verbose_name = _("eval run")
        verbose_name_plural = _("eval runs")
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.name or f"Run {self.pk} of {self.eval_set.name} on {self.model}"

    def progress(self) -> dict[str, int]:
        """Cases by state, and ``total`` (one query)."""
        rows = self.cases.order_by().values("state").annotate(n=Count("pk"))
        counts = {row["state"]: row["n"] for row in rows}
        progress = {state: counts.get(state, 0) for state in EvalCaseState.values}
        progress["total"] = sum(counts.values())
        return progress

    def spent(self) -> Decimal:
        """The cost of its cases so far (a Decimal; 0 when none is priced)."""
        return self.cases.aggregate(total=Sum("cost"))["total"] or Decimal(0)


class EvalCaseState(models.TextChoices):
    PENDING = "pending", _("pending")
    RUNNING = "running", _("running")
    PASSED = "passed", _("passed")
    FAILED = "failed", _("failed")
    #: the replay could not run (a provider error, a tool that can't load): counted as failed.
    ERROR = "error", _("error")
    #: not run: the run's cost limit was reached first.
    SKIPPED = "skipped", _("skipped")


#: the states of a case that has its outcome.
FINISHED = (EvalCaseState.PASSED, EvalCaseState.FAILED, EvalCaseState.ERROR, EvalCaseState.SKIPPED)


class EvalCaseQuerySet(models.QuerySet["EvalCase"]):
    def finished(self) -> EvalCaseQuerySet:
        return self.filter(state__in=FINISHED)

    def unfinished(self) -> EvalCaseQuerySet:
        return self.exclude(state__in=FINISHED)


class EvalCase(models.Model):
    """One item of a set replayed by one run: the candidate's answer, its scores and costs."""

    run = models.ForeignKey(
        EvalRun, verbose_name=_("run"), on_delete=models.CASCADE, related_name="cases"
    )
    #: the item's index in the set.
    position = models.PositiveIntegerField(_("position"))
    #: the chat and user message replayed, as references only (no constraint, nothing done
    #: on delete): deleting or erasing chats never waits on eval rows, and a case keeps the
    #: turn's text and recorded answer (``input``, ``reference``) when its chat is gone.
    source_chat = models.ForeignKey(
        Chat, verbose_name=_("source chat"), null=True, blank=True, db_constraint=False,
        on_delete=models.DO_NOTHING, related_name="+",
    )  # fmt: skip
    source_message = models.ForeignKey(
        Message, verbose_name=_("user turn"), null=True, blank=True, db_constraint=False,
        on_delete=models.DO_NOTHING, related_name="+",
    )  # fmt: skip

    #: the set's item, copied: a case's job reads its own item, not the whole set.
    item = StorableJSONField(_("item"), default=dict, blank=True, editable=False)
    input = StorableTextField(_("input"), blank=True)
    reference = StorableTextField(_("recorded answer"), blank=True)
    state = StorableCharField(
        _("state"), max_length=20, choices=EvalCaseState.choices, default=EvalCaseState.PENDING
    )
    answer = StorableTextField(_("answer"), blank=True)
    #: the candidate's calls: name, arguments, result, and ``source`` (recorded, no
    #: recording, ran).
    tool_calls = StorableJSONField(_("tool calls"), default=list, blank=True)
    #: calls that matched no recorded call (answered "no recording").
    unmatched_calls = models.PositiveIntegerField(_("calls with no recording"), default=0)
    #: one dict per scorer: name, score, passed, reason (a judge's reasoning included).
    scores = StorableJSONField(_("scores"), default=list, blank=True)
    #: the mean of the scores (0 to 1); null until scored.
    score = models.FloatField(_("score"), null=True, blank=True)
    #: in dollars, to the hundred-millionth as usage rows (a batch price has 8 decimals).
    cost = models.DecimalField(_("cost"), max_digits=14, decimal_places=8, null=True, blank=True)
    input_tokens = models.PositiveIntegerField(_("input tokens"), default=0)
    output_tokens = models.PositiveIntegerField(_("output tokens"), default=0)
    latency_ms = models.PositiveIntegerField(_("latency (ms)"), null=True, blank=True)
    error = StorableTextField(_("error"), blank=True)
    #: batch mode: the provider batch holding its next model call (null between rounds).
    batch = models.ForeignKey(
        "agentloop.Batch", verbose_name=_("batch"), null=True, blank=True,
        on_delete=models.SET_NULL, related_name="eval_cases",
    )  # fmt: skip
    #: batch mode: the replay's messages after the user turn so far (engine messages as
    #: JSON), kept between batch rounds.
    replayed = StorableJSONField(_("replayed so far"), default=list, blank=True, editable=False)
    #: the job replaying it: a token and its expiry (by the database's clock).
    lease_token = StorableCharField(_("lease token"), max_length=64, blank=True, editable=False)
    lease_expires_at = models.DateTimeField(_("lease expires at"), null=True, blank=True)
    #: how many jobs claimed it (more than one: a worker died mid-case).
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)

    objects = EvalCaseQuerySet.as_manager()

    class Meta:
        verbose_name = _("eval case")
        verbose_name_plural = _("eval cases")
        ordering = ["run", "position"]
        constraints = [
            models.UniqueConstraint(fields=["run", "position"], name="agentloop_evalcase_pos_uniq")
        ]
        indexes = [
            models.Index(
                fields=["run", "state"],
                name="agentloop_evalcase_open_idx",
                condition=Q(state__in=["pending", "running"]),
            )
        ]

    def __str__(self) -> str:
        return f"Case {self.position} of run {self.run_id}: {self.state}"

    @property
    def passed(self) -> bool:
        return self.state == EvalCaseState.PASSED

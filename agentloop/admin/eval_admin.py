"""Evals in the admin: sets, runs with their progress and pass rate, and a run's cases side
by side with its baseline (the recorded answer, or another run's), with a word diff, the
scores and their reasons (the baseline run's beside), the cases whose outcome changed, the
figures of ``eval compare`` for both runs, and the cost and latency of both runs as SVG
charts; a batched run's progress names its open batches. The chat
list's action ``make_eval_set`` saves the selected chats as a set. Text from models and
tools is escaped wherever it is shown."""

from __future__ import annotations

import difflib
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext_lazy as _

from ..evals.batch_rounds import poll as poll_batches
from ..evals.reports import compare, summarize
from ..evals.sets import set_from_chats
from ..exceptions import AgentloopError
from ..models import EvalCase, EvalCaseState, EvalRun, EvalSet
from .svg_charts import horizontal_bars

__all__ = [
    "EvalCaseAdmin",
    "EvalRunAdmin",
    "EvalSetAdmin",
    "make_eval_set",
    "poll_run_batches",
    "word_diff",
]

#: cases shown on a run's page (the case list has them all).
SHOWN_CASES = 200


@admin.action(description=_("Make an eval set of the selected chats"), permissions=["view"])
def make_eval_set(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    """One case per selected chat (its last user turn), in a set named by the time; for
    those who may add eval sets."""
    if not request.user.has_perm(f"{EvalSet._meta.app_label}.add_evalset"):
        modeladmin.message_user(
            request, _("You may not add eval sets: nothing was made."), messages.ERROR
        )
        return
    name = f"chats {timezone.now():%Y-%m-%d %H:%M:%S}"
    eval_set = set_from_chats(name, queryset.order_by("pk"))
    link = reverse("admin:agentloop_evalset_change", args=[eval_set.pk])
    modeladmin.message_user(
        request,
        format_html('Eval set <a href="{}">{}</a>: {} cases.', link, name, len(eval_set.items)),
        messages.SUCCESS,
    )


def word_diff(old: str, new: str) -> SafeString:
    """``new`` against ``old`` word by word: removed words in ``<del>``, added in ``<ins>``
    (every word escaped)."""
    before, after = old.split(), new.split()
    parts: list[SafeString] = []
    matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
    for operation, a1, a2, b1, b2 in matcher.get_opcodes():
        if operation == "equal":
            parts.append(format_html("{}", " ".join(after[b1:b2])))
            continue
        if a2 > a1:
            parts.append(format_html("<del>{}</del>", " ".join(before[a1:a2])))
        if b2 > b1:
            parts.append(format_html("<ins>{}</ins>", " ".join(after[b1:b2])))
    return mark_safe(" ".join(parts))  # noqa: S308 - each part is escaped above


@admin.register(EvalSet)
class EvalSetAdmin(admin.ModelAdmin):
    list_display = ("name", "case_count", "created_at")
    search_fields = ("name",)
    readonly_fields = ("items",)

    @admin.display(description=_("cases"))
    def case_count(self, obj: EvalSet) -> int:
        return len(obj.items)


@admin.action(description=_("Poll the selected batched runs' batches now"), permissions=["change"])
def poll_run_batches(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet
) -> None:
    """What the ``poll_batches`` task does for these runs: their ended batches collected
    into their cases, the next rounds sent."""
    polled = 0
    for run in queryset.filter(batched=True):
        try:
            polled += len(poll_batches(run))
        except AgentloopError as exc:
            modeladmin.message_user(request, f"Eval run #{run.pk}: {exc}", messages.ERROR)
    modeladmin.message_user(request, _("%(n)s batches polled.") % {"n": polled})


@admin.register(EvalRun)
class EvalRunAdmin(admin.ModelAdmin):
    list_display = ("__str__", "eval_set", "model", "progress_shown", "pass_rate", "created_at")
    list_filter = ("eval_set",)
    list_select_related = ("eval_set",)
    readonly_fields = (
        "batched", "progress_shown", "pass_rate", "comparison", "charts", "side_by_side",
    )  # fmt: skip
    raw_id_fields = ("baseline",)
    actions = [poll_run_batches]

    @admin.display(description=_("progress"))
    def progress_shown(self, obj: EvalRun) -> str:
        progress = obj.progress()
        done = progress["total"] - progress["pending"] - progress["running"]
        return (
            f"{done}/{progress['total']} ({progress['passed']} passed, {progress['failed']} "
            f"failed, {progress['error']} errors, {progress['running']} running)"
        ) + (self._batches(obj) if obj.batched else "")

    @staticmethod
    def _batches(obj: EvalRun) -> str:
        """A batched run's open batches (the provider's status, as last polled)."""
        batches = obj.batches.filter(collected_at__isnull=True).order_by("pk")
        shown = ", ".join(f"#{batch.pk} {batch.status}" for batch in batches)
        return f"; through batches, open: {shown or 'none'}"

    @admin.display(description=_("against its baseline run"))
    def comparison(self, obj: EvalRun) -> SafeString | str:
        """The figures of ``eval compare`` (pass rate, mean score, cost, p50 and p95
        latency...) beside the baseline run's, and how many cases changed."""
        if obj.baseline is None:
            return "—"
        found = compare(obj.baseline, obj)
        rows = format_html_join("", "<tr><th>{}</th><td>{}</td><td>{}</td></tr>", found.rows())
        better = sum(1 for _, _, new in found.changed if new == EvalCaseState.PASSED)
        return format_html(
            '<table class="agentloop-eval-comparison"><tr><th></th><th>{}</th><th>{}</th></tr>'
            "{}</table><p>{}</p>",
            obj.baseline.name or _("baseline"), obj.name or _("this run"), rows,
            _("Cases that changed: %(n)s (%(better)s now pass, %(worse)s no longer pass).")
            % {"n": len(found.changed), "better": better, "worse": len(found.changed) - better},
        )  # fmt: skip

    @admin.display(description=_("pass rate"))
    def pass_rate(self, obj: EvalRun) -> str:
        summary = summarize(obj)
        if not summary.finished:
            return "—"
        return f"{summary.pass_rate:.1%} · ${summary.cost:.4f} · p50 {summary.p50_ms} ms"

    @admin.display(description=_("cost and latency"))
    def charts(self, obj: EvalRun) -> SafeString:
        """Cost and latency of this run and its baseline run (when it has one), as SVG."""
        runs = [(str(obj.name or _("this run")), summarize(obj))]
        if obj.baseline is not None:
            runs.append((str(obj.baseline.name or _("baseline")), summarize(obj.baseline)))
        cost = horizontal_bars(
            [(name, summary.cost, f"{summary.finished} cases") for name, summary in runs],
            title=str(_("Cost")),
            formatter=lambda value: f"${value:.4f}",
        )
        latency = horizontal_bars(
            [
                (f"{name} {label}", value or 0, "")
                for name, summary in runs
                for label, value in (("p50", summary.p50_ms), ("p95", summary.p95_ms))
            ],
            title=str(_("Latency")),
            formatter=lambda value: f"{value:.0f} ms",
        )
        return format_html("{}{}", cost, latency)

    @admin.display(description=_("cases, side by side with the baseline"))
    def side_by_side(self, obj: EvalRun) -> SafeString:
        cases = list(obj.cases.order_by("position")[:SHOWN_CASES])
        baseline: dict[int, EvalCase] = {}
        if obj.baseline_id is not None:
            baseline = {
                case.position: case
                for case in EvalCase.objects.filter(
                    run_id=obj.baseline_id, position__in=[case.position for case in cases]
                ).only("position", "answer", "state", "scores", "error")
            }
        rows = []
        for case in cases:
            other = baseline.get(case.position)
            before = case.reference if other is None else other.answer
            changed = other is not None and other.passed != case.passed
            rows.append(
                format_html(
                    '<tr class="{}"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>'
                    "<td>{}</td><td>{}</td><td>{}</td></tr>",
                    "agentloop-eval-changed" if changed else "",
                    case.position,
                    case.input,
                    before,
                    word_diff(before, case.answer),
                    "—" if other is None else _outcome(other),
                    format_html("{}{}", _outcome(case), _("changed") if changed else ""),
                    "—" if case.cost is None else case.cost,
                    "—" if case.latency_ms is None else f"{case.latency_ms} ms",
                )  # fmt: skip
            )
        header = format_html(
            "<tr><th>#</th><th>{}</th><th>{}</th><th>{}</th><th>{}</th><th>{}</th><th>{}</th>"
            "<th>{}</th></tr>",
            _("input"), _("baseline run") if baseline else _("recorded answer"),
            _("answer (diff)"), _("baseline's outcome"), _("outcome"), _("cost"), _("latency"),
        )  # fmt: skip
        return format_html(
            '<table class="agentloop-eval">{}{}</table>',
            header,
            mark_safe("".join(rows)),  # noqa: S308 - rows are escaped above
        )


def _outcome(case: EvalCase) -> SafeString:
    """A case's state, each score with its reason (pass or fail), and its error; escaped."""
    scores = format_html_join(
        "", "<li>{}: {} — {}</li>",
        ((s["name"], "pass" if s["passed"] else "fail", s["reason"]) for s in case.scores),
    )  # fmt: skip
    return format_html("{}<ul>{}</ul>{}", case.state, scores, case.error)


@admin.register(EvalCase)
class EvalCaseAdmin(admin.ModelAdmin):
    list_display = ("__str__", "run", "state", "score", "cost", "latency_ms", "unmatched_calls")
    list_filter = ("state",)
    list_select_related = ("run", "run__eval_set")
    raw_id_fields = ("run", "source_chat", "source_message")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # cases are made by their run

"""What tracing costs a turn: with TRACING off (it must cost nothing measurable) and on.

    python bench/tracing.py [--database-url URL] [--samples N] [--json out.json]

One turn is ``ask()`` with one tool round: a model call asking for a trivial tool, the tool,
and a model call answering (two ``chat`` spans, one ``execute_tool``, one ``invoke_agent``
when on). The model is ``agentloop.testing.FunctionProvider`` (zero latency), so the figures
are agentloop's own work. Two chats: in memory (no database: the most sensitive to any
overhead), and persisted on PostgreSQL (a new ``Chat`` per sample, made outside the timing).

Variants, timed in turn (the order rotates every sample, so drift hits all alike):

* **floor**: the engine's four tracing entry points replaced by functions that return the
  do-nothing object at once (no settings read, no context-variable read): the engine as if
  it had no tracing code but the calls themselves;
* **off**: ``TRACING = False``, as shipped;
* **on**: ``TRACING = True`` with the OpenTelemetry SDK (``TracerProvider``, a
  ``SimpleSpanProcessor`` and an exporter that drops the spans: what is measured is making
  and ending the spans, not shipping them);
* **content**: on, with ``TRACE_CONTENT = True``.

Figures are medians; each ratio is median(variant) / median(floor) of the same run.
See bench/README.md for a recorded run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a checkout that is not pip-installed
    sys.path.insert(0, str(ROOT))

from agentloop import tool  # noqa: E402  (importing agentloop never needs Django settings)
from bench.step_overhead import (  # noqa: E402  (after the path fix above)
    DEFAULT_DATABASE_URL,
    ensure_database,
    load_average,
    setup_django,
    summary,
)

VARIANTS = ("floor", "off", "on", "content")
CASES = ("memory", "persisted")


@tool
def lookup(key: str) -> str:
    """Looks up a value by key (returns at once).

    Args:
        key: What to look up.
    """
    return f"value of {key}"


def answer(request: Any) -> Any:
    """A tool call first, then a short text once the tool has answered."""
    from agentloop.testing import tool_call

    if request.messages[-1].role == "tool":
        return "The value is known."
    return tool_call("lookup", {"key": "k"})


class _DropSpans:
    """An exporter that keeps nothing but a count (the SDK's interface, without the network)."""

    exported = 0

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        _DropSpans.exported += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def install_sdk() -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_DropSpans()))
    trace.set_tracer_provider(provider)


class Variants:
    """Switches between the variants outside the timing."""

    def __init__(self) -> None:
        from django.conf import settings

        from agentloop.engine import _conversation, _model_calls, _tool_rounds
        from agentloop.engine import tracing as _tracing

        self.tracing = _tracing
        self.engine_modules = (_conversation, _model_calls, _tool_rounds)
        self.base = dict(settings.AGENTLOOP)
        off = _tracing._OFF

        class Stub:
            """The entry points, doing nothing at once."""

            verb = staticmethod(lambda store, single: off)
            turn_started = staticmethod(lambda store, message: None)
            model_call = staticmethod(lambda prepared: off)
            tool_call = staticmethod(lambda call, tool_class: off)
            carry = staticmethod(lambda function: function)

        self.stub = Stub
        self.override: Any = None

    def use(self, variant: str) -> None:
        from django.test import override_settings

        if self.override is not None:
            self.override.disable()
        for module in self.engine_modules:
            module._tracing = self.stub if variant == "floor" else self.tracing
        values = {**self.base, "TRACING": variant in ("on", "content")}
        values["TRACE_CONTENT"] = variant == "content"
        self.override = override_settings(AGENTLOOP=values)
        self.override.enable()
        self.tracing._tracer()  # the flag is worked out now, not in the first timed turn


def time_turns(
    variants: Variants, make_chat: Callable[[], Any], cleanup: Callable[[Any], None],
    samples: int, warmup: int,
) -> dict[str, Any]:  # fmt: skip
    seconds: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    spans = dict.fromkeys(VARIANTS, 0)  # how many spans each variant made (a check, not timed)
    for index in range(warmup + samples):
        shift = index % len(VARIANTS)
        for variant in VARIANTS[shift:] + VARIANTS[:shift]:
            variants.use(variant)
            chat = make_chat()
            exported = _DropSpans.exported
            started = time.perf_counter()
            chat.ask("What is the value of k?")
            elapsed = time.perf_counter() - started
            spans[variant] += _DropSpans.exported - exported
            cleanup(chat)
            if index >= warmup:
                seconds[variant].append(elapsed)
    floor = statistics.median(seconds["floor"])
    turns = warmup + samples
    return {
        variant: {
            **summary(values),
            "ratio": statistics.median(values) / floor,
            "spans_per_turn": spans[variant] / turns,
        }
        for variant, values in seconds.items()
    }


def environment() -> dict[str, Any]:
    from importlib.metadata import version

    import django
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        server = cursor.fetchone()[0]
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "django": django.get_version(),
        "postgres": server,
        "opentelemetry-sdk": version("opentelemetry-sdk"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DATABASE_URL)
    )
    parser.add_argument("--samples", type=int, default=1000, help="timed memory turns a variant")
    parser.add_argument("--db-samples", type=int, default=200, help="timed persisted turns")
    parser.add_argument("--warmup", type=int, default=50, help="untimed samples first")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)

    ensure_database(args.database_url)
    setup_django(args.database_url)
    import agentloop
    from agentloop import providers
    from agentloop.models import Chat
    from agentloop.testing import FunctionProvider

    provider = FunctionProvider(answer)
    providers.register("bench", provider)
    install_sdk()
    variants = Variants()
    results: dict[str, Any] = {
        "environment": environment(),
        "load_average_at_start": load_average(),
    }
    tools = [lookup]

    def memory_chat() -> Any:
        provider.requests.clear()
        return agentloop.chat("bench:zero-latency", tools=tools)

    def persisted_chat() -> Any:
        provider.requests.clear()
        return Chat.objects.create(model="bench:zero-latency").with_tools(*tools)

    print(f"environment: {results['environment']}")
    print("timing (variants in turn, medians):", flush=True)
    results["memory"] = time_turns(
        variants, memory_chat, lambda chat: None, args.samples, args.warmup
    )
    results["persisted"] = time_turns(
        variants, persisted_chat, lambda chat: chat.delete(), args.db_samples, args.warmup // 5
    )
    variants.use("off")
    results["load_average_at_end"] = load_average()
    for case in CASES:
        print(f"\n{case} turn (ask with one tool round)")
        print(f"  {'variant':<8} {'median':>10} {'p90':>10} {'ratio':>7}  samples  spans/turn")
        for variant, row in results[case].items():
            print(
                f"  {variant:<8} {row['median_ms']:>8.3f}ms {row['p90_ms']:>8.3f}ms"
                f" {row['ratio']:>6.3f}x  {row['samples']:>7}  {row['spans_per_turn']:g}"
            )
    print(f"\nload average: {results['load_average_at_start']} -> {results['load_average_at_end']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    made = {(case, v): results[case][v]["spans_per_turn"] for case in CASES for v in VARIANTS}
    expected = {key: 4 if key[1] in ("on", "content") else 0 for key in made}
    if made != expected:  # timing a variant that did not do what it says would mean nothing
        print(f"spans per turn {made}, expected {expected}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    # Run the importable copy (bench.tracing): the chats store the tool by its import path.
    from bench.tracing import main as importable_main

    sys.exit(importable_main())

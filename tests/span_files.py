"""Where the tracing tests collect spans: in memory in the test process, and, in a Celery
worker process, as JSON lines in a file the test reads (``AGENTLOOP_TEST_SPANS``).

Both are built on the OpenTelemetry SDK's exporter interface; the global tracer provider is
set once per process (OpenTelemetry allows no second one).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_memory: InMemorySpanExporter | None = None


def _provider() -> TracerProvider:
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    return provider


def memory_exporter() -> InMemorySpanExporter:
    """This process's in-memory exporter (installed on first use)."""
    global _memory
    if _memory is None:
        _memory = InMemorySpanExporter()
        _provider().add_span_processor(SimpleSpanProcessor(_memory))
    return _memory


def as_record(span: ReadableSpan) -> dict[str, Any]:
    """What a test looks at of a span, as plain JSON values."""
    context = span.get_span_context()
    assert context is not None
    return {
        "name": span.name,
        "trace_id": format(context.trace_id, "032x"),
        "span_id": format(context.span_id, "016x"),
        "parent_id": format(span.parent.span_id, "016x") if span.parent else None,
        "kind": span.kind.name,
        "status": span.status.status_code.name,
        "attributes": {
            key: list(value) if isinstance(value, tuple) else value
            for key, value in (span.attributes or {}).items()
        },
        "links": [format(link.context.span_id, "016x") for link in span.links],
        "pid": os.getpid(),
    }


class JsonLinesSpanExporter(SpanExporter):
    """Appends each finished span to a file, one JSON object a line (one write per batch,
    so lines of two worker processes don't interleave)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(as_record(span)) + "\n" for span in spans)
        with self.path.open("a", encoding="utf-8") as output:
            output.write(lines)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def export_to_file(path: str) -> None:
    """Send this process's spans to ``path`` (a worker process calls it at start)."""
    _provider().add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(Path(path))))


def read_span_file(path: Path) -> list[dict[str, Any]]:
    """The spans a worker wrote (none yet: [])."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]

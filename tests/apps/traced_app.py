"""An App for the cross-process tracing test: each process exports its spans to a file.

Run as ``python -m tests.apps.traced_app dispatch|work SPANS_FILE`` with DT_* variables set.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import timedelta

import anyio
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from durable_tasks import App, TaskContext


class FileSpanExporter(SpanExporter):
    """Appends one JSON line per finished span."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a", encoding="utf-8") as f:
            for span in spans:
                f.write(json.dumps(span_record(span)) + "\n")
        return SpanExportResult.SUCCESS


def span_record(span: ReadableSpan) -> dict[str, object]:
    """The parts of a span the tests look at."""
    ctx = span.get_span_context()
    assert ctx is not None
    return {
        "name": span.name,
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent": f"{span.parent.span_id:016x}" if span.parent else None,
        "links": [f"{link.context.span_id:016x}" for link in span.links],
        "link_traces": [f"{link.context.trace_id:032x}" for link in span.links],
        "attributes": {k: v for k, v in (span.attributes or {}).items() if isinstance(v, str | int | bool | float)},
        "events": [e.name for e in span.events],
    }


def register(app: App) -> None:
    """Add ``traced.flaky``: fails on its first two attempts, then returns its input."""

    @app.task(name="traced.flaky", queue="traced", max_attempts=3)
    def flaky(ctx: TaskContext[int], n: int) -> int:
        if ctx.attempt <= 2:
            raise ConnectionError(f"transient failure {ctx.attempt}")
        return n


def build_app() -> App:
    """The app, configured from DT_* variables."""
    app = App(retry_backoff_initial=timedelta(0), retry_backoff_max=timedelta(0), backoff_jitter=timedelta(0))
    register(app)
    return app


async def _main(role: str) -> None:
    app = build_app()
    if role == "dispatch":
        with anyio.fail_after(30):
            while await app.dispatch_once() == 0:
                await anyio.sleep(0.05)
    else:
        await app.work(max_tasks=1, timeout=timedelta(seconds=30))
    await app.aclose()


if __name__ == "__main__":
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileSpanExporter(sys.argv[2])))
    trace.set_tracer_provider(provider)
    anyio.run(_main, sys.argv[1])
    provider.shutdown()

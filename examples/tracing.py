"""Tracing for the examples: export spans of every process to one JSON-lines file, and draw
the span tree of one trace as text. (The library only uses the OpenTelemetry API; installing
an SDK, as done here, is the application's choice.)"""

from __future__ import annotations

import json
import os
import threading
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

__all__ = ["ENV", "install_file_exporter", "load_spans", "render_tree"]

#: When set, every example process appends its spans to this file.
ENV = "DT_DEMO_TRACE"


class _JsonLinesExporter(SpanExporter):
    def __init__(self, path: Path, service: str) -> None:
        self.path = path
        self.service = service
        self.lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = []
        for span in spans:
            ctx = span.get_span_context()
            if ctx is None:
                continue
            lines.append(
                json.dumps(
                    {
                        "service": self.service,
                        "name": span.name,
                        "trace_id": f"{ctx.trace_id:032x}",
                        "span_id": f"{ctx.span_id:016x}",
                        "parent": f"{span.parent.span_id:016x}" if span.parent else None,
                        "links": [f"{link.context.span_id:016x}" for link in span.links],
                        "start": span.start_time,
                        "end": span.end_time,
                        "attributes": {
                            k: v for k, v in (span.attributes or {}).items() if isinstance(v, str | int | bool)
                        },
                        "events": [e.name for e in span.events],
                    }
                )
            )
        with self.lock, self.path.open("a", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
        return SpanExportResult.SUCCESS


def install_file_exporter(path: str | os.PathLike[str], service: str) -> None:
    """Install an SDK tracer provider writing this process's spans to ``path``."""
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(_JsonLinesExporter(Path(path), service)))
    trace.set_tracer_provider(provider)


def load_spans(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every span in the file."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def render_tree(spans: list[dict[str, Any]], trace_id: str) -> str:
    """The spans of one trace as an indented tree (children by start time, links shown)."""
    mine = [s for s in spans if s["trace_id"] == trace_id]
    ids = {s["span_id"] for s in mine}
    children: dict[str | None, list[dict[str, Any]]] = defaultdict(list)
    for s in mine:
        children[s["parent"] if s["parent"] in ids else None].append(s)
    names = {s["span_id"]: s["name"] for s in mine}
    lines: list[str] = []

    def walk(span: dict[str, Any], depth: int) -> None:
        attrs = span["attributes"]
        detail = [f"{(span['end'] - span['start']) / 1e6:.1f} ms", span["service"]]
        for key in (
            "durable_tasks.generation",
            "durable_tasks.attempt",
            "durable_tasks.outcome",
            "durable_tasks.fenced_out",
        ):
            if key in attrs:
                detail.append(f"{key.split('.')[-1]}={attrs[key]}")
        if span["links"]:
            linked = (names.get(link, "a span its killed process never exported") for link in span["links"])
            detail.append("links→" + ",".join(linked))
        if span["events"]:
            detail.append("events: " + ",".join(span["events"]))
        lines.append(f"{'  ' * depth}{span['name']}  [{'; '.join(detail)}]")
        for child in sorted(children[span["span_id"]], key=lambda c: c["start"]):
            walk(child, depth + 1)

    for root in sorted(children[None], key=lambda c: c["start"]):
        walk(root, 0)
    return "\n".join(lines)

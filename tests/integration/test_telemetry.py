"""One trace per task across processes and retries; metrics through the OpenTelemetry API."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlmodel import Session

from durable_tasks import App, TaskContext, TaskState
from tests.apps.traced_app import register, span_record
from tests.helpers import FULL, submit_all, wait_until

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]
_EXPORTER = InMemorySpanExporter()
_READER = InMemoryMetricReader()


@pytest.fixture(scope="module", autouse=True)
def sdk() -> None:
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # the global provider is set once per process
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    metrics.set_meter_provider(MeterProvider(metric_readers=[_READER]))


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def records(exporter: InMemorySpanExporter) -> list[dict[str, Any]]:
    return [span_record(s) for s in exporter.get_finished_spans()]


def flaky_app(make_app: Any) -> App:
    app: App = make_app()
    register(app)
    return app


async def test_fail_twice_then_succeed_is_one_trace_with_linked_attempts(
    make_app: Any, spans: InMemorySpanExporter
) -> None:
    app = flaky_app(make_app)
    with Session(app.engine) as s:
        task_id = app.submit(s, "traced.flaky", 7).id
        s.commit()
    for _ in range(3):
        assert await app.dispatch_once() == 1
        assert await app.work(max_tasks=1, timeout=timedelta(seconds=10)) == 1
    assert app.get_task(task_id).state == TaskState.SUCCEEDED
    got = records(spans)
    [submit] = [r for r in got if r["name"] == "submit"]
    process = [r for r in got if r["name"] == "process traced.flaky"]
    assert len(process) == 3
    assert {r["trace_id"] for r in process} == {submit["trace_id"]}
    assert all(r["parent"] == submit["span_id"] for r in process)
    # Each attempt links to the one before it, in order.
    assert process[0]["links"] == []
    assert process[1]["links"] == [process[0]["span_id"]]
    assert process[2]["links"] == [process[1]["span_id"]]
    assert [r["attributes"]["durable_tasks.attempt"] for r in process] == [1, 2, 3]
    assert [r["attributes"]["durable_tasks.outcome"] for r in process] == ["retrying", "retrying", "succeeded"]
    assert [r["events"] for r in process] == [["exception"], ["exception"], []]
    assert process[0]["attributes"]["messaging.system"] == "redis"
    assert process[0]["attributes"]["messaging.destination.name"] == "traced"
    assert process[0]["attributes"]["messaging.consumer.group.name"] == "dt-workers"
    dispatches = [r for r in got if r["name"] == "dispatch"]
    assert len(dispatches) == 3
    assert all(submit["trace_id"] in r["link_traces"] for r in dispatches)
    commits = [r for r in got if r["name"] == "commit"]
    assert [c["attributes"]["durable_tasks.fenced_out"] for c in commits] == [False]
    assert any(r["name"] == "publish traced" for r in got)


async def test_payloads_and_results_are_not_attributes_unless_opted_in(
    make_app: Any, spans: InMemorySpanExporter
) -> None:
    app: App = make_app()

    @app.task(name="secretive", queue="traced")
    def secretive(ctx: Any, p: dict[str, str]) -> str:
        return p["token"]

    with Session(app.engine) as s:
        app.submit(s, "secretive", {"token": "canary-5ecret"})
        s.commit()
    await app.dispatch_once()
    await app.work(max_tasks=1, timeout=timedelta(seconds=10))
    dumped = json.dumps(records(spans))
    assert "canary-5ecret" not in dumped

    spans.clear()
    redacted: App = make_app(trace_payloads=True, redact=lambda name, value: "[redacted]")

    @redacted.task(name="secretive", queue="traced")
    def secretive_too(ctx: Any, p: dict[str, str]) -> str:
        return p["token"]

    with Session(redacted.engine) as s:
        redacted.submit(s, "secretive", {"token": "canary-5ecret"})
        s.commit()
    dumped = json.dumps(records(spans))
    assert "canary-5ecret" not in dumped
    assert "[redacted]" in dumped


async def test_metrics_count_outcomes_and_observe_queues(make_app: Any) -> None:
    app = flaky_app(make_app)
    with Session(app.engine) as s:
        app.submit(s, "traced.flaky", 1)
        s.commit()
    for _ in range(3):
        await app.dispatch_once()
        await app.work(max_tasks=1, timeout=timedelta(seconds=10))
    await app.reap_once()  # refreshes the per-queue gauges
    data = _READER.get_metrics_data()
    assert data is not None
    points: dict[str, list[Any]] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                points.setdefault(m.name, []).extend(m.data.data_points)
    ns = app.settings.namespace

    def total(name: str, **attrs: str) -> float:
        matching = [p.value for p in points.get(name, []) if all(p.attributes.get(k) == v for k, v in attrs.items())]
        return float(sum(matching))

    assert total("durable_tasks.executions", outcome="retrying", queue="traced") >= 2
    assert total("durable_tasks.executions", outcome="succeeded", queue="traced") >= 1
    assert total("durable_tasks.dispatched", outcome="sent", queue="traced") >= 3
    assert any(p.count >= 1 for p in points["durable_tasks.end_to_end"])
    assert [p.value for p in points["durable_tasks.pel.size"] if p.attributes.get("namespace") == ns] == [0]
    assert [p.value for p in points["durable_tasks.outbox.backlog"] if p.attributes.get("namespace") == ns] == [0]


@pytest.mark.slow
@pytest.mark.timeout(300)  # three processes start, each importing the SDK: minutes on a busy 2-core machine
# The trace context travels in the task row and the stream entry, the same on every database:
# PostgreSQL in make test, every database in make test-full.
@pytest.mark.parametrize("database_url", ["sqlite", "postgres", "mysql"] if FULL else ["postgres"], indirect=True)
async def test_one_trace_across_submitter_dispatcher_and_worker_processes(
    make_app: Any, spans: InMemorySpanExporter, database_url: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    app = flaky_app(make_app)
    with Session(app.engine) as s:
        task_id = app.submit(s, "traced.flaky", 3).id
        s.commit()
    env = {
        **os.environ,
        "DT_DATABASE_URL": database_url,
        "DT_REDIS_URL": redis_url,
        "DT_NAMESPACE": namespace,
        "DT_DATA_DIR": str(tmp_path / "data"),
        "DT_READ_BLOCK": "0.1",
    }
    files = {"dispatch": tmp_path / "dispatcher.jsonl", "work": tmp_path / "worker.jsonl"}
    for _ in range(3):
        for role in ("dispatch", "work"):
            with anyio.fail_after(60):
                await anyio.run_process(
                    [sys.executable, "-m", "tests.apps.traced_app", role, str(files[role])],
                    cwd=ROOT,
                    env=env,
                    check=True,
                    stdout=None,
                    stderr=None,
                )
    assert app.get_task(task_id).state == TaskState.SUCCEEDED
    [submit] = [r for r in records(spans) if r["name"] == "submit"]
    dispatched = [json.loads(line) for line in files["dispatch"].read_text().splitlines()]
    worked = [json.loads(line) for line in files["work"].read_text().splitlines()]
    process = [r for r in worked if r["name"] == "process traced.flaky"]
    assert len(process) == 3
    assert {r["trace_id"] for r in process} == {submit["trace_id"]}
    assert [r["links"] for r in process] == [[], [process[0]["span_id"]], [process[1]["span_id"]]]
    dispatch_spans = [r for r in dispatched if r["name"] == "dispatch"]
    assert len(dispatch_spans) == 3
    assert all(submit["trace_id"] in r["link_traces"] for r in dispatch_spans)


def metric_total(name: str, **attrs: str) -> float:
    """The sum of the points of counter ``name`` whose attributes include ``attrs``."""
    data = _READER.get_metrics_data()
    points: list[Any] = [
        p
        for rm in (data.resource_metrics if data else [])
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == name
        for p in m.data.data_points
    ]
    return float(sum(p.value for p in points if all(p.attributes.get(k) == v for k, v in attrs.items())))


async def test_unknown_tasks_held_and_handed_back_are_counted(make_app: Any) -> None:
    """docs/guarantees.md#a-task-this-process-does-not-know: dispatched{outcome=unknown_task}
    for a row the dispatcher holds, executions{outcome=unknown_task} for an entry a worker
    hands back."""
    new_release: App = make_app()
    old_release: App = make_app()

    @new_release.task(name="metered.v2", queue="metered")
    def v2(ctx: TaskContext[int], n: int) -> int:
        return n

    @old_release.task(name="metered.v1", queue="metered")
    def v1(ctx: TaskContext[int], n: int) -> int:
        return n

    held = metric_total("durable_tasks.dispatched", outcome="unknown_task", queue="metered")
    handed = metric_total("durable_tasks.executions", outcome="unknown_task", queue="metered", task="metered.v2")
    with Session(new_release.engine) as s:
        new_release.submit(s, "metered.v2", 1)
        s.commit()
    assert await old_release.dispatch_once() == 1  # held: the old release does not know metered.v2
    await wait_until(new_release.dispatch_once, what="the held row to be published", timeout=10)
    assert await old_release.work(max_tasks=1, timeout=timedelta(seconds=10)) == 1  # handed back
    assert metric_total("durable_tasks.dispatched", outcome="unknown_task", queue="metered") == held + 1
    assert (
        metric_total("durable_tasks.executions", outcome="unknown_task", queue="metered", task="metered.v2")
        == handed + 1
    )
    await old_release.aclose()
    await new_release.aclose()


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("this exception cannot say what it is")


async def test_a_failure_whose_str_raises_is_recorded_on_its_span_and_in_its_row(
    make_app: Any, spans: InMemorySpanExporter
) -> None:
    app: App = make_app()

    @app.task(name="unprintable", queue="jobs", max_attempts=1)
    async def unprintable(ctx: TaskContext[int], n: int) -> int:
        raise _Unprintable

    [handle] = submit_all(app, unprintable, [1])
    assert await app.dispatch_once() == 1
    assert await app.work(max_tasks=1, timeout=timedelta(seconds=30)) == 1
    info = app.get_task(handle.id)
    assert (info.state, info.error_message) == (TaskState.FAILED, "<_Unprintable: str() raised RuntimeError>")
    [process] = [s for s in spans.get_finished_spans() if s.name.startswith("process ")]
    assert process.status.description == "_Unprintable: <_Unprintable: str() raised RuntimeError>"
    [event] = [e for e in process.events if e.name == "exception"]
    assert event.attributes is not None
    assert event.attributes["exception.type"] == "_Unprintable"

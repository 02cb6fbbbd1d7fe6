"""OpenTelemetry spans and metrics: one trace per task, across processes and retries.

API only: the library never installs a provider; without an SDK every call here is a cheap
no-op. The ``submit`` span's W3C context is stored on the task row (and carried in the stream
entry), so the dispatcher's and every worker's spans join the submitter's trace, whichever
process or retry they come from. Payloads and results never become attributes unless the
application opts in (``Settings.trace_payloads``), and then through its redaction hook.
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from functools import partial
from typing import Any, ClassVar

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

__all__ = [
    "Telemetry",
    "context_from_traceparent",
    "link_to",
    "traceparent_of",
]

_propagator = TraceContextTextMapPropagator()
SYSTEM = "redis"
INSTRUMENTATION = "durable_tasks"
_PROVIDER_RECHECK_S = 1.0

#: What a span helper returns without tracing: reusable, nothing to set up per call.
_NO_SPAN: AbstractContextManager[Span] = nullcontext(trace.INVALID_SPAN)

#: ``redact(task_name, value) -> value``: what of a payload or result may become an attribute.
Redactor = Callable[[str, Any], Any]


def traceparent_of(span: Span) -> str | None:
    """The W3C ``traceparent`` of ``span`` (None when tracing is off)."""
    if not span.get_span_context().is_valid:  # no SDK: skip the propagator on the hot path
        return None
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent")


def context_from_traceparent(traceparent: str | None) -> otel_context.Context | None:
    """A context whose current span is the remote span named by ``traceparent``."""
    if not traceparent:
        return None
    ctx = _propagator.extract({"traceparent": traceparent})
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


def link_to(traceparent: str | None, **attributes: Any) -> list[Link]:
    """A link to the span named by ``traceparent`` (empty when there is none)."""
    ctx = context_from_traceparent(traceparent)
    if ctx is None:
        return []
    return [Link(trace.get_current_span(ctx).get_span_context(), attributes or None)]


class _QueueGauges:
    """Observable gauges shared by every App of the process (instrument names are global)."""

    _sources: ClassVar[weakref.WeakKeyDictionary[Any, str]] = weakref.WeakKeyDictionary()
    _registered = False
    _lock = threading.Lock()
    FIELDS: ClassVar[dict[str, tuple[str, str]]] = {
        "outbox_backlog": ("durable_tasks.outbox.backlog", "{delivery}"),
        "outbox_oldest_age_s": ("durable_tasks.outbox.oldest_age", "s"),
        "pel_size": ("durable_tasks.pel.size", "{entry}"),
        "oldest_pending_age_s": ("durable_tasks.pel.oldest_age", "s"),
        "queue_delay_s": ("durable_tasks.queue.delay", "s"),
        "stream_lag": ("durable_tasks.stream.lag", "{entry}"),
        "dlq_length": ("durable_tasks.dlq.length", "{entry}"),
        "running": ("durable_tasks.tasks.running", "{task}"),
    }

    @classmethod
    def register(cls, owner: Any, namespace: str) -> None:
        with cls._lock:
            cls._sources[owner] = namespace
            if cls._registered:
                return
            cls._registered = True
        meter = metrics.get_meter(INSTRUMENTATION)
        for field, (name, unit) in cls.FIELDS.items():
            meter.create_observable_gauge(name, callbacks=[partial(cls._observe, field)], unit=unit)

    @classmethod
    def _observe(cls, field: str, _options: metrics.CallbackOptions) -> list[metrics.Observation]:
        return [
            metrics.Observation(getattr(stats, field), {"queue": queue, "namespace": namespace})
            for owner, namespace in list(cls._sources.items())
            for queue, stats in owner.latest_stats.items()
        ]


class Telemetry:
    """The tracer, the instruments, and the span shapes the runtime emits."""

    def __init__(self, namespace: str, *, trace_payloads: bool = False, redact: Redactor | None = None) -> None:
        self.namespace = namespace
        self.trace_payloads = trace_payloads
        self.redact = redact
        self.tracer = trace.get_tracer(INSTRUMENTATION)
        self._tracing = False
        self._tracing_checked = -math.inf
        meter = metrics.get_meter(INSTRUMENTATION)
        self.submitted = meter.create_counter("durable_tasks.submitted", unit="{task}", description="Tasks submitted")
        self.dispatched = meter.create_counter(
            "durable_tasks.dispatched", unit="{delivery}", description="Outbox rows handled by outcome"
        )
        self.executions = meter.create_counter(
            "durable_tasks.executions", unit="{attempt}", description="Execution attempts by outcome"
        )
        self.fenced_out = meter.create_counter(
            "durable_tasks.fenced_out", unit="{attempt}", description="Results or failures refused by the fence"
        )
        self.reclaimed = meter.create_counter(
            "durable_tasks.reclaimed", unit="{delivery}", description="Deliveries recovered by the reaper"
        )
        self.dead_lettered = meter.create_counter(
            "durable_tasks.dead_lettered", unit="{task}", description="Tasks moved to the DLQ"
        )
        self.queue_delay = meter.create_histogram(
            "durable_tasks.queue_delay", unit="s", description="Submit to execution start"
        )
        self.execution_time = meter.create_histogram(
            "durable_tasks.execution_time", unit="s", description="Handler run time per attempt"
        )
        self.end_to_end = meter.create_histogram(
            "durable_tasks.end_to_end", unit="s", description="Submit to result commit"
        )
        self.dispatch_lag = meter.create_histogram(
            "durable_tasks.dispatch_lag", unit="s", description="Outbox row creation to publish"
        )
        self.meter = meter

    def observe_queues(self, owner: Any) -> None:
        """Report ``owner.latest_stats`` (the runtime's per-queue stats from the last
        :func:`~.stats.queue_stats`, which every reaper pass and ``App.stats()`` refresh) as
        gauges; registered once per process, reading every live runtime."""
        _QueueGauges.register(owner, self.namespace)

    @property
    def tracing(self) -> bool:
        """Whether the application installed a tracer provider (without one, skip span work).

        Asked several times per task: a "no" is re-checked at most once a second (the check
        reads the environment), a "yes" is final (a provider, once set, stays).
        """
        if not self._tracing:
            now = time.monotonic()
            if now - self._tracing_checked >= _PROVIDER_RECHECK_S:
                self._tracing_checked = now
                provider = trace.get_tracer_provider()
                self._tracing = not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)
        return self._tracing

    def _base(self, queue: str) -> dict[str, Any]:
        return {
            "messaging.system": SYSTEM,
            "messaging.destination.name": queue,
            "durable_tasks.namespace": self.namespace,
        }

    def payload_attributes(self, task_name: str, key: str, value: Any) -> dict[str, Any]:
        """``durable_tasks.<key>`` for a payload or result, only when the app opted in."""
        if not self.trace_payloads:
            return {}
        shown = self.redact(task_name, value) if self.redact else value
        return {f"durable_tasks.{key}": str(shown)[:2048]}

    @contextmanager
    def submit_span(self, task_name: str, queue: str) -> Iterator[Span]:
        """The ``submit`` span, inside the caller's transaction."""
        if not self.tracing:
            yield trace.INVALID_SPAN
            return
        attrs = self._base(queue) | {"messaging.operation.type": "create", "durable_tasks.task.name": task_name}
        with self.tracer.start_as_current_span("submit", kind=SpanKind.PRODUCER, attributes=attrs) as span:
            yield span

    @contextmanager
    def dispatch_span(self, traceparents: Sequence[str | None]) -> Iterator[Span]:
        """One ``dispatch`` span per batch, linked to each task's submit span."""
        if not self.tracing:
            yield trace.INVALID_SPAN
            return
        links = [link for tp in traceparents for link in link_to(tp)]
        attrs: dict[str, Any] = {
            "durable_tasks.namespace": self.namespace,
            "messaging.batch.message_count": len(traceparents),
        }
        with self.tracer.start_as_current_span("dispatch", links=links, attributes=attrs) as span:
            yield span

    @contextmanager
    def publish_span(self, queue: str, count: int) -> Iterator[Span]:
        """``publish <queue>``: the pipelined round trip to Redis."""
        if not self.tracing:
            yield trace.INVALID_SPAN
            return
        attrs = self._base(queue) | {"messaging.operation.type": "send", "messaging.batch.message_count": count}
        with self.tracer.start_as_current_span(f"publish {queue}", kind=SpanKind.PRODUCER, attributes=attrs) as span:
            yield span

    def start_process_span(
        self, task_name: str, queue: str, traceparent: str | None, attributes: Mapping[str, Any]
    ) -> Span:
        """Start ``process <task>`` (one attempt, a child of the submit span); the caller ends it."""
        parent = context_from_traceparent(traceparent)
        attrs = self._base(queue) | {"messaging.operation.type": "process"} | dict(attributes)
        return self.tracer.start_span(f"process {task_name}", context=parent, kind=SpanKind.CONSUMER, attributes=attrs)

    def commit_span(self) -> AbstractContextManager[Span]:
        """``commit``: the fenced final write (attribute ``durable_tasks.fenced_out``)."""
        if not self.tracing:
            return _NO_SPAN  # once per task: no generator-based context manager for nothing
        return self.tracer.start_as_current_span("commit")

    @staticmethod
    def current(span: Span) -> AbstractContextManager[Span]:
        """Make ``span`` the current span for the block (what starts inside nests under it);
        for the invalid span of an untraced run, nothing to do."""
        if span is trace.INVALID_SPAN:
            return _NO_SPAN
        return trace.use_span(span, end_on_exit=False)

    def task_event(self, name: str, traceparent: str | None, queue: str, attributes: Mapping[str, Any]) -> None:
        """A short span in the task's trace carrying one event (reaper reclaim, DLQ move)."""
        if not self.tracing:
            return
        parent = context_from_traceparent(traceparent)
        with self.tracer.start_as_current_span(name, context=parent, attributes=self._base(queue)) as span:
            span.add_event(name, dict(attributes))

    @staticmethod
    def record_failure(span: Span, exc: BaseException, message: str) -> None:
        """Record an exception on the attempt span and mark it failed; ``message`` is what the
        runtime made of ``str(exc)`` (:class:`~durable_tasks.failures.Failure`), which may raise."""
        try:
            span.record_exception(exc)
        except Exception:  # its str() raised: the event without the exception's own text
            span.add_event("exception", {"exception.type": type(exc).__qualname__, "exception.message": message})
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {message}"[:200]))

"""What each step leaves behind: an OpenTelemetry span, a JSON-lines record, metrics, and
(sampled, off by default) its full payloads in the debug log.

Spans go to this process's tracer provider (`provider()`); nothing is exported unless a
pipeline names an `otlp_endpoint` or a caller adds a span processor (tests add an in-memory
exporter); until one does, a span is only its ids (trace id, span id, the caller's trace).
A caller's W3C `traceparent` makes the pipeline's root span its child.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("podium.pipeline")
debug_log = logging.getLogger("podium.pipeline.debug")

_provider: Any = None
_exporting: set[str] = set()
_recording = False
"""Whether anything receives spans (a processor was added): until then a request's spans
are ids only (no SDK span objects; those were a fifth of a busy pipeline's own cost)."""
_lock = threading.Lock()


def provider() -> Any:
    """The process's tracer provider (an SDK one, created on first use)."""
    global _provider
    with _lock:
        if _provider is None:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider

            _provider = TracerProvider(resource=Resource.create({"service.name": "podium"}))
        return _provider


def add_span_processor(processor: Any) -> None:
    """Send every pipeline span to `processor` as well (an exporter's processor)."""
    global _recording
    provider().add_span_processor(processor)
    _recording = True


def export_otlp(endpoint: str) -> None:
    """Export spans over OTLP/HTTP to `endpoint` (once per endpoint per process)."""
    with _lock:
        if endpoint in _exporting:
            return
        _exporting.add(endpoint)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))


@dataclass
class StepRecord:
    """One JSON line per step."""

    request_id: str
    pipeline: str
    version: str
    step: str
    kind: str
    duration_ms: float
    outcome: str
    variant: str
    fallback: str | None = None
    error: str | None = None
    sizes: dict[str, int] = field(default_factory=dict)


@dataclass
class Tracing:
    """Per pipeline: where records go and how often payloads are logged."""

    pipeline: str
    version: str
    trace_log: Path | None = None
    debug_sample_rate: float = 0.0
    _file_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _tracer: Any = field(default=None, repr=False)

    def tracer(self) -> Any:
        if self._tracer is None:  # get_tracer builds a new tracer object on every call
            self._tracer = provider().get_tracer("podium.pipelines")
        return self._tracer

    @contextmanager
    def request_span(self, request_id: str, traceparent: str | None) -> Iterator[Any]:
        """The pipeline's root span, a child of the caller's trace when one is given."""
        from opentelemetry import trace as trace_api
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        parent = (TraceContextTextMapPropagator().extract({"traceparent": traceparent})
                  if traceparent else None)
        if not _recording:
            caller = trace_api.get_current_span(parent).get_span_context() if parent else None
            span = _unrecorded(caller)
            with trace_api.use_span(span, end_on_exit=False):
                yield span
            return
        with self.tracer().start_as_current_span(
                f"pipeline {self.pipeline}", context=parent,
                attributes={"podium.pipeline": self.pipeline, "podium.version": self.version,
                            "podium.request_id": request_id}) as span:
            yield span

    @contextmanager
    def step_span(self, step: str, kind: str) -> Iterator[Any]:
        if not _recording:
            from opentelemetry import trace as trace_api

            yield _unrecorded(trace_api.get_current_span().get_span_context())
            return
        with self.tracer().start_as_current_span(
                f"step {step}", attributes={"podium.step": step, "podium.kind": kind}) as span:
            yield span

    def sampled(self) -> bool:
        return self.debug_sample_rate > 0 and random.random() < self.debug_sample_rate

    def record(self, record: StepRecord, span: Any, result: Any = None) -> None:
        """Span attributes and metrics always; the JSON line (with `result`'s sizes) where it
        goes somewhere: `trace_log`, and the `podium.pipeline` logger, at INFO for a step
        that failed or timed out and at DEBUG otherwise (one INFO line per step per request
        was the largest cost of a busy pipeline after its own work)."""
        from podium.metrics.pipeline import observe_step

        span.set_attribute("podium.outcome", record.outcome)
        span.set_attribute("podium.variant", record.variant)
        observe_step(record.pipeline, record.step, record.variant, record.outcome,
                     record.duration_ms / 1000)
        level = logging.INFO if record.outcome in ("error", "timeout") else logging.DEBUG
        logged = log.isEnabledFor(level)
        if not logged and self.trace_log is None:
            return
        record.sizes = size_of(result)
        line = json.dumps(record.__dict__, separators=(",", ":"), default=str)
        if logged:
            log.log(level, line)
        if self.trace_log is not None:
            with self._file_lock, self.trace_log.open("a", encoding="utf-8") as out:
                out.write(line + "\n")

    def debug(self, request_id: str, step: str, args: Any, result: Any) -> None:
        debug_log.info(json.dumps({"request_id": request_id, "pipeline": self.pipeline,
                                   "step": step, "args": args, "result": result},
                                  default=str))


def traceparent_of(span: Any) -> str | None:
    """The W3C traceparent of `span` (to pass on to a model call), None if it has none."""
    context = span.get_span_context()
    if not context.is_valid:
        return None
    return (f"00-{context.trace_id:032x}-{context.span_id:016x}-"
            f"{int(context.trace_flags):02x}")


def _unrecorded(parent: Any | None) -> Any:
    """A span that is only its ids: a child of `parent` (a span context), or a new trace
    marked sampled (a downstream pipeline that exports records its part, as before)."""
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    if parent is not None and parent.is_valid:
        trace_id, flags = parent.trace_id, parent.trace_flags
    else:
        trace_id, flags = random.getrandbits(128) or 1, TraceFlags(TraceFlags.SAMPLED)
    return NonRecordingSpan(SpanContext(trace_id, random.getrandbits(64) or 1,
                                        is_remote=False, trace_flags=flags))


def size_of(value: Any) -> dict[str, int]:
    """Sizes worth a record: items of a list result, bytes of the JSON."""
    sizes = {"bytes": len(json.dumps(value, default=str))} if value is not None else {}
    items = value.get("items") if isinstance(value, dict) else value
    if isinstance(items, list):
        sizes["items"] = len(items)
    return sizes


def now() -> float:
    return time.perf_counter()

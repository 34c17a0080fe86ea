"""A fake pipeline instance on loopback: its /metrics is a registry holding the real
`podium:pipeline_step_*` families (same names, labels and buckets), which a test fills."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

LABELS = ("pipeline", "step", "variant", "outcome")
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300)
"""podium.metrics.server's (not imported here: it prepares a multiprocess directory)."""


class StepMetrics:
    """The pipeline step families in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.steps = Counter("podium:pipeline_step", "steps", LABELS, registry=self.registry)
        self.duration = Histogram("podium:pipeline_step_duration_seconds", "duration", LABELS,
                                  buckets=LATENCY_BUCKETS, registry=self.registry)

    def observe(self, step: str, variant: str, outcome: str, seconds: float,
                pipeline: str = "recs") -> None:
        self.steps.labels(pipeline, step, variant, outcome).inc()
        self.duration.labels(pipeline, step, variant, outcome).observe(seconds)


@contextmanager
def fake_pipeline_instance(metrics: StepMetrics) -> Iterator[str]:
    """Serve `metrics` at /metrics; yields the instance's base URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = generate_latest(metrics.registry) if self.path == "/metrics" else b""
            self.send_response(200 if body else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()

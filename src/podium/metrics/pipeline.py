"""`podium:pipeline_step_*`: one series per pipeline, step, variant and outcome.

Labels are closed sets: steps and variants are declared in the pipeline package, outcomes are
OUTCOMES. Import after `prepare_multiproc_dir()` (as `metrics.server`).
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from podium.metrics.server import LATENCY_BUCKETS, REGISTRY

OUTCOMES = ("ok", "not_run", "timeout", "error")
"""ok: answered; not_run: gated off for this request's variant; timeout / error: its fallback
answered (skip or default) or the request failed (fail)."""
LABELS = ("pipeline", "step", "variant", "outcome")

STEPS = Counter(
    "podium:pipeline_step",
    "Pipeline steps run, by pipeline, step, experiment variant and outcome.",
    LABELS,
    registry=REGISTRY,
)
STEP_DURATION = Histogram(
    "podium:pipeline_step_duration_seconds",
    "Time one pipeline step took (its fallback included).",
    LABELS,
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)


def observe_step(pipeline: str, step: str, variant: str, outcome: str, seconds: float) -> None:
    """Count one step and its duration."""
    STEPS.labels(pipeline, step, variant, outcome).inc()
    STEP_DURATION.labels(pipeline, step, variant, outcome).observe(seconds)

"""Target for a spawned child that writes engine-like metrics to the multiprocess directory."""

from __future__ import annotations


def write_engine_metrics() -> None:
    """Record a gauge and a counter the way vLLM's PrometheusStatLogger does."""
    from prometheus_client import Counter, Gauge

    labels = ["model_name", "engine"]
    running = Gauge("vllm:num_requests_running", "x", labels, multiprocess_mode="mostrecent")
    running.labels("smol", "0").set(3)
    Counter("vllm:generation_tokens", "x", labels).labels("smol", "0").inc(40)

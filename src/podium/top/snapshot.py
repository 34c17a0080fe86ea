"""One scrape of an instance's /metrics, reduced to what `podium top` shows."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

REQUESTS = "podium:requests_total"
ENGINE_FINISHED = "vllm:request_success_total"
GENERATED = "vllm:generation_tokens_total"
PROMPT = "vllm:prompt_tokens_total"
TTFT_BUCKETS = "vllm:time_to_first_token_seconds_bucket"
KV_CACHE = "vllm:kv_cache_usage_perc"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
READY = "podium:ready"
LOADED = "podium:model_loaded"


@dataclass
class Snapshot:
    """Totals at one instant, summed over every label set (models, engines, protocols)."""

    taken_at: float
    requests: float = 0.0
    generated_tokens: float = 0.0
    prompt_tokens: float = 0.0
    ttft_buckets: dict[float, float] = field(default_factory=dict)  # upper bound -> cumulative
    kv_cache_perc: float | None = None  # the fullest engine's, 0-1
    running: float = 0.0
    waiting: float = 0.0
    ready: bool | None = None
    requests_by_model: dict[str, float] = field(default_factory=dict)
    """Podium's answered requests per `model` label (a LoRA adapter's under its own name)."""
    loaded: frozenset[str] = frozenset()
    """Models the instance has loaded; one answered but not loaded is an adapter on them."""


def parse(text: str, taken_at: float) -> Snapshot:
    """Reduce a Prometheus text exposition to a Snapshot."""
    totals: dict[str, float] = defaultdict(float)
    buckets: dict[float, float] = defaultdict(float)
    kv: list[float] = []
    ready: bool | None = None
    by_model: dict[str, float] = defaultdict(float)
    loaded: set[str] = set()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == REQUESTS and "model" in s.labels:
                by_model[s.labels["model"]] += s.value
            if s.name == LOADED and s.value >= 1 and "model" in s.labels:
                loaded.add(s.labels["model"])
            if s.name == TTFT_BUCKETS:
                buckets[float(s.labels["le"])] += s.value
            elif s.name == KV_CACHE:
                kv.append(s.value)
            elif s.name == READY:
                ready = s.value >= 1
            else:
                totals[s.name] += s.value
    # Instances without podium's server metrics (a bare vLLM) still count finished requests.
    requests = totals[REQUESTS] if REQUESTS in totals else totals[ENGINE_FINISHED]
    return Snapshot(
        taken_at=taken_at,
        requests=requests,
        generated_tokens=totals[GENERATED],
        prompt_tokens=totals[PROMPT],
        ttft_buckets=dict(sorted(buckets.items())),
        kv_cache_perc=max(kv) if kv else None,
        running=totals[RUNNING],
        waiting=totals[WAITING],
        ready=ready,
        requests_by_model=dict(by_model),
        loaded=frozenset(loaded),
    )


def scrape(client: httpx.Client, url: str) -> Snapshot:
    """GET one /metrics URL (Prometheus text) and parse it."""
    response = client.get(url, headers={"Accept": "text/plain"})
    response.raise_for_status()
    return parse(response.text, time.monotonic())

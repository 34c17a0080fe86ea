"""`GET /v1/pipelines?model=M`: each pipeline version's steps as the console shows them (requests,
outcomes, mean/p50/p99 latency, the experiment's variant split), read from the ready instances'
own `/metrics` (`podium:pipeline_step_*`, see `podium.metrics.pipeline`).

Totals since each instance started, summed over the version's ready instances. However many
consoles poll, an instance is scraped at most once per `interval_s`; a failed scrape leaves its
last reading standing until it is no longer ready.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Annotated, Any

import httpx
from fastapi import FastAPI, Query

from podium.control.engine_api import wanted_versions
from podium.control.runtime.base import READY, InstanceView
from podium.control.store import Store
from podium.top.stats import quantile

STEPS = "podium:pipeline_step_total"
BUCKETS = "podium:pipeline_step_duration_seconds_bucket"
SECONDS = "podium:pipeline_step_duration_seconds_sum"
PIPELINE_BACKENDS = ("pipeline",)

Reading = dict[str, Any]
"""Per step: outcomes {outcome: n}, variants {variant: n}, buckets {le: n}, seconds."""


def parse(text: str) -> dict[str, Reading]:
    """One instance's step totals from its Prometheus text exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    steps: dict[str, Reading] = {}

    def step(labels: dict[str, str]) -> Reading:
        return steps.setdefault(labels["step"], {"outcomes": defaultdict(float),
                                                 "variants": defaultdict(float),
                                                 "buckets": defaultdict(float), "seconds": 0.0})
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if "step" not in s.labels:
                continue
            if s.name == STEPS:
                r = step(s.labels)
                r["outcomes"][s.labels.get("outcome", "")] += s.value
                r["variants"][s.labels.get("variant", "")] += s.value
            elif s.name == BUCKETS:
                step(s.labels)["buckets"][float(s.labels["le"])] += s.value
            elif s.name == SECONDS:
                step(s.labels)["seconds"] += s.value
    return steps


def summarize(readings: list[dict[str, Reading]]) -> dict[str, Any]:
    """The console's shape: per step (in the order first seen) its figures, and the variant
    split (requests per variant of the first step: every step counts every request once,
    `not_run` included)."""
    merged: dict[str, Reading] = {}
    for reading in readings:
        for name, r in reading.items():
            into = merged.setdefault(name, {"outcomes": defaultdict(float),
                                            "variants": defaultdict(float),
                                            "buckets": defaultdict(float), "seconds": 0.0})
            for key in ("outcomes", "variants", "buckets"):
                for label, n in r[key].items():
                    into[key][label] += n
            into["seconds"] += r["seconds"]
    steps = []
    for name, r in merged.items():
        n = sum(r["outcomes"].values())
        p50, p99 = quantile(0.5, r["buckets"]), quantile(0.99, r["buckets"])
        steps.append({"step": name, "num_requests": int(n),
                      "outcomes": {k: int(v) for k, v in sorted(r["outcomes"].items())},
                      "variants": {k: int(v) for k, v in sorted(r["variants"].items())},
                      "mean_ms": r["seconds"] * 1000 / n if n else None,
                      "p50_ms": None if p50 is None else p50 * 1000,
                      "p99_ms": None if p99 is None else p99 * 1000})
    variants = steps[0]["variants"] if steps else {}
    return {"steps": steps, "variants": variants}


class PipelineFigures:
    """Scrapes a pipeline version's ready instances on demand, at a bounded rate."""

    def __init__(self, instances: Callable[[str, str], list[InstanceView]],
                 client: httpx.Client, *, interval_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.instances = instances
        self.client = client
        """Carries the plane's credential and a short timeout."""
        self.interval_s = interval_s
        self.clock = clock
        self._kept: dict[str, dict[str, Reading]] = {}
        self._tried: dict[str, float] = {}
        self._lock = threading.Lock()

    def read(self, model: str, version: str) -> dict[str, Any]:
        """model@version's step figures now."""
        with self._lock:
            ready = [i for i in self.instances(model, version) if i.state == READY and i.url]
            readings = [r for r in (self._reading(i) for i in ready) if r is not None]
        return {"num_ready": len(ready), "num_read": len(readings), **summarize(readings)}

    def _reading(self, instance: InstanceView) -> dict[str, Reading] | None:
        now = self.clock()
        if now - self._tried.get(instance.id, -float("inf")) >= self.interval_s:
            self._tried[instance.id] = now
            try:
                r = self.client.get(instance.url.rstrip("/") + "/metrics")
                r.raise_for_status()
                self._kept[instance.id] = parse(r.text)
            except (httpx.HTTPError, ValueError):
                pass  # unread this time: the last reading stands
        return self._kept.get(instance.id)


def add_pipeline_routes(app: FastAPI, store: Store, figures: PipelineFigures, *,
                        region: str | None = None, prefix: str = "") -> None:
    """Serve a region's pipeline step figures on the control API `app` (under `prefix`)."""
    pipeline_versions = wanted_versions(store, region, PIPELINE_BACKENDS)

    @app.get(prefix + "/v1/pipelines")
    def pipelines(model: Annotated[str, Query(pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$",
                                              description="The model.")]) -> dict[str, Any]:
        """Per pipeline version of `model` with instances wanted: its steps' figures now."""
        return {"model": model,
                "versions": {v: figures.read(model, v) for v in pipeline_versions(model)}}

"""The LLM figures the console shows per version: tokens/s, TTFT p50/p99, KV cache, queue.

Read from each ready instance's own `/metrics` (vLLM's counters and TTFT histogram) with
`podium top`'s parser and arithmetic (`podium.top`): rates and quantiles between an instance's
last two scrapes, summed (quantiles merged) over the version's instances. However many consoles
poll, an instance is scraped at most once per `interval_s`; a failed scrape leaves its last two
readings standing (it is not a zero) until it is no longer ready.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from podium.control.runtime.base import READY, InstanceView
from podium.top import stats
from podium.top.snapshot import Snapshot, scrape

Pair = tuple[Snapshot | None, Snapshot]


class EngineFigures:
    """Scrapes an LLM version's ready instances on demand, at a bounded rate."""

    def __init__(self, instances: Callable[[str, str], list[InstanceView]],
                 client: httpx.Client, *, interval_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.instances = instances
        """The runtime's instances of model@version."""
        self.client = client
        """Carries the plane's credential and a short timeout."""
        self.interval_s = interval_s
        self.clock = clock
        self._kept: dict[tuple[str, str], dict[str, Pair]] = {}
        """Per model@version, each ready instance's last two readings."""
        self._tried: dict[str, float] = {}
        self._lock = threading.Lock()

    def read(self, model: str, version: str) -> dict[str, Any]:
        """model@version's figures now (None where there is nothing to show yet)."""
        with self._lock:
            ready = [i for i in self.instances(model, version) if i.state == READY and i.url]
            kept = self._kept.setdefault((model, version), {})
            for gone in set(kept) - {i.id for i in ready}:  # stopped, or not ready now
                kept.pop(gone)
                self._tried.pop(gone, None)
            pairs = [p for p in (self._pair(kept, i) for i in ready) if p is not None]
        row = stats.total(pairs) if pairs else None
        return {"num_ready": len(ready), "num_read": len(pairs),
                "generated_per_s": row and row.generated_per_s,
                "prompt_per_s": row and row.prompt_per_s,
                "ttft_p50_ms": _ms(row and row.ttft_p50_s),
                "ttft_p99_ms": _ms(row and row.ttft_p99_s),
                "kv_cache_usage": row and row.kv_cache_perc,
                "running": row and row.running, "waiting": row and row.waiting}

    def _pair(self, kept: dict[str, Pair], instance: InstanceView) -> Pair | None:
        now = self.clock()
        if now - self._tried.get(instance.id, -float("inf")) >= self.interval_s:
            self._tried[instance.id] = now
            try:
                after = scrape(self.client, instance.url.rstrip("/") + "/metrics")
            except (httpx.HTTPError, ValueError):
                return kept.get(instance.id)  # unread this time: the last readings stand
            before = kept.get(instance.id)
            kept[instance.id] = (before[1] if before else None, after)
        return kept.get(instance.id)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000

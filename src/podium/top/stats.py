"""Rates and latency quantiles between two snapshots, the way PromQL computes them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from podium.top.snapshot import Snapshot


@dataclass(frozen=True)
class Row:
    """What one line of `podium top` shows; None where there is nothing to show yet."""

    requests_per_s: float | None
    generated_per_s: float | None
    prompt_per_s: float | None
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    kv_cache_perc: float | None
    running: float
    waiting: float
    ready: bool | None


@dataclass(frozen=True)
class AdapterRow:
    """A LoRA adapter's line under the instance of its base: requests it answered."""

    requests_per_s: float | None


def adapter_rows(before: Snapshot | None, after: Snapshot) -> list[tuple[str, AdapterRow]]:
    """One line per adapter the instance answered (a model it has not loaded), by name."""
    if not after.loaded:
        return []
    dt = after.taken_at - before.taken_at if before is not None else 0.0
    rows = []
    for model, count in sorted(after.requests_by_model.items()):
        if model in after.loaded:
            continue
        seen = before.requests_by_model.get(model, 0.0) if before is not None else None
        rows.append((model, AdapterRow(rate(seen, count, dt) if seen is not None and dt > 0
                                       else None)))
    return rows


def rate(before: float, after: float, seconds: float) -> float:
    """Per-second increase of a counter; a drop means the instance restarted (count from 0)."""
    increase = after - before if after >= before else after
    return increase / seconds


def bucket_increase(
    before: Mapping[float, float], after: Mapping[float, float]
) -> dict[float, float]:
    """Cumulative bucket counts observed between two scrapes (reset-aware per bucket)."""
    return {
        le: (v - before.get(le, 0.0) if v >= before.get(le, 0.0) else v) for le, v in after.items()
    }


def quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """histogram_quantile over cumulative buckets {upper bound: count}; None without data."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    total = buckets[bounds[-1]]
    rank = q * total
    lower, below = 0.0, 0.0
    for upper in bounds:
        count = buckets[upper]
        if count >= rank:
            if math.isinf(upper):
                return lower  # beyond the last finite bound: the best we know is that bound
            if count == below:
                return upper
            return lower + (upper - lower) * (rank - below) / (count - below)
        lower, below = upper, count
    return lower


def row(before: Snapshot | None, after: Snapshot) -> Row:
    """The line for one instance from its last two snapshots."""
    if before is None or after.taken_at <= before.taken_at:
        return Row(
            None,
            None,
            None,
            None,
            None,
            after.kv_cache_perc,
            after.running,
            after.waiting,
            after.ready,
        )
    dt = after.taken_at - before.taken_at
    ttft = bucket_increase(before.ttft_buckets, after.ttft_buckets)
    return Row(
        requests_per_s=rate(before.requests, after.requests, dt),
        generated_per_s=rate(before.generated_tokens, after.generated_tokens, dt),
        prompt_per_s=rate(before.prompt_tokens, after.prompt_tokens, dt),
        ttft_p50_s=quantile(0.5, ttft),
        ttft_p99_s=quantile(0.99, ttft),
        kv_cache_perc=after.kv_cache_perc,
        running=after.running,
        waiting=after.waiting,
        ready=after.ready,
    )


def total(pairs: list[tuple[Snapshot | None, Snapshot]]) -> Row:
    """One line for all instances: rates and queues summed, TTFT over the merged buckets."""
    rows = [row(b, a) for b, a in pairs]
    merged: dict[float, float] = {}
    for before, after in pairs:
        if before is None:
            continue
        for le, v in bucket_increase(before.ttft_buckets, after.ttft_buckets).items():
            merged[le] = merged.get(le, 0.0) + v

    def add(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return sum(known) if known else None

    kv = [r.kv_cache_perc for r in rows if r.kv_cache_perc is not None]
    readies = [r.ready for r in rows if r.ready is not None]
    return Row(
        requests_per_s=add([r.requests_per_s for r in rows]),
        generated_per_s=add([r.generated_per_s for r in rows]),
        prompt_per_s=add([r.prompt_per_s for r in rows]),
        ttft_p50_s=quantile(0.5, merged),
        ttft_p99_s=quantile(0.99, merged),
        kv_cache_perc=max(kv) if kv else None,
        running=sum(r.running for r in rows),
        waiting=sum(r.waiting for r in rows),
        ready=all(readies) if readies else None,
    )

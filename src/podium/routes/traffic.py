"""Per-version traffic over the last minutes, in time buckets: what the console charts.

Read from the same outcomes the rollout analysis judges (`VersionStats`, fed by every gateway's
reports): per bucket the requests, the errors and the latency quantiles, computed exactly from
the requests' own latencies (no histogram buckets to interpolate between).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from podium.routes.stats import Outcome, VersionStats


@dataclass(frozen=True)
class Bucket:
    """One time bucket of one version's traffic."""

    start_ms: int
    num_requests: int
    num_errors: int
    p50_ms: float | None
    p99_ms: float | None


def quantile(sorted_ms: list[float], q: float) -> float | None:
    """The nearest-rank `q` quantile of sorted latencies (None when there are none)."""
    if not sorted_ms:
        return None
    return sorted_ms[min(len(sorted_ms) - 1, max(0, math.ceil(q * len(sorted_ms)) - 1))]


RECENT_MS = 60_000
"""The headline figures cover the last minute (the buckets are too short to read alone)."""


def series(stats: VersionStats, model: str, *, now_ms: int, span_ms: int,
           step_ms: int) -> dict[str, dict[str, object]]:
    """Per version of `model`: buckets of `step_ms` over the last `span_ms` (oldest first,
    empty ones included, the last one still filling), the whole span's totals and the last
    minute's (`recent`)."""
    num = max(1, math.ceil(span_ms / step_ms))
    first_ms = now_ms - num * step_ms
    out: dict[str, dict[str, object]] = {}
    for version, outcomes in stats.outcomes(model, since_ms=first_ms).items():
        slots: list[list[Outcome]] = [[] for _ in range(num)]
        for o in outcomes:
            index = (o.at_ms - first_ms) // step_ms
            if 0 <= index < num:
                slots[index].append(o)
        buckets = [_bucket(first_ms + i * step_ms, slot) for i, slot in enumerate(slots)]
        whole = _bucket(first_ms, [o for slot in slots for o in slot])
        recent = _bucket(now_ms - RECENT_MS, [o for o in outcomes
                                              if o.at_ms >= now_ms - RECENT_MS])
        out[version] = {"buckets": [b.__dict__ for b in buckets], "total": whole.__dict__,
                        "recent": recent.__dict__}
    return out


def _bucket(start_ms: int, outcomes: list[Outcome]) -> Bucket:
    latencies = sorted(o.latency_ms for o in outcomes)
    return Bucket(start_ms, len(outcomes), sum(1 for o in outcomes if not o.ok),
                  quantile(latencies, 0.50), quantile(latencies, 0.99))

"""Percentiles, one definition for every bench: linear interpolation between the closest
ranks (numpy's default), NaN for no values."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def percentile(values: Iterable[float], q: float) -> float:
    """The `q`-th percentile (0-100) of `values`."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median(values: Iterable[float]) -> float:
    return percentile(values, 50)


def percentiles(values: Sequence[float], qs: Iterable[float] = (50, 90, 99)
                ) -> dict[str, float]:
    """{"p50": ..., "p90": ..., "p99": ...} of `values`."""
    return {f"p{q:g}": percentile(values, q) for q in qs}

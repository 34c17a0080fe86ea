"""Per-model inference statistics in Triton's shape (`/v2/models/{m}/stats`, ModelStatistics)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Duration:
    """A count of events and the nanoseconds they took together."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int) -> None:
        self.count += 1
        self.ns += ns

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class ModelStats:
    """What one loaded model version has served since it loaded."""

    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    inference_count: int = 0
    """Inferences served: the sum of request batch sizes."""
    last_inference_ms: int = 0

    def record(self, *, ok: bool, duration_ns: int, batch_size: int) -> None:
        """Count one finished request."""
        (self.success if ok else self.fail).add(duration_ns)
        if ok:
            self.inference_count += batch_size
        self.last_inference_ms = int(time.time() * 1000)

    def as_triton(self, name: str, version: str, *, execution_count: int | None = None,
                  batch_stats: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """One entry of Triton's `model_stats` list."""
        empty = {"count": 0, "ns": 0}
        return {
            "name": name,
            "version": version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": (self.success.count if execution_count is None
                                else execution_count),
            "inference_stats": {
                "success": self.success.as_dict(),
                "fail": self.fail.as_dict(),
                # time is measured end to end; queue and compute are not told apart yet
                "queue": empty, "compute_input": empty, "compute_infer": empty,
                "compute_output": empty, "cache_hit": empty, "cache_miss": empty,
            },
            "batch_stats": batch_stats or [],
        }

"""Per-version request outcomes the rollout analysis reads: count, errors, p99 latency.

The gateway's event loop records outcomes while the control loop's thread reads them: every
access to a window holds one lock, and a reader copies the window before it looks at it.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass

MAX_SAMPLES = 100_000


@dataclass(frozen=True)
class VersionHealth:
    """What was observed of one version: the gateway fills the request fields, the control
    plane adds readiness and crashes from its runtime, and the rollout judges the result."""

    num_ready: int = 0
    """Instances answering ready now."""
    num_crashes: int = 0
    """Crashes of this version's instances since the control plane started counting."""
    num_requests: int = 0
    """Requests answered since the current analysis window began (shed ones are not: overload
    is no evidence about the version)."""
    num_errors: int = 0
    """Of those, how many failed (5xx or connection error), including those the gateway then
    sent to the stable version."""
    p99_ms: float | None = None
    """p99 latency of those requests; None without requests."""

    def figures(self) -> str:
        """The numbers a verdict rests on, for its note: `40 requests, 1 error, p99 12.5 ms`."""
        p99 = "" if self.p99_ms is None else f", p99 {self.p99_ms:.1f} ms"
        errors = "1 error" if self.num_errors == 1 else f"{self.num_errors} errors"
        return f"{self.num_requests} requests, {errors}{p99}"


@dataclass(frozen=True)
class Outcome:
    """One finished request."""

    at_ms: int
    latency_ms: float
    ok: bool


class VersionStats:
    """A bounded window of outcomes per (model, version)."""

    def __init__(self, max_samples: int = MAX_SAMPLES) -> None:
        self._samples: dict[tuple[str, str], deque[Outcome]] = {}
        self._max = max_samples
        # lifetime totals for /metrics: (requests, errors, seconds) per (model, version)
        self.totals: dict[tuple[str, str], list[float]] = {}
        self.shed: dict[tuple[str, str, str], int] = {}
        """Requests answered 429 without being served, per (model, version, by whom)."""
        self.retried: dict[tuple[str, str, str], int] = {}
        """Requests sent again after failing on (model, version), per reason."""
        self.prefix_picks: dict[tuple[str, str, str], int] = {}
        """Instances picked by prefix cache, per (model, version, outcome)."""
        self._lock = threading.Lock()

    def record(self, model: str, version: str, outcome: Outcome) -> None:
        """Count one finished request (error: 5xx or connection failure)."""
        key = (model, version)
        with self._lock:
            if key not in self._samples:
                self._samples[key] = deque(maxlen=self._max)
            self._samples[key].append(outcome)
            total = self.totals.setdefault(key, [0, 0, 0.0])
            total[0] += 1
            total[1] += 0 if outcome.ok else 1
            total[2] += outcome.latency_ms / 1000

    def record_shed(self, model: str, version: str, by: str) -> None:
        """Count one request shed for model@version (`gateway` or `instance`); the analysis
        never sees it: overload says nothing about whether the version works."""
        with self._lock:
            key = (model, version, by)
            self.shed[key] = self.shed.get(key, 0) + 1

    def record_retry(self, model: str, version: str, reason: str) -> None:
        """Count one request sent again after failing on model@version."""
        with self._lock:
            key = (model, version, reason)
            self.retried[key] = self.retried.get(key, 0) + 1

    def record_prefix_pick(self, model: str, version: str, outcome: str) -> None:
        """Count one instance picked by prefix (`gateway.prefix_router`'s outcome)."""
        with self._lock:
            key = (model, version, outcome)
            self.prefix_picks[key] = self.prefix_picks.get(key, 0) + 1

    def last_request_ms(self, model: str, version: str) -> int:
        """When model@version last finished a request (0: never)."""
        with self._lock:
            samples = self._samples.get((model, version))
            return samples[-1].at_ms if samples else 0

    def outcomes(self, model: str, *, since_ms: int) -> dict[str, list[Outcome]]:
        """Per version of `model`, its outcomes since `since_ms` (copies, oldest first)."""
        with self._lock:
            kept = {v: list(d) for (m, v), d in self._samples.items() if m == model}
        return {v: [o for o in samples if o.at_ms >= since_ms] for v, samples in kept.items()}

    def health(self, model: str, version: str, since_ms: int) -> VersionHealth:
        """Requests, errors and p99 latency of model@version since `since_ms`."""
        with self._lock:  # a copy in C, short; the filtering happens outside the lock
            samples = list(self._samples.get((model, version), ()))
        window = [o for o in samples if o.at_ms >= since_ms]
        if not window:
            return VersionHealth()
        latencies = sorted(o.latency_ms for o in window)
        p99 = latencies[min(len(latencies) - 1, math.ceil(0.99 * len(latencies)) - 1)]
        return VersionHealth(num_requests=len(window),
                             num_errors=sum(1 for o in window if not o.ok), p99_ms=p99)

"""A classic model's admission bound, derived from what the instance was measured to do.

The gateway refuses a request at once when the instance it would go to already holds its
in-flight bound (`gateway.admission`). A fixed bound says nothing about the model or the
machine: 256 requests are a fifth of a second of xgb-example's work on a fast core, and
minutes of a large torch model's. So the instance measures its **completions per busy
second**: requests answered, divided by the time at least one request was in the backend
(queued or being scored). Idle time does not count, so a quiet instance's rate is not
diluted by the gaps between requests. The bound is the work that rate finishes within the
target wait (`podium serve --classic-target-wait-s`, the manifest's
`admission_target_wait_s`; 0.02 s by default), corrected for the tail (below): rate x wait x
tail, at least `FLOOR` (`MEASURED_FLOOR` once the instance is measured saturated, below), at
most what the package's queue holds plus one batch (`ceiling`). Until `MIN_COMPLETIONS`
requests have been measured the bound is `FLOOR`.

*The tail.* rate x wait requests in flight take the wait on average (Little's law), so half
of them, and more, take longer: at 4x xgb-example's capacity through the gateway (bound ~21,
`bench/overload_xgb.py`) the admitted answers' median was ~20 ms and their p99 35-45 ms, past
twice the p99 of the same instance at 16 in flight. So the bound is scaled by the latest
requests' mean time in the backend over their 90th percentile (`TAIL_QUANTILE`, over the last
`TAIL_WINDOW`): the work whose 90th percentile, not its mean, finishes within the wait. A
backend whose requests all take about as long keeps rate x wait (the factor is ~1).

The instance sends the bound on every KServe HTTP answer (the `podium-admission-bound`
header); the gateway keeps, per instance, the smaller of it and its own bound, and strips the
header before it answers the client.

What the measurement is and is not: under load the backend is never empty, so busy time is
wall time and the rate is the instance's throughput, HTTP and JSON work included (they share
the event loop). At light load a request rarely has company, the batches are small and the
rate is below what the instance could do; `FLOOR` keeps that from throttling a burst
before it has been measured. Old work fades: past `WINDOW_S` of busy time both sums halve.

*Below the floor when saturated.* When the instance's share of its core falls (a gateway on
the same core refusing a 4x burst, other work), its rate falls, and so does the bound: an
admitted request still waits about the target. A bound held at `FLOOR` let it wait
`FLOOR` / rate instead, past twice what the same 16 in flight took at capacity
(`docs/benchmarks.md`, "Overload"). But a rate measured at light load is no capacity: a
request alone in the backend makes its busy time its own latency, so completions per busy
second are 1 / that latency, whatever the instance could do with company (xgb-example: ~770/s,
a bound of ~8 at 1x open-loop load, where 16 in flight serve ~1,100/s). So the bound goes
below `FLOOR` only while the backend was **saturated**: over the same window, it held on
average at least `SATURATED_DEPTH` requests while busy (`BusyRate.depth`). Then
`MEASURED_FLOOR` keeps a few in flight, so one is read while another is scored and a batch
can still form. Tried without that condition (docs/benchmarks.md, 2026-12-04 23:05), a light
warm-up left the bound at 6-9 when a closed loop of 16 began, its refused clients sent again at
once, and the refusals kept the instance's rate, so the bound, low: 610 req/s of ~1,100.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

DEFAULT_TARGET_WAIT_S = 0.02
"""The wait an admitted request may spend behind the others in the instance. Measured on
xgb-example (docs/benchmarks.md): a bound of 128 let the gateway collapse under a 4x burst
(refusals p99 9.7 s); 16 met the targets."""
FLOOR = 16
"""The bound before the rate is measured: enough concurrency for the batcher to form batches
before the rate has been measured under load."""
MEASURED_FLOOR = 4
"""The least bound once the rate is measured under saturation: a few requests, so that one is
read while another is scored and a batch can still form."""
SATURATED_DEPTH = FLOOR / 2
"""Mean requests in the backend while busy (`BusyRate.depth`) from which the rate is taken as
the instance's capacity, and the bound may go below `FLOOR`."""
MIN_COMPLETIONS = 64
"""Requests measured before the rate is trusted."""
WINDOW_S = 4.0
"""Busy seconds after which the older measurement counts half."""
TAIL_WINDOW = 256
"""The latest requests whose times in the backend give the tail factor."""
TAIL_QUANTILE = 0.9
"""The part of the admitted requests whose time the bound keeps within the target wait."""
TAIL_EVERY = 32
"""Requests between two computations of the tail factor (a sort of `TAIL_WINDOW` times)."""
HEADER = "podium-admission-bound"
"""The response header that carries the bound to the gateway."""


class BusyRate:
    """Completions per busy second of one backend (`started`/`finished` around each request)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.in_flight = 0
        self._busy_since = 0.0
        self._busy_s = 0.0
        """Busy seconds of the closed busy periods (decayed)."""
        self._completions = 0.0
        """Requests finished (decayed alike)."""
        self._depth_s = 0.0
        """Requests x seconds in the backend (decayed alike): over busy seconds, the depth."""
        self._last = 0.0
        """When `_depth_s` was last brought up to date."""
        self.measured = 0
        """Requests finished in all."""

    def _held(self, now: float) -> None:
        """Count the requests in flight since the last event into `_depth_s`."""
        if self.in_flight:
            self._depth_s += self.in_flight * (now - self._last)
        self._last = now

    def started(self) -> float:
        """A request entered the backend; when (the clock's time, for `ClassicAdmission
        .finished`)."""
        now = self._clock()
        if self.in_flight == 0:
            self._busy_since = now
        self._held(now)
        self.in_flight += 1
        return now

    def finished(self, *, completed: bool = True) -> None:
        """A request left the backend: answered or failed by the model (`completed`), or
        refused or abandoned before it was scored (its busy time counts, it does not)."""
        now = self._clock()
        self._held(now)
        self.in_flight -= 1
        if completed:
            self._completions += 1
            self.measured += 1
        self._busy_s += now - self._busy_since
        self._busy_since = now  # still busy if others are in flight; else set on the next start
        if self._busy_s > WINDOW_S:
            self._busy_s /= 2
            self._completions /= 2
            self._depth_s /= 2

    def rate(self) -> float | None:
        """Requests finished per busy second; None until enough have been measured."""
        if self.measured < MIN_COMPLETIONS or self._busy_s <= 0:
            return None
        return self._completions / self._busy_s

    def depth(self) -> float:
        """Mean requests in the backend while it was busy (0 before any busy time)."""
        return self._depth_s / self._busy_s if self._busy_s > 0 else 0.0


def bound(rate: float | None, target_wait_s: float, ceiling: int, tail: float = 1.0,
          depth: float = 0.0) -> int:
    """The in-flight bound: what `rate` finishes in the target wait, scaled by the `tail`
    factor (`tail_factor`), within [FLOOR, ceiling], or [MEASURED_FLOOR, ceiling] when the
    backend's `depth` says it was saturated (`SATURATED_DEPTH`); `FLOOR` (at most the ceiling)
    while `rate` is None."""
    if rate is None:
        return min(FLOOR, ceiling)
    floor = MEASURED_FLOOR if depth >= SATURATED_DEPTH else FLOOR
    return max(min(floor, ceiling), min(ceiling, int(rate * target_wait_s * tail)))


def tail_factor(seconds: list[float]) -> float:
    """The mean of `seconds` over their `TAIL_QUANTILE` quantile (at most 1; 1 without
    any)."""
    if not seconds:
        return 1.0
    ordered = sorted(seconds)
    high = ordered[min(len(ordered) - 1, int(TAIL_QUANTILE * len(ordered)))]
    if high <= 0:
        return 1.0
    return min(1.0, sum(ordered) / len(ordered) / high)


class ClassicAdmission:
    """One classic backend's measured bound: the rate, the settings, what to log and show."""

    def __init__(self, target_wait_s: float, ceiling: int, source: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.target_wait_s = target_wait_s
        self.ceiling = ceiling
        self.source = source
        """Where the target wait came from: flag, package or default."""
        self.busy = BusyRate(clock)
        self._clock = clock
        self.bound = bound(None, target_wait_s, ceiling)
        self._logged = self.bound
        self._times: deque[float] = deque(maxlen=TAIL_WINDOW)
        """The latest completed requests' seconds in the backend."""
        self.tail = 1.0
        """`tail_factor` of `_times`, as of the last computation."""

    def finished(self, *, completed: bool = True, since: float | None = None) -> bool:
        """Count a request that left the backend (`BusyRate.finished`; `since`: when it
        entered, as `BusyRate.started` said) and update the bound; True when the bound moved
        by half or more since it was last logged, or was measured for the first time."""
        self.busy.finished(completed=completed)
        if not completed:
            return False
        if since is not None:
            self._times.append(self._clock() - since)
            if self.busy.measured % TAIL_EVERY == 0:
                self.tail = tail_factor(list(self._times))
        rate = self.busy.rate()
        if rate is None:
            return False
        self.bound = bound(rate, self.target_wait_s, self.ceiling, self.tail, self.busy.depth())
        first = self.busy.measured == MIN_COMPLETIONS
        if first or abs(self.bound - self._logged) * 2 >= self._logged:
            self._logged = self.bound
            return True
        return False

    def describe(self, key: str) -> str:
        """One log line: the bound, the rate behind it and the settings."""
        rate = self.busy.rate()
        measured = (f"measured {rate:.0f} completions per busy second over "
                    f"{self.busy.measured} requests, tail factor {self.tail:.2f} (mean time "
                    f"over its {TAIL_QUANTILE:.0%} quantile), {self.busy.depth():.1f} in the "
                    "backend while busy" if rate is not None else
                    f"not measured yet (the floor until {MIN_COMPLETIONS} requests are served)")
        return (f"admission of {key}: in-flight bound {self.bound} for a "
                f"{self.target_wait_s:g}s target wait ({self.source}); {measured}; "
                f"between {min(FLOOR, self.ceiling)} and {self.ceiling} (the queue plus one "
                f"batch; down to {min(MEASURED_FLOOR, self.ceiling)} while {SATURATED_DEPTH:g} "
                "or more are in the backend)")

    def as_dict(self) -> dict[str, Any]:
        """What the model's config route shows (`/v2/models/{m}/config`, `admission`)."""
        rate = self.busy.rate()
        return {"in_flight_bound": self.bound, "target_wait_s": self.target_wait_s,
                "target_wait_source": self.source,
                "completions_per_busy_s": round(rate, 1) if rate is not None else None,
                "tail_factor": round(self.tail, 3),
                "measured_requests": self.busy.measured, "in_flight": self.busy.in_flight,
                "depth": round(self.busy.depth(), 1),
                "floor": min(FLOOR, self.ceiling),
                "measured_floor": min(MEASURED_FLOOR, self.ceiling), "ceiling": self.ceiling}


def planned(manifest: Any, default_max_queue: int) -> dict[str, Any] | None:
    """What `podium inspect` shows of a classic package's bound before any instance measured
    it: the target wait (the package's, else the default; `--classic-target-wait-s` overrides
    both where the instance runs), the floor and the ceiling. None for other backends."""
    if not hasattr(manifest, "admission_target_wait_s"):
        return None
    batching = manifest.dynamic_batching
    queue = (batching.max_queue if batching is not None and batching.max_queue is not None
             else default_max_queue)
    ceiling = queue + max(1, manifest.max_batch_size)
    wait = manifest.admission_target_wait_s
    return {"in_flight_bound": "measured while serving: completions per busy second x the "
                               "target wait",
            "target_wait_s": wait if wait is not None else DEFAULT_TARGET_WAIT_S,
            "target_wait_source": "package" if wait is not None else "default",
            "floor": min(FLOOR, ceiling), "measured_floor": min(MEASURED_FLOOR, ceiling),
            "ceiling": ceiling}

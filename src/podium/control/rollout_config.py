"""Settings of one rollout, validated on construction with the bad value in the message."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from typing import Any, Literal

from podium.errors import InvalidArgument

Strategy = Literal["red-black", "versioned"]
STRATEGIES: tuple[str, ...] = ("red-black", "versioned")
REGION_FAILURE: tuple[str, ...] = ("roll-back-all", "keep-earlier")
REGION_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")


@dataclass(frozen=True)
class RolloutConfig:
    """How a rollout moves traffic and when it gives up."""

    strategy: Strategy = "red-black"
    """`red-black` shifts traffic in stages; `versioned` starts the version beside the others."""
    stages: tuple[int, ...] = (10, 25, 50, 100)
    """Red-Black: percent of traffic on the new version at each stage, increasing, ending at 100."""
    num_instances: int = 1
    """Instances of the new version at 100% (1-64)."""
    ready_timeout_ms: int = 300_000
    """A new instance not ready this long after it was asked for fails the rollout."""
    analysis_window_ms: int = 30_000
    """Red-Black: how long each stage serves traffic before it is judged."""
    min_requests: int = 20
    """Analysis judges a stage only on at least this many requests to the new version."""
    evidence_wait_ms: int = 0
    """Red-Black: a stage whose window ends with fewer than `min_requests` answered requests on
    the new version serves on up to this much longer, judged as soon as they are there; past
    it the stage passes for lack of evidence, as it does at once with the default 0."""
    max_error_rate_increase: float = 0.01
    """Fail when new error rate exceeds the old one's by more than this (absolute, 0-1)."""
    max_p99_ratio: float = 1.5
    """Fail when new p99 latency exceeds old p99 times this (plus `p99_slack_ms`)."""
    p99_slack_ms: float = 5.0
    """Latency difference always tolerated, so microsecond noise cannot fail a stage."""
    latency_checks: int = 2
    """A latency regression rolls back only once this many consecutive analysis windows show
    it (a slow window from a GC pause or a noisy neighbour is not a regression); errors,
    crashes and readiness roll back at once."""
    warm_delay_ms: int = 60_000
    """Red-Black: old instances stay warm this long after success, then drain and stop."""
    regions: tuple[str, ...] = ()
    """Regions to roll out to, one after the other in this order; empty: every declared region
    in its declared order."""
    bake_ms: int = 300_000
    """Between regions: how long a region that finished keeps the new version, watched for
    crashes, before the next region starts."""
    region_failure: str = "roll-back-all"
    """When region k fails (it always rolls back at once): `roll-back-all` also rolls back the
    regions before it, `keep-earlier` leaves them on the new version."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Ignored; lets older stored configs with unknown keys load."""

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise InvalidArgument(f"strategy={self.strategy!r} is unknown; use one of "
                                  f"{', '.join(STRATEGIES)}", param="strategy")
        stages = tuple(self.stages)
        object.__setattr__(self, "stages", stages)
        if not stages or any(not 0 < s <= 100 for s in stages) or stages[-1] != 100 or any(
                b <= a for a, b in pairwise(stages)):
            raise InvalidArgument(f"stages={list(stages)} must be increasing percentages in "
                                  "1..100 ending at 100, e.g. 10,25,50,100", param="stages")
        _check_range("num_instances", self.num_instances, 1, 64)
        _check_range("ready_timeout_ms", self.ready_timeout_ms, 1, 86_400_000)
        _check_range("analysis_window_ms", self.analysis_window_ms, 0, 86_400_000)
        _check_range("min_requests", self.min_requests, 0, 1_000_000)
        _check_range("evidence_wait_ms", self.evidence_wait_ms, 0, 86_400_000)
        _check_range("max_error_rate_increase", self.max_error_rate_increase, 0.0, 1.0)
        _check_range("max_p99_ratio", self.max_p99_ratio, 1.0, 1000.0)
        _check_range("p99_slack_ms", self.p99_slack_ms, 0.0, 60_000.0)
        _check_range("latency_checks", self.latency_checks, 1, 100)
        _check_range("warm_delay_ms", self.warm_delay_ms, 0, 86_400_000)
        _check_range("bake_ms", self.bake_ms, 0, 86_400_000)
        if self.region_failure not in REGION_FAILURE:
            raise InvalidArgument(f"region_failure={self.region_failure!r} is unknown; use one "
                                  f"of {', '.join(REGION_FAILURE)}", param="region_failure")
        regions = tuple(self.regions)
        object.__setattr__(self, "regions", regions)
        bad = [r for r in regions if not isinstance(r, str) or not REGION_NAME.match(r)]
        if bad or len(set(regions)) != len(regions) or len(regions) > 64:
            raise InvalidArgument(f"regions={list(regions)} must be distinct region names "
                                  "(lowercase letters, digits, '.', '_', '-'), e.g. eu,us",
                                  param="regions")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, stored with the rollout."""
        data = asdict(self)
        data["stages"] = list(self.stages)
        data["regions"] = list(self.regions)
        data.pop("extra")
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RolloutConfig:
        """Load a stored config; unknown keys are kept aside, not rejected."""
        known = {f for f in cls.__dataclass_fields__ if f != "extra"}
        extra = {k: v for k, v in data.items() if k not in known}
        return cls(**{k: v for k, v in data.items() if k in known}, extra=extra)


def _check_range(name: str, value: float, low: float, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise InvalidArgument(f"{name}={value!r} is out of range; use {low}..{high}", param=name)

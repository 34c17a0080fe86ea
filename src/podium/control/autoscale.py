"""Autoscaling policy: instances per deployment from in-flight requests, pure and clock-driven.

Scale up at once (a queue is already forming); scale down only after the lower demand has lasted
`scale_down_cooldown_ms` and the last change is at least that old, so a brief lull does not
stop instances that are slow to start again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from podium.errors import InvalidArgument

MAX_INSTANCES = 64


@dataclass(frozen=True)
class AutoscalePolicy:
    """Bounds and target of one deployment."""

    min_instances: int = 1
    """Never fewer instances than this (0..64)."""
    max_instances: int = 4
    """Never more instances than this (min_instances..64)."""
    target_in_flight: float = 8.0
    """In-flight requests per instance the policy aims for (> 0)."""
    scale_down_cooldown_ms: int = 60_000
    """How long demand must stay low, and the last change be old, before scaling down."""

    def __post_init__(self) -> None:
        if not 0 <= self.min_instances <= MAX_INSTANCES:
            raise InvalidArgument(f"min_instances={self.min_instances} is out of range; use "
                                  f"0..{MAX_INSTANCES}", param="min_instances")
        if not self.min_instances <= self.max_instances <= MAX_INSTANCES:
            raise InvalidArgument(f"max_instances={self.max_instances} is out of range; use "
                                  f"{self.min_instances}..{MAX_INSTANCES} (at least "
                                  "min_instances)", param="max_instances")
        if not self.target_in_flight > 0:
            raise InvalidArgument(f"target_in_flight={self.target_in_flight} must be above 0",
                                  param="target_in_flight")
        if self.scale_down_cooldown_ms < 0:
            raise InvalidArgument(f"scale_down_cooldown_ms={self.scale_down_cooldown_ms} must "
                                  "be 0 or more", param="scale_down_cooldown_ms")


@dataclass(frozen=True)
class AutoscaleState:
    """What the policy remembers between decisions."""

    num_instances: int
    last_change_ms: int = 0
    low_since_ms: int | None = None
    """When demand first fell below the current count (None while it has not)."""


def wanted(policy: AutoscalePolicy, in_flight: float) -> int:
    """Instances that keep `in_flight` requests at the target per instance, within bounds."""
    raw = math.ceil(in_flight / policy.target_in_flight) if in_flight > 0 else 0
    return min(max(raw, policy.min_instances), policy.max_instances)


def decide(policy: AutoscalePolicy, state: AutoscaleState, in_flight: float,
           now_ms: int) -> AutoscaleState:
    """The next state given total in-flight requests across the deployment at `now_ms`."""
    target = wanted(policy, in_flight)
    current = state.num_instances
    if target > current or current < policy.min_instances or current > policy.max_instances:
        return AutoscaleState(num_instances=target, last_change_ms=now_ms)
    if target == current:
        return replace(state, low_since_ms=None)
    low_since = state.low_since_ms if state.low_since_ms is not None else now_ms
    cooled = (now_ms - low_since >= policy.scale_down_cooldown_ms
              and now_ms - state.last_change_ms >= policy.scale_down_cooldown_ms)
    if not cooled:
        return replace(state, low_since_ms=low_since)
    # step down one instance at a time: demand measured on N instances is noisy
    return AutoscaleState(num_instances=current - 1, last_change_ms=now_ms, low_since_ms=now_ms)

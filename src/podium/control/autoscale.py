"""Autoscaling policy: instances per deployment from its load signals, pure and clock-driven.

Each signal is a load per instance with a target per instance: requests in flight (from the
gateway, every deployment), and for an LLM the engine's own waiting requests
(`vllm:num_requests_waiting`) and KV-cache usage (`vllm:kv_cache_usage_perc`, 0..1), read from
the instances' `/metrics`. A signal wants `ceil(load per instance * instances / target)`.

- Up when any signal wants more than the current count for `scale_up_window_ms` in a row
  (0: at once), to the most any signal wants.
- Down, one instance at a time, only when every declared signal is known and wants fewer, for
  `scale_down_cooldown_ms`, and the last change is at least that old: a brief lull does not
  stop instances that are slow to start again.
- An engine signal that could not be read is unknown, never zero: it neither scales up nor
  lets the deployment scale down.
- While an instance of the deployment is starting, nothing changes and both timers restart:
  the load it will take is not in the signals yet.
- A count outside min..max is corrected at once.

`decide` returns the one `actions.Decision`: the state to keep, a `Scale` of the deployment
when its count changes (none otherwise), and why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from podium.control.actions import DEFAULT_REGION, Decision, Scale
from podium.errors import InvalidArgument

MAX_INSTANCES = 64
_EPSILON = 1e-9  # 0.3 / 0.1 is 2.9999999999999996 in floats: no instance for a rounding error


@dataclass(frozen=True)
class Targets:
    """The control plane's targets where a package declares none (`DEFAULT_TARGETS`: the one
    place the defaults live; `podium up`'s loop config and every policy start from it)."""

    target_in_flight: float = 8.0
    """In-flight requests per instance to aim for."""
    scale_up_window_ms: int = 0
    """How long a signal must stay over its target before scaling up (0: at once)."""
    scale_down_cooldown_ms: int = 60_000
    """How long demand must stay low, and the last change be old, before scaling down."""


DEFAULT_TARGETS = Targets()


@dataclass(frozen=True)
class AutoscalePolicy:
    """Bounds and targets of one deployment."""

    min_instances: int = 1
    """Never fewer instances than this (0..64)."""
    max_instances: int = 4
    """Never more instances than this (min_instances..64)."""
    target_in_flight: float = DEFAULT_TARGETS.target_in_flight
    """In-flight requests per instance the policy aims for (> 0)."""
    target_waiting: float | None = None
    """Engine requests waiting per instance the policy aims for (> 0; None: not a signal)."""
    max_kv_cache_usage: float | None = None
    """KV-cache usage per instance the policy keeps under (0 < x <= 1; None: not a signal)."""
    scale_up_window_ms: int = DEFAULT_TARGETS.scale_up_window_ms
    """How long a signal must stay over its target before scaling up (0: at once)."""
    scale_down_cooldown_ms: int = DEFAULT_TARGETS.scale_down_cooldown_ms
    """How long demand must stay low, and the last change be old, before scaling down."""

    def __post_init__(self) -> None:
        if not 0 <= self.min_instances <= MAX_INSTANCES:
            raise InvalidArgument(f"min_instances={self.min_instances} is out of range; use "
                                  f"0..{MAX_INSTANCES}", param="min_instances")
        if not self.min_instances <= self.max_instances <= MAX_INSTANCES:
            raise InvalidArgument(f"max_instances={self.max_instances} is out of range; use "
                                  f"{self.min_instances}..{MAX_INSTANCES} (at least "
                                  "min_instances)", param="max_instances")
        for name in ("target_in_flight", "target_waiting"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise InvalidArgument(f"{name}={value} must be above 0", param=name)
        usage = self.max_kv_cache_usage
        if usage is not None and not 0 < usage <= 1:
            raise InvalidArgument(f"max_kv_cache_usage={usage} is out of range; use a "
                                  "fraction in (0, 1], e.g. 0.8", param="max_kv_cache_usage")
        for name in ("scale_up_window_ms", "scale_down_cooldown_ms"):
            if getattr(self, name) < 0:
                raise InvalidArgument(f"{name}={getattr(self, name)} must be 0 or more",
                                      param=name)

    @property
    def reads_engine(self) -> bool:
        """Whether the policy needs the engine's signals from the instances' /metrics."""
        return self.target_waiting is not None or self.max_kv_cache_usage is not None


@dataclass(frozen=True)
class Demand:
    """What the deployment's instances carry now."""

    in_flight: float = 0.0
    """Requests in flight across the deployment (the gateway's count)."""
    waiting: float | None = None
    """Engine requests waiting, mean per serving instance; None: not read."""
    kv_cache_usage: float | None = None
    """Engine KV-cache usage (0..1), mean per serving instance; None: not read."""
    complete: bool = True
    """Every serving instance's engine signals were read (scaling down needs all of them)."""
    num_starting: int = 0
    """Instances asked for and not serving yet."""


@dataclass(frozen=True)
class AutoscaleState:
    """What the policy remembers between decisions."""

    num_instances: int
    last_change_ms: int = 0
    low_since_ms: int | None = None
    """When every signal first wanted fewer than the current count (None while not)."""
    high_since_ms: int | None = None
    """When a signal first wanted more than the current count (None while none does)."""
    reason: str = ""
    """Why the last change was made, e.g. `waiting 3.0/instance > target 1`."""


def wanted_by_signal(policy: AutoscalePolicy, demand: Demand,
                     current: int) -> dict[str, int | None]:
    """Instances each signal wants (None: a declared engine signal that is unknown)."""
    serving = max(current, 1)
    wants: dict[str, int | None] = {"in_flight": _instances(demand.in_flight,
                                                            policy.target_in_flight)}
    if policy.target_waiting is not None:
        wants["waiting"] = (None if demand.waiting is None
                            else _instances(demand.waiting * serving, policy.target_waiting))
    if policy.max_kv_cache_usage is not None:
        wants["kv_cache_usage"] = (
            None if demand.kv_cache_usage is None
            else _instances(demand.kv_cache_usage * serving, policy.max_kv_cache_usage))
    return wants


def wanted(policy: AutoscalePolicy, demand: Demand, current: int) -> int:
    """Instances that keep every known signal at or under its target, within bounds."""
    known = [w for w in wanted_by_signal(policy, demand, current).values() if w is not None]
    return _bounded(policy, max(known, default=0))


@dataclass(frozen=True)
class Deployment:
    """The deployment a decision sizes (its `Scale` names it)."""

    model: str
    version: str
    region: str = DEFAULT_REGION


def decide(policy: AutoscalePolicy, state: AutoscaleState, demand: Demand, now_ms: int,
           deployment: Deployment) -> Decision[AutoscaleState]:
    """The next state given the deployment's demand at `now_ms`, and the `Scale` to its new
    count when that changed."""
    nxt = _next_state(policy, state, demand, now_ms)
    if nxt.num_instances == state.num_instances:
        return Decision(nxt, [], "")
    scale = Scale(deployment.model, deployment.version, nxt.num_instances,
                  region=deployment.region)
    return Decision(nxt, [scale], f"autoscale: {nxt.reason}")


def _next_state(policy: AutoscalePolicy, state: AutoscaleState, demand: Demand,
                now_ms: int) -> AutoscaleState:
    current = state.num_instances
    if not policy.min_instances <= current <= policy.max_instances:
        target = wanted(policy, demand, current)
        return AutoscaleState(target, last_change_ms=now_ms,
                              reason=f"bounds {policy.min_instances}..{policy.max_instances}")
    if demand.num_starting > 0:
        return replace(state, low_since_ms=None, high_since_ms=None)
    wants = wanted_by_signal(policy, demand, current)
    over = {name: n for name, n in wants.items() if n is not None and n > current}
    if over and current < policy.max_instances:
        high_since = state.high_since_ms if state.high_since_ms is not None else now_ms
        if now_ms - high_since < policy.scale_up_window_ms:
            return replace(state, high_since_ms=high_since, low_since_ms=None)
        return AutoscaleState(_bounded(policy, max(over.values())), last_change_ms=now_ms,
                              reason=_why(policy, demand, current, over, ">"))
    low = (demand.complete and current > policy.min_instances
           and all(n is not None and n < current for n in wants.values()))
    if not low:
        return replace(state, low_since_ms=None, high_since_ms=None)
    low_since = state.low_since_ms if state.low_since_ms is not None else now_ms
    cooled = (now_ms - low_since >= policy.scale_down_cooldown_ms
              and now_ms - state.last_change_ms >= policy.scale_down_cooldown_ms)
    if not cooled:
        return replace(state, low_since_ms=low_since, high_since_ms=None)
    # step down one instance at a time: demand measured on N instances is noisy
    return AutoscaleState(current - 1, last_change_ms=now_ms, low_since_ms=now_ms,
                          reason=_why(policy, demand, current, wants, "<"))


def _instances(load: float, target: float) -> int:
    return math.ceil(load / target - _EPSILON) if load > 0 else 0


def _bounded(policy: AutoscalePolicy, count: int) -> int:
    return min(max(count, policy.min_instances), policy.max_instances)


def _why(policy: AutoscalePolicy, demand: Demand, current: int,
         signals: dict[str, int | None], sign: str) -> str:
    """`in_flight 30/instance > target 8`, one clause per signal named."""
    per_instance = {"in_flight": demand.in_flight / max(current, 1), "waiting": demand.waiting,
                    "kv_cache_usage": demand.kv_cache_usage}
    targets = {"in_flight": policy.target_in_flight, "waiting": policy.target_waiting,
               "kv_cache_usage": policy.max_kv_cache_usage}
    return ", ".join(f"{name} {per_instance[name]:.3g}/instance {sign} target {targets[name]:g}"
                     for name in signals)

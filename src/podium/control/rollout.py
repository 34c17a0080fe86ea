"""The rollout controller: a pure state machine driven by a clock and observed health.

`step(state, observation, now_ms)` returns the next state and the actions to carry out, or
None when nothing changes. The caller writes the new state (one rollout step) to the store
*before* it acts, so a control plane killed at any point resumes from the store: it re-applies
the state's desired scale and split (idempotent) and keeps stepping.

Red-Black, per stage `w`: scale the new version up to its share, wait until it is ready, move
`w`% of traffic to it, scale the old one down to its share, and after the analysis window
compare error rate and p99 latency. After the last stage the old instances stay warm for
`warm_delay_ms`.

Rollback (a failed readiness, a crash, a failed analysis or an operator): when the old version
still has all its instances, one step sends 100% of traffic back. When it was scaled down (it
keeps one instance at the 100% stage), the rollback first scales it back up to the instances it
had before the rollout (`num_old`, what its scaling policy had it at) and moves traffic back in
proportion to its *ready* instances (phase `roll_back`), so the survivor never takes more than
it can hold; the rollout is `rolled_back` once they are all ready (or `ready_timeout_ms` ran
out, when the rest moves anyway). A new version with no ready instance serves nothing: then all
traffic goes back at once and its instances stop.

Versioned: start the new version beside the others; move `latest` once it is ready.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from podium.control.actions import (
    DEFAULT_REGION,
    Action,
    Decision,
    MoveAlias,
    Scale,
    SetSplit,
)
from podium.control.rollout_config import RolloutConfig
from podium.routes.stats import VersionHealth

RUNNING, SUCCEEDED, ROLLED_BACK, FAILED = "running", "succeeded", "rolled_back", "failed"
ROLL_BACK = "roll_back"
"""The phase of a rollback that waits for the old version's instances to be ready again."""
LATEST = "latest"


@dataclass(frozen=True)
class Observation:
    """Health of the old and the new version at one moment."""

    new: VersionHealth
    old: VersionHealth = field(default_factory=VersionHealth)


@dataclass(frozen=True)
class RolloutState:
    """Everything needed to resume a rollout; stored as JSON with each step."""

    model: str
    to_version: str
    from_version: str | None
    config: RolloutConfig
    num_old: int = 0
    """Instances the old version had when the rollout began (restored on rollback)."""
    status: str = RUNNING
    phase: str = "start"
    stage_index: int = 0
    phase_since_ms: int = 0
    crash_baseline: int = 0
    desired: dict[str, int] = field(default_factory=dict)
    split: dict[str, int] = field(default_factory=dict)
    latest: str | None = None
    """Where this rollout last pointed the `latest` alias (None: never touched it)."""
    latency_strikes: int = 0
    """Consecutive analysis windows of the current stage that showed a latency regression."""
    unready_since_ms: int | None = None
    """When ready new instances stopped answering ready (None: all ready)."""
    baseline: dict[str, Any] | None = None
    """The old version's health over the last window where it had enough traffic: what the
    new version is compared with once the old one no longer takes any (the 100% stage)."""
    reason: str = ""
    region: str = DEFAULT_REGION
    """The region this rollout acts in: one leg of a rollout region by region."""

    @property
    def is_done(self) -> bool:
        """True once the rollout succeeded, rolled back or failed."""
        return self.status != RUNNING

    @property
    def weight_new(self) -> int:
        """Percent of unversioned traffic currently routed to the new version."""
        return self.split.get(self.to_version, 0)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form for the store."""
        data = asdict(self)
        data["config"] = self.config.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RolloutState:
        """Inverse of `to_dict`."""
        return cls(**{**data, "config": RolloutConfig.from_dict(data["config"])})


def begin(model: str, to_version: str, from_version: str | None, config: RolloutConfig,
          *, num_old: int = 0, now_ms: int = 0,
          region: str = DEFAULT_REGION) -> RolloutState:
    """The state of a rollout (in one region) that has not taken its first step yet."""
    if from_version is not None and from_version == to_version:
        from_version = None
    split = {from_version: 100} if from_version else {}
    desired = {from_version: num_old} if from_version else {}
    return RolloutState(model=model, to_version=to_version, from_version=from_version,
                        config=config, num_old=num_old if from_version else 0,
                        phase_since_ms=now_ms, desired=desired, split=split, region=region)


def abort(state: RolloutState, reason: str, now_ms: int) -> Decision[RolloutState] | None:
    """An operator asked to roll back a running rollout."""
    if state.is_done or state.phase == ROLL_BACK:
        return None  # done, or already rolling back
    return roll_back(state, f"rollback requested: {reason}", now_ms)


def resume(state: RolloutState, paused_ms: int, reason: str) -> Decision[RolloutState] | None:
    """The control plane was paused `paused_ms` (its database away): a pause is not a wait, so
    the phase's timers move on by that much and no timeout fires for time nobody could act."""
    if state.is_done or paused_ms <= 0:
        return None
    unready = None if state.unready_since_ms is None else state.unready_since_ms + paused_ms
    nxt = replace(state, phase_since_ms=state.phase_since_ms + paused_ms,
                  unready_since_ms=unready)
    return Decision(nxt, [], f"paused {paused_ms} ms ({reason}); {state.phase} timers moved "
                    "on by as much")


def step(state: RolloutState, obs: Observation, now_ms: int) -> Decision[RolloutState] | None:
    """Advance the rollout by at most one phase; None when nothing changes yet."""
    if state.is_done:
        return None
    if state.phase == "start":
        return _start(state, obs, now_ms)
    if state.phase == ROLL_BACK:
        return _ramp_back(state, obs, now_ms)
    crashed = obs.new.num_crashes > state.crash_baseline
    if crashed:
        return roll_back(state, f"{state.model}@{state.to_version} crashed "
                          f"({obs.new.num_crashes - state.crash_baseline} times)", now_ms)
    if state.phase == "wait_ready":
        return _wait_ready(state, obs, now_ms)
    if state.phase in ("analyze", "warm"):
        unready = _check_still_ready(state, obs, now_ms)
        if unready is not None:
            return unready
        if state.unready_since_ms is not None:
            return None  # hold the stage until the new version is ready again or times out
    if state.phase == "analyze":
        return _analyze(state, obs, now_ms)
    if state.phase == "warm":
        return _warm(state, now_ms)
    raise ValueError(f"unknown rollout phase {state.phase!r}")


def _start(state: RolloutState, obs: Observation, now_ms: int) -> Decision[RolloutState]:
    count = _num_new(state, state.stage_index)
    desired = {**state.desired, state.to_version: count}
    nxt = replace(state, phase="wait_ready", phase_since_ms=now_ms, desired=desired,
                  crash_baseline=obs.new.num_crashes)
    return Decision(nxt, [_scale(state, state.to_version, count)],
                    f"starting {count} instance(s) of {state.model}@{state.to_version}")


def _wait_ready(state: RolloutState, obs: Observation,
                now_ms: int) -> Decision[RolloutState] | None:
    need = state.desired[state.to_version]
    if obs.new.num_ready < need:
        waited = now_ms - state.phase_since_ms
        if waited >= state.config.ready_timeout_ms:
            return roll_back(state, f"{state.model}@{state.to_version} not ready after "
                              f"{waited} ms ({obs.new.num_ready}/{need} instances ready)", now_ms)
        return None
    if state.config.strategy == "versioned" or state.from_version is None:
        return _finish_without_old(state, now_ms)
    weight = _stages(state)[state.stage_index]
    split = {state.from_version: 100 - weight, state.to_version: weight}
    num_old = _num_old(state, weight)
    nxt = replace(state, phase="analyze", phase_since_ms=now_ms, split=split,
                  desired={**state.desired, state.from_version: num_old})
    # shift traffic first, then scale the old version down: it never serves more than it holds
    return Decision(nxt, [_split(state, split),
                          _scale(state, state.from_version, num_old)],
                    f"stage {state.stage_index + 1}/{len(_stages(state))}: {weight}% to "
                    f"{state.to_version}, {num_old} old instance(s) left")


def _check_still_ready(state: RolloutState, obs: Observation,
                       now_ms: int) -> Decision[RolloutState] | None:
    """A new instance that stops answering ready holds the stage, then rolls back: the gateway
    already routes around it, so the analysis alone would never see it fail."""
    need = state.desired.get(state.to_version, 0)
    if obs.new.num_ready >= need:
        if state.unready_since_ms is None:
            return None
        return Decision(replace(state, unready_since_ms=None), [],
                        f"{state.to_version} ready again ({obs.new.num_ready}/{need})")
    if state.unready_since_ms is None:
        return Decision(replace(state, unready_since_ms=now_ms), [],
                        f"{state.to_version} not ready ({obs.new.num_ready}/{need}); holding")
    waited = now_ms - state.unready_since_ms
    if waited >= state.config.ready_timeout_ms:
        return roll_back(state, f"{state.model}@{state.to_version} stopped being ready for "
                          f"{waited} ms ({obs.new.num_ready}/{need} instances ready)", now_ms)
    return None


def _finish_without_old(state: RolloutState, now_ms: int) -> Decision[RolloutState]:
    if state.config.strategy == "versioned":
        nxt = replace(state, status=SUCCEEDED, phase="done", phase_since_ms=now_ms,
                      latest=state.to_version)
        return Decision(nxt, [_alias(state, state.to_version)],
                        f"{LATEST} -> {state.to_version}")
    split = {state.to_version: 100}
    nxt = replace(state, status=SUCCEEDED, phase="done", phase_since_ms=now_ms, split=split,
                  latest=state.to_version)
    return Decision(nxt, [_split(state, split),
                          _alias(state, state.to_version)],
                    f"first version {state.to_version} ready: 100% of traffic")


def _analyze(state: RolloutState, obs: Observation, now_ms: int) -> Decision[RolloutState] | None:
    if now_ms - state.phase_since_ms < state.config.analysis_window_ms:
        return None
    enough = max(state.config.min_requests, 1)
    if obs.new.num_requests < enough and now_ms - state.phase_since_ms < (
            state.config.analysis_window_ms + state.config.evidence_wait_ms):
        return None  # too few requests on the new version yet: the stage serves on
    old = obs.old
    if old.num_requests < enough and state.baseline is not None:
        old = VersionHealth(**state.baseline)
    judged = Observation(new=obs.new, old=old)
    failure = judge_errors(state.config, judged)
    if failure:
        return roll_back(state, f"analysis failed at {state.weight_new}%: {failure}", now_ms)
    slow = judge_latency(state.config, judged)
    if slow:
        strikes = state.latency_strikes + 1
        checks = state.config.latency_checks
        if strikes >= checks:
            times = f" ({strikes} windows in a row)" if strikes > 1 else ""
            return roll_back(state, f"analysis failed at {state.weight_new}%: {slow}{times}",
                              now_ms)
        # judged again over a fresh window: one slow window is noise until it repeats
        return Decision(replace(state, latency_strikes=strikes, phase_since_ms=now_ms), [],
                        f"analysis at {state.weight_new}%: {slow}; judging a new window "
                        f"({strikes}/{checks})")
    state = replace(state, latency_strikes=0)
    if obs.old.num_requests >= enough:
        state = replace(state, baseline={"num_requests": obs.old.num_requests,
                                         "num_errors": obs.old.num_errors,
                                         "p99_ms": obs.old.p99_ms})
    seen = f"{state.to_version}: {judged.new.figures()}; {state.from_version}: " + (
        judged.old.figures())  # what the verdict rests on, shown with it
    if state.stage_index + 1 < len(_stages(state)):
        index = state.stage_index + 1
        count = _num_new(state, index)
        nxt = replace(state, phase="wait_ready", phase_since_ms=now_ms, stage_index=index,
                      desired={**state.desired, state.to_version: count})
        return Decision(nxt, [_scale(state, state.to_version, count)],
                        f"analysis passed at {state.weight_new}%; scaling "
                        f"{state.to_version} to {count} ({seen})")
    nxt = replace(state, phase="warm", phase_since_ms=now_ms, latest=state.to_version)
    return Decision(nxt, [_alias(state, state.to_version)],
                    f"analysis passed at 100%; keeping {state.from_version} warm for "
                    f"{state.config.warm_delay_ms} ms ({seen})")


def judge_errors(config: RolloutConfig, obs: Observation) -> str | None:
    """The error-rate verdict alone: errors are never noise, one window decides."""
    new, old = obs.new, obs.old
    if new.num_requests < max(config.min_requests, 1):
        return None  # too little evidence to blame the new version; the stage passes
    new_rate = new.num_errors / new.num_requests
    old_rate = old.num_errors / old.num_requests if old.num_requests else 0.0
    if new_rate > old_rate + config.max_error_rate_increase:
        return (f"error rate {new_rate:.1%} vs {old_rate:.1%} on the old version "
                f"(allowed +{config.max_error_rate_increase:.1%}; {new.num_errors} of "
                f"{new.num_requests} requests failed vs {old.num_errors} of {old.num_requests})")
    return None


def judge_latency(config: RolloutConfig, obs: Observation) -> str | None:
    """The p99 verdict alone, over one window."""
    new, old = obs.new, obs.old
    if new.num_requests < max(config.min_requests, 1):
        return None
    if new.p99_ms is not None and old.p99_ms is not None:
        limit = old.p99_ms * config.max_p99_ratio + config.p99_slack_ms
        if new.p99_ms > limit:
            return (f"p99 latency {new.p99_ms:.1f} ms over {new.num_requests} requests vs "
                    f"{old.p99_ms:.1f} ms over {old.num_requests} on the old version "
                    f"(allowed {limit:.1f} ms)")
    return None


def _warm(state: RolloutState, now_ms: int) -> Decision[RolloutState] | None:
    if now_ms - state.phase_since_ms < state.config.warm_delay_ms:
        return None
    assert state.from_version is not None
    nxt = replace(state, status=SUCCEEDED, phase="done", phase_since_ms=now_ms,
                  split={state.to_version: 100},
                  desired={**state.desired, state.from_version: 0})
    return Decision(nxt, [_split(state, {state.to_version: 100}),
                          _scale(state, state.from_version, 0)],
                    f"warm delay over: draining and stopping {state.from_version}")


def roll_back(state: RolloutState, reason: str, now_ms: int) -> Decision[RolloutState]:
    """Start rolling back to the old version (at once when it kept all its instances)."""
    if state.config.strategy != "red-black" or state.from_version is None:
        # nothing to roll back to: the previous routing was never touched
        nxt = replace(state, status=FAILED, phase="done", phase_since_ms=now_ms,
                      desired={**state.desired, state.to_version: 0}, reason=reason)
        return Decision(nxt, [_scale(state, state.to_version, 0)], reason)
    old = state.from_version
    have = state.desired.get(old, 0)
    if have >= state.num_old:
        # the old instances were all kept: one split change moves every request back at once
        return _finish_roll_back(replace(state, reason=reason), now_ms, reason)
    # scale the old version up first; traffic follows as its instances become ready
    weight = max(state.split.get(old, 0), _share(have, state.num_old))
    split = {old: weight, state.to_version: 100 - weight}
    nxt = replace(state, phase=ROLL_BACK, phase_since_ms=now_ms, reason=reason, split=split,
                  desired={**state.desired, old: state.num_old})
    return Decision(nxt, [_scale(state, old, state.num_old), _split(state, split)],
                    f"{reason}; rolling back: scaling {old} from {have} to {state.num_old} "
                    f"instance(s), {weight}% of traffic on it until more are ready")


def _ramp_back(state: RolloutState, obs: Observation, now_ms: int) -> Decision[RolloutState] | None:
    """One step of a rollback waiting for the old version: traffic follows its ready share."""
    assert state.from_version is not None
    old, new, target = state.from_version, state.to_version, state.num_old
    ready = obs.old.num_ready
    waited = now_ms - state.phase_since_ms
    if ready >= target:
        return _finish_roll_back(state, now_ms, f"{old} has {ready}/{target} instances ready "
                                 "again: 100% of traffic back on it")
    if waited >= state.config.ready_timeout_ms:
        return _finish_roll_back(state, now_ms, f"{old} has only {ready}/{target} instances "
                                 f"ready after {waited} ms; 100% of traffic back on it anyway")
    actions: list[Action] = []
    desired, latest = state.desired, state.latest
    gone = obs.new.num_ready == 0
    # the new version serves nothing without ready instances: send everything it had back
    weight = 100 if gone else max(state.split.get(old, 0), _share(ready, target))
    if weight != state.split.get(old, 0):
        actions.append(_split(state, {old: weight, new: 100 - weight}))
    if gone and desired.get(new, 0) > 0:
        desired = {**desired, new: 0}
        actions.append(_scale(state, new, 0))  # its boot loop would slow the old's
    if gone and latest == new:
        latest = old
        actions.append(_alias(state, old))
    if not actions:
        return None
    nxt = replace(state, split={old: weight, new: 100 - weight}, desired=desired, latest=latest)
    why = f"{new} has no ready instance" if gone else f"{ready}/{target} of {old} ready"
    return Decision(nxt, actions, f"rolling back: {why}: {weight}% of traffic on {old}")


def _finish_roll_back(state: RolloutState, now_ms: int, note: str) -> Decision[RolloutState]:
    assert state.from_version is not None
    old, new = state.from_version, state.to_version
    split = {old: 100, new: 0}
    actions: list[Action] = [_split(state, split), _scale(state, old, state.num_old)]
    latest = state.latest
    if latest is not None and latest != old:
        latest = old
        actions.append(_alias(state, old))
    actions.append(_scale(state, new, 0))
    nxt = replace(state, status=ROLLED_BACK, phase="done", phase_since_ms=now_ms, split=split,
                  desired={**state.desired, old: state.num_old, new: 0}, latest=latest)
    return Decision(nxt, actions, note)


def _scale(state: RolloutState, version: str, count: int) -> Scale:
    return Scale(state.model, version, count, region=state.region)


def _split(state: RolloutState, weights: dict[str, int]) -> SetSplit:
    return SetSplit(state.model, weights, region=state.region)


def _alias(state: RolloutState, version: str) -> MoveAlias:
    return MoveAlias(state.model, LATEST, version, region=state.region)


def _share(num_ready: int, num_wanted: int) -> int:
    """Percent of the traffic `num_ready` of `num_wanted` instances can take (rounded down)."""
    return min(100, num_ready * 100 // max(1, num_wanted))


def _stages(state: RolloutState) -> tuple[int, ...]:
    if state.config.strategy == "versioned" or state.from_version is None:
        return (100,)
    return state.config.stages


def _num_new(state: RolloutState, index: int) -> int:
    weight = _stages(state)[index]
    return max(1, math.ceil(state.config.num_instances * weight / 100))


def _num_old(state: RolloutState, weight: int) -> int:
    # never below one until the warm delay is over: a rollback needs somewhere to send traffic
    return max(1, math.ceil(state.num_old * (100 - weight) / 100))

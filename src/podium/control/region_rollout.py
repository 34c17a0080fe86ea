"""Rollouts region by region: a pure state machine over one `rollout` leg per region.

The legs are begun together (each from the version its region serves at the start) and run one
at a time in the rollout's region order: region 1's Red-Black stages and analysis, then
`bake_ms` during which region 1 keeps the new version and is watched for crashes, then region 2,
and so on. A failure in region k rolls region k back at once (its leg's own rollback); the
regions before it roll back too (`region_failure="roll-back-all"`, the default, all at the same
time) or keep the new version (`keep-earlier`); the regions after it never start. An operator's
rollback always rolls back every region that started.

`step(state, observations, now_ms)` takes one observation per leg `watched(state)` names and
returns the next state with the actions of every leg that moved, or None. As for one region,
the caller writes the whole state before it acts, so a restart resumes the right region at the
right stage from the store.

An operator may pause a running rollout (`pause`): it holds where it is (same stage, split and
instances), takes no step, runs no analysis and starts no timer, until `unpause`, which moves
every timer on by the time it was paused (as after a plane that could not act), so it continues
where it stood. A rollback is never paused; an operator's rollback of a paused rollout goes
ahead at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from podium.control import rollout
from podium.control.actions import Action, Decision, MoveAlias, Scale, SetSplit
from podium.control.rollout import (
    FAILED,
    LATEST,
    ROLL_BACK,
    ROLLED_BACK,
    RUNNING,
    SUCCEEDED,
    Observation,
    RolloutState,
)
from podium.control.rollout_config import RolloutConfig

ROLLING, BAKE, UNWIND, DONE = "rolling", "bake", "unwind", "done"
"""Modes: a region's leg runs; a finished region bakes; failed regions roll back; over."""
PENDING, SKIPPED, PAUSED = "pending", "skipped", "paused"
"""A region's status before its leg starts, and after a failure elsewhere stopped it; the
phase of a rollout an operator paused."""


@dataclass(frozen=True)
class RegionRollout:
    """A rollout of one model across regions; stored as JSON with each step. What a leg knows
    of itself (stage, weights, timers) is read from that leg (`leg`), not repeated here."""

    legs: tuple[RolloutState, ...]
    """One leg per region, in rollout order."""
    index: int = 0
    """The leg that runs (or bakes, or failed)."""
    mode: str = ROLLING
    mode_since_ms: int = 0
    status: str = RUNNING
    reason: str = ""
    paused_since_ms: int | None = None
    """When an operator paused the rollout (None: not paused)."""

    @property
    def leg(self) -> RolloutState:
        """The leg of the region the rollout is at."""
        return self.legs[self.index]

    @property
    def model(self) -> str:
        """The model rolled out."""
        return self.legs[0].model

    @property
    def to_version(self) -> str:
        """The version rolled out."""
        return self.legs[0].to_version

    @property
    def config(self) -> RolloutConfig:
        """Settings shared by every leg."""
        return self.legs[0].config

    @property
    def order(self) -> tuple[str, ...]:
        """Region names in rollout order."""
        return tuple(leg.region for leg in self.legs)

    @property
    def region(self) -> str:
        """The region the rollout is at."""
        return self.leg.region

    @property
    def phase(self) -> str:
        """The current leg's phase; `bake` between legs; `unwind` while only earlier regions
        are still rolling back; `paused` while an operator holds it."""
        if self.paused_since_ms is not None:
            return PAUSED
        if self.mode == BAKE or (self.mode == UNWIND and self.leg.status != RUNNING):
            return self.mode
        return self.leg.phase

    @property
    def is_done(self) -> bool:
        """True once every region is done."""
        return self.status != RUNNING

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form for the store."""
        return {"legs": [leg.to_dict() for leg in self.legs], "index": self.index,
                "mode": self.mode, "mode_since_ms": self.mode_since_ms, "status": self.status,
                "reason": self.reason, "paused_since_ms": self.paused_since_ms}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RegionRollout:
        """Inverse of `to_dict`; a rollout stored before regions existed is one leg."""
        if "legs" not in data:
            return single(RolloutState.from_dict(data))
        legs = tuple(RolloutState.from_dict(leg) for leg in data["legs"])
        return cls(**{**data, "legs": legs})


def begin(legs: list[RolloutState], now_ms: int = 0) -> RegionRollout:
    """A rollout over these legs (one per region, in order) that has taken no step yet."""
    if not legs:
        raise ValueError("a rollout needs at least one region")
    return RegionRollout(legs=tuple(legs), mode_since_ms=now_ms)


def single(state: RolloutState) -> RegionRollout:
    """A one-region rollout wrapping a leg as it stands (its status and all)."""
    mode = ROLLING if state.status == RUNNING else DONE
    return RegionRollout(legs=(state,), mode=mode, mode_since_ms=state.phase_since_ms,
                         status=state.status, reason=state.reason)


def watched(state: RegionRollout) -> list[RolloutState]:
    """The legs `step` needs an observation of (keyed by their region)."""
    if state.mode == ROLLING:
        return [state.leg]
    if state.mode == BAKE:
        return list(state.legs[state.index:state.index + 2])
    if state.mode == UNWIND:
        return [leg for leg in state.legs if leg.status == RUNNING]
    return []


def step(state: RegionRollout, observations: Mapping[str, Observation],
         now_ms: int) -> Decision[RegionRollout] | None:
    """Advance the rollout by at most one step of each watched leg; None when nothing changes
    (and always while paused)."""
    if state.is_done or state.paused_since_ms is not None:
        return None
    if state.mode == ROLLING:
        decision = rollout.step(state.leg, observations[state.region], now_ms)
        return None if decision is None else _after_leg(state, decision, now_ms)
    if state.mode == BAKE:
        return _bake(state, observations, now_ms)
    return _unwind(state, observations, now_ms)


def abort(state: RegionRollout, reason: str, now_ms: int) -> Decision[RegionRollout] | None:
    """An operator rolls the rollout back: every region it reached, whatever the policy (a
    paused rollout too: the pause ends)."""
    if state.is_done or state.mode == UNWIND:
        return None
    state = replace(state, paused_since_ms=None)
    if state.mode == BAKE:
        undone = revert(state.leg, f"rollback requested: {reason}", now_ms)
    else:
        undone = rollout.abort(state.leg, reason, now_ms)
        if undone is None:
            return None
    return _fail(state, undone, now_ms, roll_back_all=True)


def resume(state: RegionRollout, paused_ms: int, reason: str) -> Decision[RegionRollout] | None:
    """The plane was paused `paused_ms`: every running leg's timers and the bake move on (not
    those of a rollout an operator paused: `unpause` moves them for its whole pause)."""
    if state.is_done or paused_ms <= 0 or state.paused_since_ms is not None:
        return None
    legs = list(state.legs)
    for i in _started(state):
        decision = rollout.resume(legs[i], paused_ms, reason)
        if decision is not None:
            legs[i] = decision.state
    nxt = replace(state, legs=tuple(legs), mode_since_ms=state.mode_since_ms + paused_ms)
    return Decision(nxt, [], f"paused {paused_ms} ms ({reason}); {state.region} {state.phase} "
                    "timers moved on by as much")


def can_pause(state: RegionRollout) -> str | None:
    """Why this rollout cannot be paused now, or None when it can."""
    if state.is_done:
        return f"it is {state.status}"
    if state.paused_since_ms is not None:
        return "it is already paused"
    if state.mode == UNWIND or state.leg.phase == ROLL_BACK:
        return "it is rolling back (a rollback restores the old version and is never held)"
    return None


def pause(state: RegionRollout, now_ms: int, by: str) -> Decision[RegionRollout]:
    """Hold the rollout where it stands: no step, analysis or timer until `unpause`."""
    nxt = replace(state, paused_since_ms=now_ms)
    return Decision(nxt, [], f"paused by {by} at stage {state.leg.stage_index + 1}/"
                    f"{len(state.leg.config.stages)} ({state.phase}, {state.leg.weight_new}% "
                    f"on {state.to_version}{_where(state)}); it holds until resumed")


def unpause(state: RegionRollout, now_ms: int, by: str) -> Decision[RegionRollout]:
    """Continue a paused rollout from where it stood, its timers moved on by the pause."""
    assert state.paused_since_ms is not None
    held = max(0, now_ms - state.paused_since_ms)
    going = replace(state, paused_since_ms=None)
    moved = resume(going, held, f"paused by {by}")
    nxt = going if moved is None else moved.state
    return Decision(nxt, [], f"resumed by {by} after {held / 1000:.1f} s paused: {nxt.phase} "
                    f"continues at stage {nxt.leg.stage_index + 1}/{len(nxt.leg.config.stages)}"
                    f"{_where(nxt)}, its timers moved on by the pause")


def _where(state: RegionRollout) -> str:
    return "" if len(state.legs) == 1 else f" in {state.region}"


def revert(leg: RolloutState, reason: str, now_ms: int) -> Decision[RolloutState]:
    """Roll back a leg that succeeded: its region goes back to the version it had."""
    old, new = leg.from_version, leg.to_version
    region = leg.region
    if old is not None and leg.config.strategy == "red-black":
        # the old version was drained after the warm delay: it scales up, traffic follows
        return rollout.roll_back(replace(leg, status=RUNNING), reason, now_ms)
    actions: list[Action] = []
    latest, split = leg.latest, leg.split
    if old is not None and latest == new:
        latest = old
        actions.append(MoveAlias(leg.model, LATEST, old, region=region))
    if old is None:
        # the model was not in this region before: no unversioned route is left to a version
        # with no instances (requests for it get the gateway's clear 404)
        split = {}
        actions.append(SetSplit(leg.model, {}, region=region))
    actions.append(Scale(leg.model, new, 0, region=region))
    nxt = replace(leg, status=ROLLED_BACK, phase="done", phase_since_ms=now_ms, reason=reason,
                  desired={**leg.desired, new: 0}, latest=latest, split=split)
    return Decision[RolloutState](nxt, actions, f"{reason}; stopping {new}"
                            + (f", {LATEST} back on {old}" if latest == old else "")
                            + (", its route removed" if old is None else ""))


# ----------------------------------------------------------------------------------------


def _after_leg(state: RegionRollout, decision: Decision[RolloutState],
               now_ms: int) -> Decision[RegionRollout]:
    leg = decision.state
    note = _tagged(state, leg, decision.note)
    if leg.phase == ROLL_BACK or leg.status in (ROLLED_BACK, FAILED):
        return _fail(state, decision, now_ms)
    state = _with_leg(state, state.index, leg)
    if leg.status == RUNNING:
        return Decision(state, decision.actions, note)
    assert leg.status == SUCCEEDED
    if state.index + 1 == len(state.legs):
        done = replace(state, mode=DONE, mode_since_ms=now_ms, status=SUCCEEDED)
        return Decision(done, decision.actions, f"{note}; every region ({', '.join(state.order)})"
                        f" on {state.to_version}")
    after = state.legs[state.index + 1].region
    baking = replace(state, mode=BAKE, mode_since_ms=now_ms)
    return Decision(baking, decision.actions, f"{note}; {leg.region} done: baking "
                    f"{state.config.bake_ms} ms before {after}")


def _bake(state: RegionRollout, observations: Mapping[str, Observation],
          now_ms: int) -> Decision[RegionRollout] | None:
    leg = state.leg
    crashes = observations[leg.region].new.num_crashes - leg.crash_baseline
    if crashes > 0:
        reason = (f"{state.model}@{state.to_version} crashed ({crashes} times) while "
                  f"{leg.region} baked")
        return _fail(state, revert(leg, reason, now_ms), now_ms)
    if now_ms - state.mode_since_ms < state.config.bake_ms:
        return None
    index = state.index + 1
    nxt = replace(state, index=index, mode=ROLLING, mode_since_ms=now_ms)
    first = rollout.step(nxt.leg, observations[nxt.region], now_ms)
    assert first is not None  # a leg's first step always starts instances
    baked = f"{leg.region} baked {now_ms - state.mode_since_ms} ms; {nxt.region} starts"
    return Decision(_with_leg(nxt, index, first.state), first.actions,
                    f"{baked}: {nxt.region}: {first.note}")


def _fail(state: RegionRollout, decision: Decision[RolloutState], now_ms: int, *,
          roll_back_all: bool | None = None) -> Decision[RegionRollout]:
    """Region `index` began rolling back: stop the later regions, undo the earlier ones or not."""
    k, failed = state.index, decision.state
    if roll_back_all is None:
        roll_back_all = state.config.region_failure == "roll-back-all"
    reason = _tagged(state, failed, failed.reason)
    legs = list(state.legs)
    legs[k] = failed
    actions, notes = list(decision.actions), [_tagged(state, failed, decision.note)]
    for i in range(k + 1, len(legs)):
        legs[i] = replace(legs[i], status=SKIPPED, phase="done")
    earlier = [leg.region for leg in legs[:k]]
    if earlier and roll_back_all:
        for i in range(k):
            undone = revert(legs[i], f"{reason} (rolling back every region)", now_ms)
            legs[i] = undone.state
            actions += undone.actions
        notes.append(f"rolling back {', '.join(earlier)} too")
    elif earlier:
        notes.append(f"{', '.join(earlier)} keep {state.to_version}")
    nxt = replace(state, legs=tuple(legs), mode=UNWIND, mode_since_ms=now_ms, reason=reason)
    return Decision(_finish_unwind(nxt, now_ms), actions, "; ".join(notes))


def _unwind(state: RegionRollout, observations: Mapping[str, Observation],
            now_ms: int) -> Decision[RegionRollout] | None:
    legs, actions, notes = list(state.legs), [], []
    for i, leg in enumerate(legs):
        if leg.status != RUNNING:
            continue
        decision = rollout.step(leg, observations[leg.region], now_ms)
        if decision is not None:
            legs[i] = decision.state
            actions += decision.actions
            notes.append(_tagged(state, leg, decision.note))
    if not notes:
        return None
    nxt = _finish_unwind(replace(state, legs=tuple(legs)), now_ms)
    return Decision(nxt, actions, "; ".join(notes))


def _finish_unwind(state: RegionRollout, now_ms: int) -> RegionRollout:
    if any(leg.status == RUNNING for leg in state.legs):
        return state
    return replace(state, mode=DONE, mode_since_ms=now_ms, status=state.leg.status)


def _tagged(state: RegionRollout, leg: RolloutState, text: str) -> str:
    """A leg's note or reason, naming its region where the rollout has several."""
    return text if len(state.legs) == 1 else f"{leg.region}: {text}"


def _with_leg(state: RegionRollout, index: int, leg: RolloutState) -> RegionRollout:
    legs = list(state.legs)
    legs[index] = leg
    return replace(state, legs=tuple(legs))


def _started(state: RegionRollout) -> list[int]:
    return [i for i, leg in enumerate(state.legs) if leg.status == RUNNING and (
        i <= state.index or state.mode == UNWIND)]


def progress(state: RegionRollout) -> list[dict[str, Any]]:
    """Per region, in order: where its leg stands (for `podium status` and `rollouts`)."""
    rows = []
    for i, leg in enumerate(state.legs):
        status = leg.status
        if status == RUNNING and i > state.index:
            status = PENDING
        phase = BAKE if (i == state.index and state.mode == BAKE) else leg.phase
        rows.append({"region": leg.region, "from_version": leg.from_version, "status": status,
                     "phase": "-" if status == PENDING else phase,
                     "stage": f"{leg.stage_index + 1}/{len(leg.config.stages)}",
                     "weight_new": leg.weight_new, "reason": leg.reason})
    return rows

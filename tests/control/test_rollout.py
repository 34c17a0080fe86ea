"""The rollout controller as a pure state machine on a fake clock."""

from __future__ import annotations

import re

import pytest

from podium.control import rollout
from podium.control.actions import MoveAlias, Scale, SetSplit
from podium.control.rollout import (
    Observation,
    RolloutState,
    VersionHealth,
    judge_errors,
    judge_latency,
)
from podium.control.rollout_config import RolloutConfig
from podium.errors import InvalidArgument
from tests.support.fake_world import Behaviour, FakeWorld

FAST = dict(ready_timeout_ms=5_000, analysis_window_ms=2_000, warm_delay_ms=3_000,
            min_requests=10)


def run(state: RolloutState, world: FakeWorld, *, until_ms: int = 120_000,
        tick_ms: int = 100) -> tuple[RolloutState, list[str]]:
    """Step the controller on the fake clock until done; returns final state and notes."""
    notes = []
    # the world as it stood before the rollout: the old version scaled and taking all traffic
    world.apply([Scale(state.model, v, n) for v, n in state.desired.items()]
                + ([SetSplit(state.model, dict(state.split))] if state.split else []))
    while not state.is_done and world.now_ms <= until_ms:
        decision = rollout.step(state, world.observe(state, state.phase_since_ms), world.now_ms)
        if decision is not None:
            state = decision.state
            world.apply(decision.actions)
            notes.append(decision.note)
        world.now_ms += tick_ms
    return state, notes


def test_red_black_shifts_in_stages_scaling_new_up_as_old_scales_down() -> None:
    world = FakeWorld()
    config = RolloutConfig(stages=(10, 25, 50, 100), num_instances=4, **FAST)
    state, _ = run(rollout.begin("iris", "2", "1", config, num_old=4), world)

    assert state.status == rollout.SUCCEEDED
    splits = [a.weights for a in world.applied if isinstance(a, SetSplit)]
    assert splits == [{"1": 100}, {"1": 90, "2": 10}, {"1": 75, "2": 25}, {"1": 50, "2": 50},
                      {"1": 0, "2": 100}, {"2": 100}]
    scales = [(a.version, a.count) for a in world.applied if isinstance(a, Scale)]
    # old shrinks by the share new grows; one old instance stays warm until the delay passes
    assert scales == [("1", 4), ("2", 1), ("1", 4), ("2", 1), ("1", 3), ("2", 2), ("1", 2),
                      ("2", 4), ("1", 1), ("1", 0)]
    assert world.count("iris", "1") == 0 and world.count("iris", "2") == 4
    assert world.aliases[("iris", "latest")] == "2"


def test_traffic_moves_only_after_the_new_instances_are_ready() -> None:
    world = FakeWorld(behaviour={"2": Behaviour(startup_ms=4_000)})
    config = RolloutConfig(stages=(50, 100), num_instances=2, **FAST)
    state = rollout.begin("iris", "2", "1", config, num_old=2)
    state, _ = run(state, world, until_ms=3_900)
    assert state.phase == "wait_ready"
    assert world.split["iris"] == {"1": 100}
    state, _ = run(state, world, until_ms=4_200)
    assert world.split["iris"] == {"1": 50, "2": 50}


def test_old_instances_stay_warm_for_the_delay_after_success() -> None:
    world = FakeWorld()
    config = RolloutConfig(stages=(100,), num_instances=1, **FAST)
    state, _ = run(rollout.begin("iris", "2", "1", config, num_old=2), world, until_ms=3_500)
    assert (state.phase, world.split["iris"]) == ("warm", {"1": 0, "2": 100})
    assert world.count("iris", "1") == 1
    state, _ = run(state, world)
    assert state.status == rollout.SUCCEEDED
    assert world.count("iris", "1") == 0


def test_first_version_takes_all_traffic_once_ready() -> None:
    world = FakeWorld()
    state, _ = run(rollout.begin("iris", "1", None, RolloutConfig(num_instances=2, **FAST)),
                   world)
    assert state.status == rollout.SUCCEEDED
    assert world.split["iris"] == {"1": 100}
    assert world.count("iris", "1") == 2


@pytest.mark.parametrize(("behaviour", "reason"), [
    (Behaviour(ready=False), "not ready after 5000 ms"),
    (Behaviour(crash_at_ms=3_000), "crashed"),
    (Behaviour(error_rate=0.2), "error rate 20.0% vs 0.0%"),
    (Behaviour(p99_ms=200.0), "p99 latency 200.0 ms over 20 requests vs 20.0 ms over 180"),
], ids=["never-ready", "crash", "errors", "slow"])
def test_a_bad_new_version_rolls_back_to_all_old(behaviour: Behaviour, reason: str) -> None:
    world = FakeWorld(behaviour={"2": behaviour})
    config = RolloutConfig(stages=(10, 50, 100), num_instances=2, **FAST)
    state, notes = run(rollout.begin("iris", "2", "1", config, num_old=2), world)

    assert state.status == rollout.ROLLED_BACK
    assert reason in state.reason and reason in notes[-1]
    assert world.split["iris"] == {"1": 100, "2": 0}
    assert world.count("iris", "1") == 2 and world.count("iris", "2") == 0
    # the rollback is one decision: the split flips before any scaling
    last = world.applied[-3:]
    assert isinstance(last[0], SetSplit) and last[0].weights == {"1": 100, "2": 0}


def test_crash_during_warm_delay_rolls_back_and_restores_latest() -> None:
    world = FakeWorld(behaviour={"2": Behaviour(crash_at_ms=4_000)})
    config = RolloutConfig(stages=(100,), num_instances=1, **FAST)
    state, _ = run(rollout.begin("iris", "2", "1", config, num_old=1), world)
    assert state.status == rollout.ROLLED_BACK
    assert world.aliases[("iris", "latest")] == "1"
    assert world.split["iris"] == {"1": 100, "2": 0}


def test_first_version_that_never_gets_ready_fails_without_touching_routing() -> None:
    world = FakeWorld(behaviour={"1": Behaviour(ready=False)})
    state, _ = run(rollout.begin("iris", "1", None, RolloutConfig(**FAST)), world)
    assert state.status == rollout.FAILED
    assert "iris" not in world.split
    assert world.count("iris", "1") == 0


def test_versioned_moves_latest_only_when_the_new_version_is_ready() -> None:
    world = FakeWorld(behaviour={"2": Behaviour(startup_ms=2_000)},
                      aliases={("iris", "latest"): "1"})
    world.apply([Scale("iris", "1", 1)])
    config = RolloutConfig(strategy="versioned", **FAST)
    state = rollout.begin("iris", "2", "1", config, num_old=1)
    state, _ = run(state, world, until_ms=1_900)
    assert world.aliases[("iris", "latest")] == "1"
    state, _ = run(state, world)
    assert state.status == rollout.SUCCEEDED
    assert world.aliases[("iris", "latest")] == "2"
    # both versions keep running side by side
    assert world.count("iris", "1") == 1 and world.count("iris", "2") == 1


def test_versioned_failure_leaves_latest_and_old_version_alone() -> None:
    world = FakeWorld(behaviour={"2": Behaviour(ready=False)},
                      aliases={("iris", "latest"): "1"})
    world.apply([Scale("iris", "1", 1)])
    state, _ = run(rollout.begin("iris", "2", "1", RolloutConfig(strategy="versioned", **FAST),
                                 num_old=1), world)
    assert state.status == rollout.FAILED
    assert world.aliases[("iris", "latest")] == "1"
    assert world.count("iris", "1") == 1 and world.count("iris", "2") == 0


def test_abort_rolls_back_a_running_rollout_and_ignores_a_finished_one() -> None:
    world = FakeWorld()
    config = RolloutConfig(stages=(10, 100), **FAST)
    state, _ = run(rollout.begin("iris", "2", "1", config, num_old=1), world, until_ms=1_500)
    decision = rollout.abort(state, "operator", world.now_ms)
    assert decision is not None
    assert decision.state.status == rollout.ROLLED_BACK
    assert "rollback requested: operator" in decision.state.reason
    assert rollout.abort(decision.state, "again", world.now_ms) is None


def test_state_round_trips_through_json() -> None:
    state = rollout.begin("iris", "2", "1", RolloutConfig(stages=(5, 100)), num_old=3)
    import json
    assert RolloutState.from_dict(json.loads(json.dumps(state.to_dict()))) == state


@pytest.mark.parametrize(("new", "old", "errors", "latency"), [
    (VersionHealth(num_requests=5, num_errors=5, p99_ms=90.0), VersionHealth(p99_ms=20.0),
     None, None),
    (VersionHealth(num_requests=100, num_errors=1), VersionHealth(num_requests=100), None, None),
    (VersionHealth(num_requests=100, num_errors=5), VersionHealth(num_requests=100, num_errors=4),
     None, None),
    (VersionHealth(num_requests=100, num_errors=3), VersionHealth(num_requests=100),
     "error rate 3.0% vs 0.0%", None),
    (VersionHealth(num_requests=100, p99_ms=32.0), VersionHealth(num_requests=100, p99_ms=20.0),
     None, None),
    (VersionHealth(num_requests=100, p99_ms=40.0), VersionHealth(num_requests=100, p99_ms=20.0),
     None, "p99 latency 40.0 ms"),
], ids=["too-few-requests", "within-tolerance", "same-as-old", "more-errors", "p99-within",
        "p99-slow"])
def test_analysis_judgement(new: VersionHealth, old: VersionHealth, errors: str | None,
                            latency: str | None) -> None:
    config = RolloutConfig(min_requests=20, max_error_rate_increase=0.01, max_p99_ratio=1.5)
    obs = Observation(new=new, old=old)
    for verdict, expect in ((judge_errors(config, obs), errors),
                            (judge_latency(config, obs), latency)):
        assert (verdict is None) if expect is None else (expect in verdict)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"stages": (50, 25, 100)}, "stages"),
    ({"stages": (10, 50)}, "stages"),
    ({"stages": (0, 100)}, "stages"),
    ({"stages": ()}, "stages"),
    ({"strategy": "blue-green"}, "strategy"),
    ({"num_instances": 0}, "num_instances"),
    ({"max_p99_ratio": 0.5}, "max_p99_ratio"),
    ({"latency_checks": 0}, "latency_checks"),
    ({"ready_timeout_ms": -1}, "ready_timeout_ms"),
], ids=["decreasing", "not-ending-at-100", "zero-stage", "empty", "unknown-strategy",
        "no-instances", "ratio-below-1", "no-latency-checks", "negative-timeout"])
def test_bad_config_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        RolloutConfig(**kwargs)
    assert info.value.param == field
    assert field in info.value.message


def test_alias_moves_at_full_traffic_in_red_black() -> None:
    world = FakeWorld()
    run(rollout.begin("iris", "2", "1", RolloutConfig(stages=(100,), **FAST), num_old=1), world,
        until_ms=3_500)
    assert MoveAlias("iris", "latest", "2") in world.applied


@pytest.mark.parametrize(("new_p99", "status"), [(25.0, rollout.RUNNING),
                                                 (90.0, rollout.ROLLED_BACK)],
                         ids=["like-baseline", "slower-than-baseline"])
def test_full_traffic_stage_is_judged_against_the_old_versions_last_window(
        new_p99: float, status: str) -> None:
    config = RolloutConfig(stages=(50, 100), min_requests=10, analysis_window_ms=1_000)
    state = rollout.begin("iris", "2", "1", config, num_old=1)
    both = Observation(new=VersionHealth(num_ready=1, num_requests=50, p99_ms=20.0),
                       old=VersionHealth(num_ready=1, num_requests=50, p99_ms=20.0))
    for now in (0, 10, 1_100, 1_200):  # start, ready at 50%, analysis passes, ready at 100%
        decision = rollout.step(state, both, now)
        assert decision is not None
        state = decision.state
    assert (state.weight_new, state.baseline) == (100, {"num_requests": 50, "num_errors": 0,
                                                        "p99_ms": 20.0})
    # at 100% the old version serves nothing: its empty window must not decide the verdict
    alone = Observation(new=VersionHealth(num_ready=1, num_requests=50, p99_ms=new_p99),
                        old=VersionHealth(num_ready=1))
    decision = rollout.step(state, alone, 2_300)
    assert decision is not None and decision.state.status == rollout.RUNNING
    if status == rollout.ROLLED_BACK:  # a slow window is judged again before it rolls back
        assert decision.state.latency_strikes == 1
        decision = rollout.step(decision.state, alone, 3_400)
    assert decision is not None and decision.state.status == status


def _at_first_analysis(config: RolloutConfig) -> RolloutState:
    state = rollout.begin("iris", "2", "1", config, num_old=1)
    ready = Observation(new=VersionHealth(num_ready=1), old=VersionHealth(num_ready=1))
    for now in (0, 10):  # start, ready: traffic moves and the first window opens
        decision = rollout.step(state, ready, now)
        assert decision is not None
        state = decision.state
    assert state.phase == "analyze"
    return state


SLOW = Observation(new=VersionHealth(num_ready=1, num_requests=50, p99_ms=600.0),
                   old=VersionHealth(num_ready=1, num_requests=50, p99_ms=20.0))
FINE = Observation(new=VersionHealth(num_ready=1, num_requests=50, p99_ms=21.0),
                   old=VersionHealth(num_ready=1, num_requests=50, p99_ms=20.0))


def test_one_slow_window_is_judged_again_and_passes_when_it_does_not_repeat() -> None:
    state = _at_first_analysis(RolloutConfig(stages=(50, 100), analysis_window_ms=1_000))
    decision = rollout.step(state, SLOW, 1_010)
    assert decision is not None and decision.actions == []
    assert "judging a new window (1/2)" in decision.note
    state = decision.state
    assert (state.status, state.phase_since_ms) == (rollout.RUNNING, 1_010)
    assert rollout.step(state, FINE, 1_500) is None  # the new window is not over yet
    decision = rollout.step(state, FINE, 2_010)
    assert decision is not None and "analysis passed at 50%" in decision.note
    assert decision.state.latency_strikes == 0


@pytest.mark.parametrize(("checks", "rolled_back_at"), [(1, 1_010), (3, 3_010)])
def test_latency_rolls_back_after_latency_checks_slow_windows(checks: int,
                                                               rolled_back_at: int) -> None:
    config = RolloutConfig(stages=(50, 100), analysis_window_ms=1_000, latency_checks=checks)
    state = _at_first_analysis(config)
    for now in range(1_010, 5_000, 1_000):
        decision = rollout.step(state, SLOW, now)
        assert decision is not None
        state = decision.state
        if state.is_done:
            break
    assert (state.status, state.phase_since_ms) == (rollout.ROLLED_BACK, rolled_back_at)
    assert "p99 latency 600.0 ms over 50 requests vs 20.0 ms over 50" in state.reason


def test_errors_roll_back_in_the_first_window_whatever_latency_checks_says() -> None:
    state = _at_first_analysis(RolloutConfig(stages=(50, 100), analysis_window_ms=1_000,
                                             latency_checks=5))
    failing = Observation(new=VersionHealth(num_ready=1, num_requests=50, num_errors=10),
                          old=VersionHealth(num_ready=1, num_requests=50))
    decision = rollout.step(state, failing, 1_010)
    assert decision is not None and decision.state.status == rollout.ROLLED_BACK
    assert "error rate 20.0%" in decision.state.reason


def test_new_version_that_stops_being_ready_holds_then_rolls_back() -> None:
    world = FakeWorld(behaviour={"2": Behaviour(unready_from_ms=2_000)})
    config = RolloutConfig(stages=(50, 100), num_instances=1, **FAST)
    state, notes = run(rollout.begin("iris", "2", "1", config, num_old=1), world)
    assert state.status == rollout.ROLLED_BACK
    assert "stopped being ready for 5000 ms" in state.reason
    assert any("not ready (0/1); holding" in n for n in notes)
    assert world.split["iris"] == {"1": 100, "2": 0}


def test_a_brief_readiness_blip_only_delays_the_rollout() -> None:
    world = FakeWorld(behaviour={"2": Behaviour(unready_from_ms=2_000, unready_until_ms=3_000)})
    config = RolloutConfig(stages=(50, 100), num_instances=1, **FAST)
    state, notes = run(rollout.begin("iris", "2", "1", config, num_old=1), world)
    assert state.status == rollout.SUCCEEDED
    assert any("ready again" in n for n in notes)


def test_each_verdict_carries_the_numbers_it_was_judged_on() -> None:
    world = FakeWorld(behaviour={"2": Behaviour(p99_ms=30.0)})
    config = RolloutConfig(stages=(50, 100), num_instances=2, max_p99_ratio=2.0, **FAST)
    state, notes = run(rollout.begin("iris", "2", "1", config, num_old=2), world)
    assert state.status == rollout.SUCCEEDED
    passed = [n for n in notes if n.startswith("analysis passed")]
    assert len(passed) == 2
    # both versions' requests, errors and p99 over the window, as the console's timeline shows
    assert re.search(r"at 50%; scaling 2 to 2 \(2: \d+ requests, 0 errors, p99 30\.0 ms; "
                     r"1: \d+ requests, 0 errors, p99 20\.0 ms\)$", passed[0]), passed[0]
    world = FakeWorld(behaviour={"2": Behaviour(error_rate=0.5)})
    state, _ = run(rollout.begin("iris", "2", "1", config, num_old=2), world)
    assert re.search(r"error rate 50\.0% vs 0\.0% on the old version \(allowed \+1\.0%; \d+ of "
                     r"\d+ requests failed vs 0 of \d+\)", state.reason), state.reason

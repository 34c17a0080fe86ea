"""Rollouts region by region: the region controller as a pure state machine on a fake clock."""

from __future__ import annotations

import json

import pytest

from podium.control import region_rollout, rollout
from podium.control.actions import Scale
from podium.control.region_rollout import RegionRollout
from podium.control.rollout_config import RolloutConfig
from tests.support.fake_regions import FakeRegions, legs, run
from tests.support.fake_world import Behaviour

BAKE_MS = 5_000
FAST = dict(stages=(50, 100), num_instances=2, ready_timeout_ms=5_000,
            analysis_window_ms=2_000, warm_delay_ms=1_000, min_requests=10, bake_ms=BAKE_MS)


def _serving_v1(regions: FakeRegions) -> None:
    regions.apply(regions.serving("1", 2))
    regions.log.clear()


def _done_at(regions: FakeRegions, region: str) -> int:
    """When `region`'s leg finished: its old version was stopped after the warm delay."""
    return next(t for t, a in regions.log if isinstance(a, Scale) and a.region == region
                and a.version == "1" and a.count == 0)


def test_regions_go_one_after_the_other_each_after_the_last_one_baked() -> None:
    regions = FakeRegions()
    _serving_v1(regions)
    state, notes = run(legs(regions, RolloutConfig(**FAST)), regions)

    assert state.status == rollout.SUCCEEDED, state.reason
    starts = [regions.first_scale(r, "2") for r in "abc"]
    assert starts[0] == 0
    # region k+1 starts only once region k finished (stages, analysis, warm) and baked
    for before, after, start in (("a", "b", starts[1]), ("b", "c", starts[2])):
        assert start is not None and start >= _done_at(regions, before) + BAKE_MS, (before, after)
        assert start < _done_at(regions, before) + BAKE_MS + 200  # and not much later
    for name in "abc":
        world = regions.worlds[name]
        assert world.split["iris"] == {"2": 100} and world.aliases[("iris", "latest")] == "2"
        assert world.count("iris", "2") == 2 and world.count("iris", "1") == 0
    assert any("a done: baking 5000 ms before b" in n for n in notes)
    assert "every region (a, b, c) on 2" in notes[-1]


def test_the_order_given_is_kept_and_other_regions_are_left_alone() -> None:
    regions = FakeRegions()
    _serving_v1(regions)
    state, _ = run(legs(regions, RolloutConfig(**FAST), order=("c", "a")), regions)

    assert state.status == rollout.SUCCEEDED
    assert regions.first_scale("c", "2") == 0
    assert regions.first_scale("a", "2") >= _done_at(regions, "c") + BAKE_MS
    assert regions.touched("b") == []
    assert regions.worlds["b"].split["iris"] == {"1": 100}


def test_a_zero_bake_starts_the_next_region_on_the_step_the_last_one_finished() -> None:
    regions = FakeRegions(names=("a", "b"))
    _serving_v1(regions)
    state, _ = run(legs(regions, RolloutConfig(**{**FAST, "bake_ms": 0})), regions)
    assert state.status == rollout.SUCCEEDED
    assert regions.first_scale("b", "2") - _done_at(regions, "a") <= 100  # one tick


@pytest.mark.parametrize("policy", ["roll-back-all", "keep-earlier"])
@pytest.mark.parametrize("failing", ["a", "b", "c"])
def test_a_failure_in_region_k_rolls_it_back_and_never_reaches_the_later_ones(
        failing: str, policy: str) -> None:
    regions = FakeRegions(behaviour={(failing, "2"): Behaviour(error_rate=0.5)})
    _serving_v1(regions)
    state, notes = run(legs(regions, RolloutConfig(**FAST, region_failure=policy)), regions)

    assert state.status == rollout.ROLLED_BACK
    assert state.reason.startswith(f"{failing}: analysis failed at 50%: error rate 50.0%")
    k = "abc".index(failing)
    bad = regions.worlds[failing]
    assert bad.split["iris"] == {"1": 100, "2": 0} and bad.count("iris", "2") == 0
    assert bad.count("iris", "1") == 2
    for later in "abc"[k + 1:]:
        assert regions.touched(later) == [], later  # never started
        assert regions.worlds[later].split["iris"] == {"1": 100}
    view = {row["region"]: row["status"] for row in region_rollout.progress(state)}
    assert view[failing] == rollout.ROLLED_BACK
    for earlier in "abc"[:k]:
        world = regions.worlds[earlier]
        if policy == "roll-back-all":
            # the old version booted again, took the traffic back, and the new one stopped
            assert {v: w for v, w in world.split["iris"].items() if w} == {"1": 100}
            assert world.count("iris", "1") == 2 and world.count("iris", "2") == 0
            assert world.aliases[("iris", "latest")] == "1"
            assert view[earlier] == rollout.ROLLED_BACK
        else:
            assert world.split["iris"] == {"2": 100} and world.count("iris", "2") == 2
            assert world.aliases[("iris", "latest")] == "2"
            assert view[earlier] == rollout.SUCCEEDED
    if k and policy == "keep-earlier":
        assert any(f"{', '.join('abc'[:k])} keep 2" in n for n in notes)


def test_the_failing_region_rolls_back_at_once_while_earlier_ones_ramp_back() -> None:
    regions = FakeRegions(names=("a", "b"), behaviour={("b", "2"): Behaviour(error_rate=0.5)})
    _serving_v1(regions)
    state, _ = run(legs(regions, RolloutConfig(**FAST)), regions)
    failed_at = next(t for t, a in regions.log if a.region == "b" and getattr(
        a, "weights", None) == {"1": 100, "2": 0})
    # in the same step: b's traffic all back on 1, a's old version asked for again
    assert any(t == failed_at and isinstance(a, Scale) and a.region == "a" and a.version == "1"
               and a.count == 2 for t, a in regions.log)
    assert state.status == rollout.ROLLED_BACK


def test_a_crash_while_baking_rolls_that_region_back_before_the_next_starts() -> None:
    regions = FakeRegions(names=("a", "b"))
    _serving_v1(regions)
    state, _ = run(legs(regions, RolloutConfig(**FAST)), regions, until_ms=9_000)
    assert state.mode == region_rollout.BAKE
    regions.worlds["a"].behaviour["2"] = Behaviour(crash_at_ms=regions.now_ms)
    state, _ = run(state, regions)
    assert state.status == rollout.ROLLED_BACK
    assert "crashed (1 times) while a baked" in state.reason
    assert regions.touched("b") == []
    assert regions.worlds["a"].aliases[("iris", "latest")] == "1"
    assert regions.worlds["a"].count("iris", "2") == 0


def test_an_operator_rollback_while_baking_rolls_back_every_region_even_keep_earlier() -> None:
    regions = FakeRegions()
    _serving_v1(regions)
    config = RolloutConfig(**FAST, region_failure="keep-earlier")
    state, _ = run(legs(regions, config), regions,
                   stop=lambda s: (s.mode, s.region) == (region_rollout.BAKE, "b"))
    assert (state.mode, state.region) == (region_rollout.BAKE, "b")
    decision = region_rollout.abort(state, "by operator", regions.now_ms)
    assert decision is not None
    regions.apply(decision.actions)
    state, _ = run(decision.state, regions)
    assert state.status == rollout.ROLLED_BACK
    for name in ("a", "b"):
        assert regions.worlds[name].count("iris", "2") == 0
        assert regions.worlds[name].aliases[("iris", "latest")] == "1"
    assert regions.touched("c") == []
    assert region_rollout.abort(state, "again", regions.now_ms) is None


def test_versioned_moves_latest_region_by_region_and_rolls_it_back_everywhere() -> None:
    regions = FakeRegions(names=("a", "b"), behaviour={("b", "2"): Behaviour(ready=False)})
    _serving_v1(regions)
    config = RolloutConfig(strategy="versioned", num_instances=1, ready_timeout_ms=3_000,
                           bake_ms=2_000)
    state, _ = run(legs(regions, config), regions, until_ms=3_000)
    assert regions.worlds["a"].aliases[("iris", "latest")] == "2"
    assert regions.worlds["b"].aliases[("iris", "latest")] == "1"
    state, _ = run(state, regions)
    assert state.status == rollout.FAILED  # b's v2 never got ready: b kept its routing
    a = regions.worlds["a"]
    assert a.aliases[("iris", "latest")] == "1" and a.count("iris", "2") == 0
    assert a.count("iris", "1") == 2  # versioned never touched the old one
    assert regions.worlds["b"].aliases[("iris", "latest")] == "1"


def test_a_pause_moves_the_bake_on_as_long() -> None:
    regions = FakeRegions(names=("a", "b"))
    _serving_v1(regions)
    state, _ = run(legs(regions, RolloutConfig(**FAST)), regions, until_ms=9_000)
    assert state.mode == region_rollout.BAKE
    resumed = region_rollout.resume(state, 60_000, "database unreachable")
    assert resumed is not None and resumed.actions == []
    assert resumed.state.mode_since_ms == state.mode_since_ms + 60_000
    assert "paused 60000 ms" in resumed.note


def test_progress_shows_each_region_pending_running_baking() -> None:
    regions = FakeRegions()
    _serving_v1(regions)
    state, _ = run(legs(regions, RolloutConfig(**FAST)), regions, until_ms=1_000)
    rows = region_rollout.progress(state)
    assert [(r["region"], r["status"]) for r in rows] == [
        ("a", "running"), ("b", "pending"), ("c", "pending")]
    assert rows[0]["phase"] in ("wait_ready", "analyze") and rows[1]["phase"] == "-"
    state, _ = run(state, regions, until_ms=9_000)
    assert [(r["status"], r["phase"]) for r in region_rollout.progress(state)][:2] == [
        ("succeeded", "bake"), ("pending", "-")]
    assert state.phase == "bake"


def test_the_state_round_trips_through_json_and_a_pre_region_state_is_one_leg() -> None:
    regions = FakeRegions()
    state, _ = run(legs(regions, RolloutConfig(**FAST)), regions, until_ms=1_000)
    assert RegionRollout.from_dict(json.loads(json.dumps(state.to_dict()))) == state
    old = rollout.begin("iris", "2", "1", RolloutConfig(), num_old=2).to_dict()
    del old["region"]  # stored before regions existed
    loaded = RegionRollout.from_dict(old)
    assert loaded.order == ("default",) and loaded.phase == "start" and not loaded.is_done


def test_rolling_back_a_region_the_model_was_new_in_removes_its_route() -> None:
    """a is new to the model, b serves 1; 2 fails in b, so a (which had no earlier version)
    is rolled back to having none: no instances and no split left pointing at 2."""
    regions = FakeRegions(names=("a", "b"), behaviour={("b", "2"): Behaviour(error_rate=0.5)})
    regions.apply([a for a in regions.serving("1", 2) if a.region == "b"])  # 1 only in b
    config = RolloutConfig(**FAST)
    state = region_rollout.begin([
        rollout.begin("iris", "2", None, config, region="a", now_ms=0),
        rollout.begin("iris", "2", "1", config, num_old=2, region="b", now_ms=0)], 0)
    state, notes = run(state, regions)

    assert state.status == rollout.ROLLED_BACK
    first = regions.worlds["a"]
    assert first.count("iris", "2") == 0
    assert not {v: w for v, w in first.split.get("iris", {}).items() if w}
    assert any(getattr(a, "weights", None) == {"2": 100} for t, a in regions.log
               if a.region == "a")  # a did serve 2 before b failed
    assert any("rolling back a too" in n for n in notes)

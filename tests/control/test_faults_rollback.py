"""A rollback scales the old version back up first and moves traffic back as it gets ready.

The old version keeps one instance at the 100% stage; sending it all traffic at once would
overload it. Pure state-machine tests on hand-made observations, then the same through the
driver and a store with the control plane killed at every step.
"""

from __future__ import annotations

import pytest

from podium.control import rollout
from podium.control.actions import Action, MoveAlias, Scale, SetSplit
from podium.control.driver import RolloutDriver
from podium.control.rollout import Observation, RolloutState, VersionHealth
from podium.control.rollout_config import RolloutConfig
from podium.control.store import Store
from tests.support.fake_world import Behaviour, FakeWorld

FULL = RolloutConfig(stages=(100,), num_instances=1, ready_timeout_ms=10_000,
                     analysis_window_ms=1_000, min_requests=10, warm_delay_ms=60_000)


def _obs(old_ready: int, new_ready: int = 1, *, crashes: int = 0) -> Observation:
    return Observation(new=VersionHealth(num_ready=new_ready, num_crashes=crashes),
                       old=VersionHealth(num_ready=old_ready))


def _at_full_traffic(num_old: int = 4) -> RolloutState:
    """v2 takes 100% of traffic; v1 is down to the one instance kept warm."""
    state = rollout.begin("iris", "2", "1", FULL, num_old=num_old)
    for now in (0, 10, 1_100):  # start, ready (100% moves), analysis passes -> warm
        decision = rollout.step(state, _obs(num_old), now)
        assert decision is not None
        state = decision.state
    assert (state.phase, state.split, state.desired) == ("warm", {"1": 0, "2": 100},
                                                         {"1": 1, "2": 1})
    return state


def _scales(decision: rollout.Decision) -> list[tuple[str, int]]:
    return [(a.version, a.count) for a in decision.actions if isinstance(a, Scale)]


def test_rollback_at_full_traffic_scales_old_up_then_moves_traffic_as_it_gets_ready() -> None:
    state = _at_full_traffic(num_old=4)
    decision = rollout.step(state, _obs(1, crashes=1), 2_000)
    assert decision is not None
    state = decision.state
    # scaled back to what it had before the rollout, first; only its one instance's share moves
    assert decision.actions[0] == Scale("iris", "1", 4)
    assert state.split == {"1": 25, "2": 75}
    assert (state.status, state.phase) == (rollout.RUNNING, rollout.ROLL_BACK)
    assert "crashed" in state.reason and "scaling 1 from 1 to 4" in decision.note
    assert ("2", 0) not in _scales(decision)  # v2 still serves what v1 cannot take yet
    assert rollout.step(state, _obs(1, crashes=1), 2_500) is None  # nothing new is ready

    for ready, weight in ((2, 50), (3, 75)):
        decision = rollout.step(state, _obs(ready, crashes=1), 3_000 + ready)
        assert decision is not None
        state = decision.state
        assert decision.actions == [SetSplit("iris", {"1": weight, "2": 100 - weight})]
        assert f"{ready}/4 of 1 ready" in decision.note

    decision = rollout.step(state, _obs(4, crashes=1), 5_000)
    assert decision is not None
    state = decision.state
    assert (state.status, state.split) == (rollout.ROLLED_BACK, {"1": 100, "2": 0})
    assert decision.actions[0] == SetSplit("iris", {"1": 100, "2": 0})
    assert ("2", 0) in _scales(decision) and MoveAlias("iris", "latest", "1") in decision.actions
    assert state.desired == {"1": 4, "2": 0} and state.latest == "1"
    assert "crashed" in state.reason  # why it rolled back, not how the ramp ended


def test_a_new_version_with_no_ready_instance_gives_all_traffic_back_at_once() -> None:
    assert rollout.step(_at_full_traffic(num_old=3), _obs(1), 2_000) is None  # healthy, warm
    aborted = rollout.abort(_at_full_traffic(num_old=3), "by operator", 2_000)
    assert aborted is not None
    state = aborted.state
    assert state.split == {"1": 33, "2": 67}
    decision = rollout.step(state, _obs(1, new_ready=0), 2_100)
    assert decision is not None
    # v2 serves nothing: the gateway would send everything to v1 anyway; say so, and stop v2
    assert decision.actions == [SetSplit("iris", {"1": 100, "2": 0}), Scale("iris", "2", 0),
                                MoveAlias("iris", "latest", "1")]
    state = decision.state
    assert (state.status, state.phase) == (rollout.RUNNING, rollout.ROLL_BACK)
    assert rollout.step(state, _obs(2, new_ready=0), 2_200) is None
    assert rollout.step(state, _obs(3, new_ready=0), 2_300).state.status == rollout.ROLLED_BACK


def test_an_old_version_that_cannot_get_ready_gets_all_traffic_at_the_ready_timeout() -> None:
    state = rollout.step(_at_full_traffic(num_old=4), _obs(1, crashes=1), 2_000).state
    assert rollout.step(state, _obs(1, crashes=1), 2_000 + FULL.ready_timeout_ms - 1) is None
    decision = rollout.step(state, _obs(1, crashes=1), 2_000 + FULL.ready_timeout_ms)
    assert decision is not None and decision.state.status == rollout.ROLLED_BACK
    assert "only 1/4 instances ready after 10000 ms" in decision.note
    assert decision.state.split == {"1": 100, "2": 0}


def test_a_rollback_in_progress_is_not_started_again() -> None:
    state = rollout.step(_at_full_traffic(), _obs(1, crashes=1), 2_000).state
    assert rollout.abort(state, "by operator", 2_100) is None
    # more crashes of v2 while v1 scales up change nothing: the rollback is already under way
    assert rollout.step(state, _obs(1, crashes=5), 2_200) is None
    assert "rollback requested" not in state.reason


def test_old_version_never_takes_more_than_its_ready_share_on_a_fake_world() -> None:
    """Red-Black at 50% with 4 old instances (2 kept) and an erroring v2: the rollback waits
    for the 2 old instances it starts again, and no split gives v1 more than its ready share."""
    world = FakeWorld(behaviour={"1": Behaviour(startup_ms=3_000),
                                 "2": Behaviour(error_rate=0.5)})
    config = RolloutConfig(stages=(50, 100), num_instances=2, ready_timeout_ms=10_000,
                           analysis_window_ms=2_000, min_requests=10)
    state = rollout.begin("iris", "2", "1", config, num_old=4)
    world.apply([Scale("iris", "1", 4), SetSplit("iris", {"1": 100})])
    world.now_ms = 3_000  # v1's instances have long been ready
    notes: list[str] = []
    while not state.is_done and world.now_ms < 60_000:
        obs = world.observe(state, state.phase_since_ms)
        decision = rollout.step(state, obs, world.now_ms)
        if decision is not None:
            state = decision.state
            world.apply(decision.actions)
            notes.append(decision.note)
            ready = world.observe(state, state.phase_since_ms).old.num_ready
            assert state.split.get("1", 0) <= 100 * ready / 4, (world.now_ms, state.split)
        world.now_ms += 100
    assert state.status == rollout.ROLLED_BACK, notes
    assert "analysis failed at 50%" in state.reason
    assert world.count("iris", "1") == 4 and world.count("iris", "2") == 0
    assert world.split["iris"] == {"1": 100, "2": 0}
    splits = [a.weights["1"] for a in world.applied if isinstance(a, SetSplit)]
    assert splits == [100, 50, 50, 100]  # 50% held while 2 more v1 instances boot


class Killed(Exception):
    """The control plane died right here."""


class DyingWorld:
    """Dies on the `die_at`-th apply, after the step it carries out was written."""

    def __init__(self, world: FakeWorld, die_at: int) -> None:
        self.world, self.die_at, self.num_applies = world, die_at, 0

    def apply(self, actions: list[Action]) -> None:
        self.num_applies += 1
        if self.num_applies == self.die_at:
            raise Killed
        self.world.apply(actions)

    def observe(self, state: RolloutState, since_ms: int) -> Observation:
        return self.world.observe(state, since_ms)


def _run(driver: RolloutDriver, world: FakeWorld, store: Store) -> None:
    driver.reconcile()
    while store.list_rollouts(status=rollout.RUNNING) and world.now_ms < 60_000:
        driver.tick(world.now_ms)
        world.now_ms += 250


# apply #1 is the boot-time reconcile, then: start, 50% stage, rollback (scale v1 up), finish
@pytest.mark.parametrize("die_at", range(1, 6), ids=[f"die-at-{n}" for n in range(1, 6)])
def test_killed_mid_rollback_the_restarted_plane_finishes_it(store: Store, die_at: int) -> None:
    world = FakeWorld(behaviour={"2": Behaviour(error_rate=0.5)})
    for version in ("1", "2"):
        store.announce_package("iris", version, "python", f"/p/{version}", {})
    initial: list[Action] = [Scale("iris", "1", 4), SetSplit("iris", {"1": 100})]
    store.apply(initial)
    world.apply(initial)
    config = RolloutConfig(stages=(50, 100), num_instances=2, ready_timeout_ms=10_000,
                           analysis_window_ms=2_000, min_requests=10)
    first = RolloutDriver(store, DyingWorld(world, die_at))
    rollout_id = first.start("iris", "2", config, now_ms=world.now_ms)
    with pytest.raises(Killed):
        _run(first, world, store)

    _run(RolloutDriver(store, world), world, store)  # a new process, from the store alone

    record = store.get_rollout(rollout_id)
    assert record.status == rollout.ROLLED_BACK, record.reason
    assert world.count("iris", "1") == 4 and world.count("iris", "2") == 0
    assert {d.version: d.num_desired for d in store.list_deployments("iris")} == {"1": 4, "2": 0}
    assert world.split["iris"] == store.splits("iris") == {"1": 100, "2": 0}
    phases = [s.phase for s in store.rollout_steps(rollout_id)]
    assert rollout.ROLL_BACK in phases and phases[-1] == "done"

"""Restart safety: kill the control plane at any step of a rollout, restart from the store."""

from __future__ import annotations

import pytest

from podium.control import rollout
from podium.control.actions import Action, MoveAlias, Scale, SetSplit, action_to_dict
from podium.control.driver import RolloutDriver
from podium.control.rollout_config import RolloutConfig
from podium.control.store import Store
from podium.errors import Conflict, NotFound
from tests.support.fake_world import Behaviour, FakeWorld

CONFIG = RolloutConfig(stages=(25, 50, 100), num_instances=2, ready_timeout_ms=5_000,
                       analysis_window_ms=2_000, warm_delay_ms=2_000, min_requests=10)
TICK_MS = 250


class Killed(Exception):
    """The control plane died (kill -9) right here."""


class DyingWorld:
    """Forwards to a world, but dies on the `die_at`-th apply: after the step was written."""

    def __init__(self, world: FakeWorld, die_at: int) -> None:
        self.world, self.die_at, self.num_applies = world, die_at, 0

    def apply(self, actions: list[Action]) -> None:
        self.num_applies += 1
        if self.num_applies == self.die_at:
            raise Killed
        self.world.apply(actions)

    def observe(self, state: rollout.RolloutState, since_ms: int) -> rollout.Observation:
        return self.world.observe(state, since_ms)


def _deployed_v1(store: Store, world: FakeWorld) -> None:
    for version in ("1", "2"):
        store.announce_package("iris", version, "python", f"/p/{version}", {})
    initial: list[Action] = [Scale("iris", "1", 2), SetSplit("iris", {"1": 100}),
                             MoveAlias("iris", "latest", "1")]
    store.apply(initial)
    world.apply(initial)


def _run(driver: RolloutDriver, world: FakeWorld, store: Store, until_ms: int = 60_000) -> None:
    driver.reconcile()  # what a control plane does first when it boots
    while store.list_rollouts(status=rollout.RUNNING) and world.now_ms < until_ms:
        driver.tick(world.now_ms)
        world.now_ms += TICK_MS


def _assert_world_matches_store(store: Store, world: FakeWorld) -> None:
    for dep in store.list_deployments("iris"):
        assert world.count("iris", dep.version) == dep.num_desired, dep.version
    assert world.split["iris"] == store.splits("iris")
    assert world.aliases[("iris", "latest")] == store.aliases("iris")["latest"]


# apply #1 is the boot-time reconcile; each later one carries out one recorded step. A good v2
# takes 7 steps (start, 3 stages x ready/analysis, warm, done); an erroring one rolls back at the
# first analysis (step 3). Dying on every one of them covers every point of the rollout.
KILL_POINTS = [(False, rollout.SUCCEEDED, n) for n in range(1, 9)] + [
    (True, rollout.ROLLED_BACK, n) for n in range(1, 5)]


@pytest.mark.parametrize(("bad", "status", "die_at"), KILL_POINTS,
                         ids=[f"{'erroring' if b else 'good'}-v2-die-at-{n}"
                              for b, _, n in KILL_POINTS])
def test_kill_at_any_step_then_restart_ends_consistent(
        store: Store, die_at: int, bad: bool, status: str) -> None:
    world = FakeWorld(behaviour={"2": Behaviour(error_rate=0.5 if bad else 0.0)})
    _deployed_v1(store, world)
    first = RolloutDriver(store, DyingWorld(world, die_at))
    rollout_id = first.start("iris", "2", CONFIG, now_ms=world.now_ms)
    with pytest.raises(Killed):
        _run(first, world, store)
    steps_before = store.get_rollout(rollout_id).num_steps

    # a new process: nothing survives but the store (and the instances it recorded)
    _run(RolloutDriver(store, world), world, store)

    record = store.get_rollout(rollout_id)
    assert record.status == status, record.reason
    assert record.num_steps >= steps_before
    _assert_world_matches_store(store, world)
    expected_split = {"1": 0, "2": 100} if status == rollout.SUCCEEDED else {"1": 100, "2": 0}
    assert {v: w for v, w in store.splits("iris").items() if w} == {
        v: w for v, w in expected_split.items() if w}
    # nothing orphaned: only the winning version has instances
    winner = "2" if status == rollout.SUCCEEDED else "1"
    assert world.count("iris", winner) == 2
    assert world.count("iris", "1" if winner == "2" else "2") == 0


def test_every_step_is_recorded_in_order_before_it_acts(store: Store) -> None:
    world = FakeWorld()
    _deployed_v1(store, world)
    seen_steps: list[int] = []

    class Recording:
        booted = False

        def apply(self, actions: list[Action]) -> None:
            if not self.booted:  # the boot-time reconcile acts on no step
                self.booted = True
                world.apply(actions)
                return
            # at the moment of acting, the step announcing these actions is already stored
            steps = store.rollout_steps(rollout_id)
            assert steps[-1].actions == [action_to_dict(a) for a in actions]
            seen_steps.append(len(steps))
            world.apply(actions)

        def observe(self, state: rollout.RolloutState, since_ms: int) -> rollout.Observation:
            return world.observe(state, since_ms)

    driver = RolloutDriver(store, Recording())
    rollout_id = driver.start("iris", "2", CONFIG, now_ms=0)
    _run(driver, world, store)
    assert store.get_rollout(rollout_id).status == rollout.SUCCEEDED
    assert seen_steps == list(range(1, len(seen_steps) + 1))
    phases = [s.phase for s in store.rollout_steps(rollout_id)]
    assert phases[0] == "wait_ready" and phases[-2:] == ["warm", "done"]


def test_driver_refuses_unknown_versions_and_concurrent_rollouts(store: Store) -> None:
    world = FakeWorld()
    _deployed_v1(store, world)
    driver = RolloutDriver(store, world)
    with pytest.raises(NotFound, match="iris@7 is not announced"):
        driver.start("iris", "7", CONFIG, now_ms=0)
    assert store.list_rollouts() == []
    driver.start("iris", "2", CONFIG, now_ms=0)
    with pytest.raises(Conflict):
        driver.start("iris", "2", CONFIG, now_ms=0)
    assert len(store.list_rollouts()) == 1


def test_abort_through_the_driver_rolls_back_and_is_recorded(store: Store) -> None:
    world = FakeWorld()
    _deployed_v1(store, world)
    driver = RolloutDriver(store, world)
    rollout_id = driver.start("iris", "2", CONFIG, now_ms=0)
    _run(driver, world, store, until_ms=1_500)
    assert driver.abort("iris", "operator asked", world.now_ms) == rollout_id
    record = store.get_rollout(rollout_id)
    assert record.status == rollout.ROLLED_BACK
    assert "operator asked" in record.reason
    assert store.splits("iris") == {"1": 100, "2": 0}
    assert driver.abort("iris", "again", world.now_ms) is None

"""Region rollouts through the driver and the store: a kill at any step resumes the right region
at the right stage; regions as the store declares them."""

from __future__ import annotations

from pathlib import Path

import pytest

from podium.control import region_rollout, rollout
from podium.control.actions import Action, Scale
from podium.control.driver import RolloutDriver
from podium.control.region_config import RegionSpec
from podium.control.rollout_config import RolloutConfig
from podium.control.store import Store
from podium.errors import InvalidArgument
from tests.support.fake_regions import FakeRegions
from tests.support.fake_world import Behaviour

CONFIG = RolloutConfig(stages=(50, 100), num_instances=2, ready_timeout_ms=5_000,
                       analysis_window_ms=2_000, warm_delay_ms=1_000, min_requests=10,
                       bake_ms=3_000)
TICK_MS = 250


class Killed(Exception):
    """The control plane died (kill -9) right here."""


class DyingRegions:
    """Forwards to the fake regions, but dies on the `die_at`-th apply (after the step was
    written, before it acted)."""

    def __init__(self, regions: FakeRegions, die_at: int) -> None:
        self.regions, self.die_at, self.num_applies = regions, die_at, 0

    def apply(self, actions: list[Action]) -> None:
        self.num_applies += 1
        if self.num_applies == self.die_at:
            raise Killed
        self.regions.apply(actions)

    def observe(self, state: rollout.RolloutState, since_ms: int) -> rollout.Observation:
        return self.regions.observe(state, since_ms)


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Store:
    store = Store.open(f"sqlite:///{tmp_path / 'control.db'}")
    yield store
    store.close()


def _declared(store: Store, regions: FakeRegions) -> None:
    store.set_regions([RegionSpec(name, http_port=9000 + 2 * i, grpc_port=9001 + 2 * i)
                       for i, name in enumerate(regions.names)])
    for version in ("1", "2"):
        store.announce_package("iris", version, "python", f"/p/{version}", {})
    initial = regions.serving("1", 2)
    store.apply(initial)
    regions.apply(initial)
    regions.log.clear()


def _run(driver: RolloutDriver, regions: FakeRegions, store: Store,
         until_ms: int = 120_000) -> None:
    driver.reconcile()  # what a control plane does first when it boots
    while store.list_rollouts(status=rollout.RUNNING) and regions.now_ms < until_ms:
        driver.tick(regions.now_ms)
        regions.now_ms += TICK_MS


def _assert_world_matches_store(store: Store, regions: FakeRegions) -> None:
    for name, world in regions.worlds.items():
        for dep in store.list_deployments("iris", region=name):
            assert world.count("iris", dep.version) == dep.num_desired, (name, dep.version)
        assert world.split["iris"] == store.splits("iris", name), name
        assert world.aliases[("iris", "latest")] == store.aliases("iris", name)["latest"]


# a good v2 over two regions takes 13 applies (boot reconcile, a: 5 steps, bake into b's start,
# b: 5 more, done); one failing in region b takes 11 (b rolls back at its first analysis while
# a's old version boots again, then a ramps back): dying at each covers every step
KILL_POINTS = [(None, rollout.SUCCEEDED, n) for n in range(1, 14)] + [
    ("b", rollout.ROLLED_BACK, n) for n in range(1, 12)]


@pytest.mark.parametrize(("failing", "status", "die_at"), KILL_POINTS,
                         ids=[f"{f or 'good'}-die-at-{n}" for f, _, n in KILL_POINTS])
def test_kill_at_any_step_of_a_two_region_rollout_resumes_where_it_was(
        sqlite_store: Store, failing: str | None, status: str, die_at: int) -> None:
    store = sqlite_store
    behaviour = {(failing, "2"): Behaviour(error_rate=0.5)} if failing else {}
    regions = FakeRegions(names=("a", "b"), behaviour=behaviour)
    _declared(store, regions)
    first = RolloutDriver(store, DyingRegions(regions, die_at))
    rollout_id = first.start("iris", "2", CONFIG, now_ms=regions.now_ms)
    with pytest.raises(Killed):
        _run(first, regions, store)
    before = store.get_rollout(rollout_id).state

    _run(RolloutDriver(store, regions), regions, store)  # a new process: only the store is left

    record = store.get_rollout(rollout_id)
    assert record.status == status, record.reason
    _assert_world_matches_store(store, regions)
    b_start = regions.first_scale("b", "2")
    if before.index == 0 and before.mode == region_rollout.ROLLING:
        assert b_start is None or b_start >= CONFIG.bake_ms  # b waited for a, even so
    winner = "2" if status == rollout.SUCCEEDED else "1"
    for name in ("a", "b"):
        world = regions.worlds[name]
        assert world.count("iris", winner) == 2, name
        assert world.count("iris", "1" if winner == "2" else "2") == 0, name
        assert world.aliases[("iris", "latest")] == winner


def test_the_driver_rolls_through_the_declared_order_and_names_unknown_regions(
        sqlite_store: Store) -> None:
    store = sqlite_store
    regions = FakeRegions(names=("a", "b"))
    _declared(store, regions)
    driver = RolloutDriver(store, regions)
    with pytest.raises(InvalidArgument, match="region 'x' is not declared; declared regions: "
                                              "a, b"):
        driver.start("iris", "2", RolloutConfig(regions=("a", "x")), now_ms=0)
    assert store.list_rollouts() == []
    rollout_id = driver.start("iris", "2", CONFIG, now_ms=0)
    assert store.get_rollout(rollout_id).state.order == ("a", "b")
    _run(driver, regions, store)
    assert store.get_rollout(rollout_id).status == rollout.SUCCEEDED
    assert regions.first_scale("b", "2") > regions.first_scale("a", "2") + CONFIG.bake_ms
    # a region already on the version is left out; once everywhere, deploying it is refused
    with pytest.raises(InvalidArgument, match="already takes all of iris's traffic in every"):
        driver.start("iris", "2", CONFIG, now_ms=regions.now_ms)


def test_a_region_already_serving_the_version_is_skipped(sqlite_store: Store) -> None:
    store = sqlite_store
    regions = FakeRegions(names=("a", "b"))
    _declared(store, regions)
    driver = RolloutDriver(store, regions)
    only_a = driver.start("iris", "2", RolloutConfig(**{**CONFIG.to_dict(), "regions": ("a",)}),
                          now_ms=0)
    _run(driver, regions, store)
    assert store.get_rollout(only_a).status == rollout.SUCCEEDED
    regions.log.clear()
    both = driver.start("iris", "2", CONFIG, now_ms=regions.now_ms)
    assert store.get_rollout(both).state.order == ("b",)
    _run(driver, regions, store)
    assert not [a for a in regions.touched("a") if isinstance(a, Scale)]
    assert store.splits("iris", "b") == {"2": 100}

"""Several fake regions on one fake clock: each a `FakeWorld`, actions sent by their region."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from podium.control import region_rollout, rollout
from podium.control.actions import Action, MoveAlias, Scale, SetSplit
from podium.control.region_rollout import RegionRollout
from podium.control.rollout_config import RolloutConfig
from tests.support.fake_world import Behaviour, FakeWorld


@dataclass
class FakeRegions:
    """`worlds[region]` is that region's runtime + gateway; `log` is every action with its time."""

    names: tuple[str, ...] = ("a", "b", "c")
    behaviour: dict[tuple[str, str], Behaviour] = field(default_factory=dict)
    """(region, version) → how that version behaves there (default: healthy)."""
    worlds: dict[str, FakeWorld] = field(default_factory=dict)
    log: list[tuple[int, Action]] = field(default_factory=list)
    _now_ms: int = 0

    def __post_init__(self) -> None:
        for name in self.names:
            self.worlds[name] = FakeWorld(behaviour={
                v: b for (r, v), b in self.behaviour.items() if r == name})

    @property
    def now_ms(self) -> int:
        return self._now_ms

    @now_ms.setter
    def now_ms(self, value: int) -> None:
        self._now_ms = value
        for world in self.worlds.values():
            world.now_ms = value

    def apply(self, actions: list[Action]) -> None:
        for action in actions:
            self.log.append((self.now_ms, action))
            self.worlds[action.region].apply([action])

    def observe(self, state: rollout.RolloutState, since_ms: int) -> rollout.Observation:
        return self.worlds[state.region].observe(state, since_ms)

    def serving(self, version: str, count: int) -> list[Action]:
        """Every region serving `version` on `count` instances (what a finished rollout left)."""
        actions: list[Action] = []
        for name in self.names:
            actions += [Scale("iris", version, count, region=name),
                        SetSplit("iris", {version: 100}, region=name),
                        MoveAlias("iris", "latest", version, region=name)]
        return actions

    def first_scale(self, region: str, version: str) -> int | None:
        """When an instance of `version` was first asked for in `region` (None: never)."""
        return next((t for t, a in self.log if isinstance(a, Scale) and a.region == region
                     and a.version == version and a.count > 0), None)

    def touched(self, region: str) -> list[Action]:
        return [a for _, a in self.log if a.region == region]


def legs(regions: FakeRegions, config: RolloutConfig, order: tuple[str, ...] | None = None,
         *, num_old: int = 2) -> RegionRollout:
    """A rollout of iris 1 → 2 over `order` (default: every region)."""
    return region_rollout.begin([
        rollout.begin("iris", "2", "1", config, num_old=num_old, region=r, now_ms=regions.now_ms)
        for r in order or regions.names], regions.now_ms)


def run(state: RegionRollout, regions: FakeRegions, *, until_ms: int = 300_000,
        tick_ms: int = 100, stop: Callable[[RegionRollout], bool] = lambda _s: False,
        ) -> tuple[RegionRollout, list[str]]:
    """Step the region controller on the fake clock until done, `until_ms` or `stop(state)`."""
    notes = []
    while not state.is_done and regions.now_ms <= until_ms and not stop(state):
        observations = {leg.region: regions.observe(leg, leg.phase_since_ms)
                        for leg in region_rollout.watched(state)}
        decision = region_rollout.step(state, observations, regions.now_ms)
        if decision is not None:
            state = decision.state
            regions.apply(decision.actions)
            notes.append(decision.note)
        regions.now_ms += tick_ms
    return state, notes

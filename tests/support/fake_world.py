"""A fake clock and a fake world (runtime + gateway) for driving rollouts in milliseconds."""

from __future__ import annotations

from dataclasses import dataclass, field

from podium.control.actions import Action, MoveAlias, Scale, SetSplit
from podium.control.rollout import Observation, RolloutState, VersionHealth


@dataclass
class Behaviour:
    """How a fake version behaves once it has instances."""

    startup_ms: int = 1_000
    ready: bool = True
    error_rate: float = 0.0
    p99_ms: float = 20.0
    crash_at_ms: int | None = None
    unready_from_ms: int | None = None
    unready_until_ms: int | None = None


@dataclass
class FakeWorld:
    """Instances appear `startup_ms` after a scale-up; requests arrive at a steady rate."""

    now_ms: int = 0
    requests_per_s: float = 100.0
    behaviour: dict[str, Behaviour] = field(default_factory=dict)
    started: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    split: dict[str, dict[str, int]] = field(default_factory=dict)
    aliases: dict[tuple[str, str], str] = field(default_factory=dict)
    applied: list[Action] = field(default_factory=list)

    def apply(self, actions: list[Action]) -> None:
        for action in actions:
            self.applied.append(action)
            if isinstance(action, Scale):
                key = (action.model, action.version)
                have = self.started.setdefault(key, [])
                while len(have) < action.count:
                    have.append(self.now_ms)
                del have[action.count:]
            elif isinstance(action, SetSplit):
                self.split[action.model] = dict(action.weights)
            elif isinstance(action, MoveAlias):
                self.aliases[(action.model, action.alias)] = action.version

    def observe(self, state: RolloutState, since_ms: int) -> Observation:
        old = self._health(state, state.from_version, since_ms) if state.from_version else None
        return Observation(new=self._health(state, state.to_version, since_ms),
                           old=old or VersionHealth())

    def count(self, model: str, version: str) -> int:
        return len(self.started.get((model, version), []))

    def _health(self, state: RolloutState, version: str, since_ms: int) -> VersionHealth:
        b = self.behaviour.get(version, Behaviour())
        crashed = b.crash_at_ms is not None and self.now_ms >= b.crash_at_ms
        starts = self.started.get((state.model, version), [])
        num_ready = sum(1 for t in starts if b.ready and t + b.startup_ms <= self.now_ms)
        if b.unready_from_ms is not None and b.unready_from_ms <= self.now_ms < (
                b.unready_until_ms or 1 << 62):
            num_ready = 0
        weight = self.split.get(state.model, {}).get(version, 0)
        seconds = max(0, self.now_ms - since_ms) / 1000
        num_requests = int(self.requests_per_s * seconds * weight / 100)
        return VersionHealth(num_ready=num_ready, num_crashes=int(crashed),
                             num_requests=num_requests,
                             num_errors=int(num_requests * b.error_rate),
                             p99_ms=b.p99_ms if num_requests else None)

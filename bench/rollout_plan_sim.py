"""Plan a rollout of one model to 1,000 GPU instances across 4 regions: the real controllers
(`control.region_rollout` over `control.rollout`) stepped on a fake clock, Red-Black vs
Versioned, with instances that take `--boot` seconds to become ready.

A deployment holds at most 64 instances per region (`RolloutConfig.num_instances`), so each
region is split into `--cells` cells of <= 64 instances, declared as regions of their own and
rolled one after the other (cell 1 of region 1 is the canary of the whole fleet), with
`--bake` seconds between cells. Every instance is one GPU; an instance counts from the moment it
is asked for (it holds its GPU while it boots) until it is stopped. "Overlap" is GPU time above
the fleet's steady size (old and new both held); Versioned's old instances stay until idle GC
stops them `--version-ttl` seconds after `latest` moved (clients that pin the old version
would keep them longer).

    python -m bench.rollout_plan_sim                      # the table in docs/benchmarks.md
    python -m bench.rollout_plan_sim --boot 600 --bake 1800 --json
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field

from podium.control import region_rollout, rollout
from podium.control.actions import Action, MoveAlias, Scale
from podium.control.rollout import Observation, RolloutState
from podium.control.rollout_config import RolloutConfig
from podium.routes.stats import VersionHealth

MAX_PER_CELL = 64


@dataclass
class SimWorld:
    """Instances ready `boot_ms` after they were asked for; every version healthy."""

    boot_ms: int
    now_ms: int = 0
    started: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    alias_moved: dict[str, int] = field(default_factory=dict)
    """Cell → when `latest` moved to the new version there (Versioned: GC counts from it)."""

    def apply(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Scale):
                have = self.started.setdefault((action.region, action.version), [])
                have.extend([self.now_ms] * max(0, action.count - len(have)))
                del have[action.count:]  # the newest go first, as the supervisor drains them
            elif isinstance(action, MoveAlias):
                self.alias_moved[action.region] = self.now_ms

    def observe(self, leg: RolloutState, since_ms: int) -> Observation:
        return Observation(new=self._health(leg.region, leg.to_version, since_ms),
                           old=self._health(leg.region, leg.from_version, since_ms))

    def _health(self, region: str, version: str | None, since_ms: int) -> VersionHealth:
        starts = self.started.get((region, version or ""), [])
        ready = sum(1 for t in starts if t + self.boot_ms <= self.now_ms)
        return VersionHealth(num_ready=ready, num_requests=10_000 if ready else 0,
                             num_errors=0, p99_ms=50.0 if ready else None)

    def num_gpus(self) -> int:
        return sum(len(v) for v in self.started.values())


def cells(num_instances: int, num_regions: int, per_region: int) -> list[tuple[str, int]]:
    """(cell name, instances) in rollout order, instances spread as evenly as they go."""
    num_cells = num_regions * per_region
    base, extra = divmod(num_instances, num_cells)
    sizes = [base + (1 if i < extra else 0) for i in range(num_cells)]
    if max(sizes) > MAX_PER_CELL:
        raise SystemExit(f"{max(sizes)} instances per cell is over the {MAX_PER_CELL} a "
                         f"deployment holds; use --cells {math.ceil(max(sizes) / MAX_PER_CELL)}"
                         " or more")
    return [(f"r{i // per_region + 1}c{i % per_region + 1}", n) for i, n in enumerate(sizes)]


def simulate(strategy: str, args: argparse.Namespace) -> dict[str, float]:
    """One rollout of `v2` over every cell (all on `v1`); its wall time and GPU overlap."""
    world = SimWorld(boot_ms=int(args.boot * 1000))
    fleet = cells(args.instances, args.regions, args.cells)
    legs = []
    for name, size in fleet:
        world.apply([Scale("llm", "1", size, region=name)])
        config = RolloutConfig(strategy=strategy, stages=tuple(args.stages), num_instances=size,
                               ready_timeout_ms=int(max(3 * args.boot, 60) * 1000),
                               analysis_window_ms=int(args.analysis * 1000),
                               warm_delay_ms=int(args.warm * 1000),
                               bake_ms=int(args.bake * 1000))
        legs.append(rollout.begin("llm", "2", "1", config, num_old=size, region=name))
    state = region_rollout.begin(legs)
    steady = args.instances
    tick_ms = int(args.tick * 1000)
    overlap_ms = peak = 0
    done_ms: int | None = None
    while True:
        if not state.is_done:
            observations = {leg.region: world.observe(leg, leg.phase_since_ms)
                            for leg in region_rollout.watched(state)}
            decision = region_rollout.step(state, observations, world.now_ms)
            if decision is not None:
                state = decision.state
                world.apply(decision.actions)
            if state.is_done:
                done_ms = world.now_ms
        if strategy == "versioned":  # idle GC stops each cell's old version after the TTL
            for cell, moved in world.alias_moved.items():
                if world.now_ms >= moved + args.version_ttl * 1000:
                    world.apply([Scale("llm", "1", 0, region=cell)])
        above = world.num_gpus() - steady
        overlap_ms += max(0, above) * tick_ms
        peak = max(peak, above)
        if done_ms is not None and above <= 0:
            break
        world.now_ms += tick_ms
    assert state.status == rollout.SUCCEEDED, state.reason
    return {"rollout_h": done_ms / 3_600_000, "overlap_gpu_h": overlap_ms / 3_600_000,
            "peak_extra_gpus": peak, "cells": len(fleet),
            "last_old_stopped_h": world.now_ms / 3_600_000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", type=int, default=1000, help="GPU instances in all")
    parser.add_argument("--regions", type=int, default=4)
    parser.add_argument("--cells", type=int, default=4, help="cells per region (<= 64 each)")
    parser.add_argument("--boot", type=float, default=300, help="seconds to ready")
    parser.add_argument("--stages", type=lambda s: [int(x) for x in s.split(",")],
                        default=[10, 25, 50, 100], help="Red-Black stages")
    parser.add_argument("--analysis", type=float, default=600, help="seconds per stage")
    parser.add_argument("--warm", type=float, default=1800, help="Red-Black warm delay")
    parser.add_argument("--bake", type=float, default=1800, help="seconds between cells")
    parser.add_argument("--version-ttl", type=float, default=3600,
                        help="Versioned: idle old version stopped this long after latest moved")
    parser.add_argument("--tick", type=float, default=5, help="fake-clock step, seconds")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = {strategy: simulate(strategy, args) for strategy in ("red-black", "versioned")}
    if args.json:
        print(json.dumps({"settings": vars(args), "results": rows}, indent=2))
        return
    print(f"{args.instances} GPU instances, {args.regions} regions x {args.cells} cells, boot "
          f"{args.boot:g} s, stages {args.stages}, analysis {args.analysis:g} s, warm "
          f"{args.warm:g} s, bake {args.bake:g} s, version TTL {args.version_ttl:g} s")
    print("| strategy | rollout (h) | GPU-hours of overlap | peak extra GPUs "
          "| last old stopped (h) |")
    print("|---|---|---|---|---|")
    for strategy, r in rows.items():
        print(f"| {strategy} | {r['rollout_h']:.2f} | {r['overlap_gpu_h']:.1f} | "
              f"{r['peak_extra_gpus']} | {r['last_old_stopped_h']:.2f} |")


if __name__ == "__main__":
    main()

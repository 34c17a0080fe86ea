"""LoRA adapters in the control plane, on a fake runtime and the real route table: placed on
their base's instances (no instance of their own), rolled out by moving the split, rolled back
on errors, collected when idle, carried over by a base rollout; on SQLite and PostgreSQL."""

from __future__ import annotations

import re
import time
from dataclasses import replace
from pathlib import Path

import pytest

from podium.control.adapter_deploy import AdapterIndex
from podium.control.cli import _human
from podium.control.loop import ControlLoop, LoopConfig
from podium.control.plane import ControlPlane
from podium.control.rollout_config import RolloutConfig
from podium.control.store import Store
from podium.control.world import RuntimeWorld
from podium.errors import Conflict, InvalidArgument, PackageError
from podium.package.package import Package, open_package, write_manifest
from podium.routes.stats import Outcome, VersionStats
from podium.routes.table import Endpoint, RouteTable
from tests.support.lora_adapters import write_adapter_package
from tests.support.ready_runtime import FakeRuntime

FAST = RolloutConfig(stages=(10, 50, 100), analysis_window_ms=1_000, warm_delay_ms=0,
                     min_requests=5)


class Plane:
    """A control plane on `store` with a fake runtime whose instances the table routes to."""

    def __init__(self, store: Store, tmp_path: Path) -> None:
        self.store, self.tmp_path = store, tmp_path
        self.now_ms = 1_000_000
        self.runtime, self.table, self.stats = FakeRuntime(), RouteTable(), VersionStats()
        self.world = RuntimeWorld(self.runtime, self.table, self.stats,
                                  base_of=AdapterIndex(store).base_of)
        self.carried: list[tuple[str, str]] = []
        self.unfit: dict[str, str] = {}
        """Adapter key → why carrying it to another base version fails (its files' check)."""
        self.plane = ControlPlane(store, self.world, clock=lambda: self.now_ms,
                                  materialize=lambda _p: None, carry_adapter=self._carry)

    def _carry(self, adapter: Package, base: Package) -> None:
        if adapter.key in self.unfit:
            raise PackageError(self.unfit[adapter.key], param="target_modules")
        self.carried.append((adapter.key, base.key))

    def announce_base(self, version: str, lora: dict[str, int] | None = None) -> None:
        self._announce({"name": "llm", "version": version, "backend": "vllm", "task": "generate",
                        "weights": {"source": "path", "path": "/w"},
                        "lora": {} if lora is None else lora})

    def announce_adapter(self, version: str, base: str = "llm@1", rank: int = 8) -> None:
        folder = write_adapter_package(self.tmp_path / f"tone-{version}", "tone",
                                       seed=int(version), version=version, base=base,
                                       rank=rank, layers=1)
        self._record(open_package(folder))

    def _announce(self, manifest: dict[str, object]) -> None:
        where = self.tmp_path / f"{manifest['name']}-{manifest['version']}"
        self._record(write_manifest(where, manifest))

    def _record(self, package: Package) -> None:
        """Recorded as `podium announce` records it (its manifest, where it lives)."""
        self.store.announce_package(package.manifest.name, package.manifest.version,
                                    package.manifest.backend, str(package.root),
                                    package.manifest.model_dump(mode="json"))

    def deploy_base(self, version: str) -> None:
        """The base rolled out to `version`, its instance in the table once the runtime has it."""
        self.plane.deploy("llm", version, RolloutConfig(stages=(100,), analysis_window_ms=0,
                                                        warm_delay_ms=0))
        self.table.add_endpoint("llm", version, Endpoint(f"llm-{version}-0", "http://x"))
        self.settle()

    def settle(self, passes: int = 20) -> None:
        for _ in range(passes):
            self.plane.tick()
            self.now_ms += 100

    def serve(self, version: str, *, ok: bool = True, num: int = 10) -> None:
        """Requests of the adapter's version answered now (the gateway's per-route stats)."""
        for _ in range(num):
            self.stats.record("tone", version, Outcome(self.now_ms, 20.0, ok))

    def rollout_to(self, version: str, config: RolloutConfig, *, ok: bool = True) -> list[int]:
        """Drive a rollout to its end under traffic; the new version's weight at each pass."""
        self.plane.deploy("tone", version, config)
        seen = []
        while self.store.running_rollout("tone") is not None:
            split = self.table.split("tone")
            seen.append(split.get(version, 0))
            for v in split:
                self.serve(v, ok=ok or v != version)
            self.now_ms += 500
            self.plane.tick()
        return seen


@pytest.fixture
def plane(store: Store, tmp_path: Path) -> Plane:
    p = Plane(store, tmp_path)
    p.announce_base("1")
    for version in ("1", "2"):
        p.announce_adapter(version)
    return p


def test_an_adapter_needs_its_base_running_then_is_placed_without_an_instance(
        plane: Plane) -> None:
    with pytest.raises(Conflict, match=r"tone@1 is a LoRA adapter of llm@1, and llm is not "
                                       r"deployed: deploy the base first \(`podium deploy "
                                       r"llm@1`\)"):
        plane.plane.deploy("tone", "1", FAST)
    assert plane.store.list_rollouts() == []  # refused before anything was written
    plane.deploy_base("1")
    with pytest.raises(InvalidArgument, match=r"num_instances=2: tone@1 is a LoRA adapter, it "
                                              r"runs on every instance of llm"):
        plane.plane.deploy("tone", "1", replace(FAST, num_instances=2))
    plane.plane.deploy("tone", "1", FAST)
    plane.settle()
    assert plane.runtime.counts == {("llm", "1"): 1}  # no instance, no boot for the adapter
    assert plane.table.adapters() == {"tone": ("llm", ["1"])}
    assert plane.table.split("tone") == {"1": 100}
    version, endpoint = plane.table.resolve("tone", None)
    assert (version, endpoint.id) == ("1", "llm-1-0")
    assert plane.store.list_rollouts("tone")[0].status == "succeeded"


def test_an_adapter_for_another_base_version_is_refused_naming_both(plane: Plane) -> None:
    plane.announce_base("2")
    plane.deploy_base("2")
    with pytest.raises(Conflict, match=r"tone@1 is a LoRA adapter of llm@1, but llm runs "
                                       r"version 2: package the adapter for the running base "
                                       r"\(\"base\": \"llm@2\"\) or deploy llm@1"):
        plane.plane.deploy("tone", "1", FAST)
    plane.announce_adapter("3", base="llm@2")
    plane.plane.deploy("tone", "3", FAST)  # the one made for the running base goes on
    plane.settle()
    assert plane.table.adapters() == {"tone": ("llm", ["3"])}


def test_red_black_between_adapter_versions_moves_the_split_by_stage(plane: Plane) -> None:
    plane.deploy_base("1")
    plane.plane.deploy("tone", "1", FAST)
    plane.settle()
    weights = plane.rollout_to("2", FAST)
    # placed at deploy, the split moves at the next pass, then one stage per analysis window
    assert [w for i, w in enumerate(weights) if i == 0 or w != weights[i - 1]] == [
        0, 10, 50, 100]
    record = plane.store.list_rollouts("tone")[0]
    assert (record.status, record.state.to_version) == ("succeeded", "2")
    assert plane.table.split("tone") == {"2": 100}
    assert plane.table.adapters() == {"tone": ("llm", ["2"])}  # the old version removed
    assert plane.runtime.counts == {("llm", "1"): 1}  # still the one base instance


def test_a_failing_adapter_version_is_rolled_back_at_its_first_stage(plane: Plane) -> None:
    plane.deploy_base("1")
    plane.plane.deploy("tone", "1", FAST)
    plane.settle()
    weights = plane.rollout_to("2", FAST, ok=False)
    assert max(weights) == 10  # never past the first stage
    record = plane.store.list_rollouts("tone")[0]
    assert record.status == "rolled_back"
    assert "analysis failed at 10%: error rate 100.0%" in record.reason
    assert plane.table.split("tone") == {"1": 100}
    assert plane.table.adapters() == {"tone": ("llm", ["1"])}


def test_versioned_adapter_versions_side_by_side_then_idle_ones_collected(
        plane: Plane) -> None:
    plane.deploy_base("1")
    versioned = RolloutConfig(strategy="versioned")
    for version in ("1", "2"):
        plane.plane.deploy("tone", version, versioned)
        plane.settle()
    assert plane.table.adapters() == {"tone": ("llm", ["1", "2"])}
    assert plane.table.alias("tone", "latest") == "2"
    loop = ControlLoop(plane.plane, plane.runtime, plane.table, plane.stats,
                       LoopConfig(version_ttl_ms=60_000))
    # the GC compares with the deployments' wall-clock times: a day later, both are idle
    plane.now_ms = int(time.time() * 1000) + 86_400_000
    loop.step()
    assert plane.table.adapters() == {"tone": ("llm", ["2"])}  # idle, not latest: collected
    assert plane.runtime.counts == {("llm", "1"): 1}


@pytest.mark.parametrize(("lora", "unfit", "why"), [
    ({"max_lora_rank": 1}, None, "rank 8 is above llm@2's max_lora_rank 1"),
    ({}, "target_modules ['q_proj'] are not modules of base llm@2",
     "target_modules ['q_proj'] are not modules of base llm@2"),
], ids=["rank-too-high", "files-do-not-fit"])
def test_a_base_rollout_carries_its_adapters_or_refuses_naming_the_misfits(
        plane: Plane, lora: dict[str, int], unfit: str | None, why: str) -> None:
    plane.deploy_base("1")
    plane.plane.deploy("tone", "1", FAST)
    plane.settle()
    plane.announce_base("2", lora)
    if unfit is not None:
        plane.unfit["tone@1"] = unfit
    with pytest.raises(Conflict, match=re.escape(
            f"llm@2 cannot carry the LoRA adapters placed on llm: tone@1 ({why})")):
        plane.plane.deploy("llm", "2", FAST)
    assert plane.store.list_rollouts("llm")[0].state.to_version == "1"  # nothing started
    plane.unfit.clear()
    plane.announce_base("3")
    plane.deploy_base("3")
    assert plane.store.list_rollouts("llm")[0].status == "succeeded"
    assert ("tone@1", "llm@3") in plane.carried  # stored for llm@3's instances first
    # carried over: the adapter runs on the new base version's instance
    assert plane.table.adapter_endpoints("tone", "1")[-1].id == "llm-3-0"
    plane.table.remove_endpoint("llm-1-0")
    assert plane.table.resolve("tone", None)[1].id == "llm-3-0"


def test_a_restarted_plane_places_its_adapters_again(plane: Plane) -> None:
    plane.deploy_base("1")
    plane.plane.deploy("tone", "1", FAST)
    plane.settle()
    again = Plane(plane.store, plane.tmp_path)
    again.plane.tick()  # the first tick re-applies the stored desired state
    assert again.table.adapters() == {"tone": ("llm", ["1"])}
    assert again.table.split("tone") == {"1": 100}
    assert ("tone", "1") not in again.runtime.counts


def test_status_shows_adapters_under_their_base(plane: Plane) -> None:
    plane.deploy_base("1")
    plane.plane.deploy("tone", "1", FAST)
    plane.settle()
    status = plane.plane.status()
    assert status["models"]["tone"]["base"] == "llm"
    assert status["models"]["llm"]["adapters"] == ["tone"]
    text = _human("/v1/status", status).splitlines()
    assert text[0].startswith("llm  split={'1': 100}")
    assert text[2:] == ["  LoRA adapter tone  split={'1': 100}  aliases={'latest': '1'}",
                        "    @1  red-black  on llm"]

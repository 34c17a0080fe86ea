"""When the Ray runtime starts its nodes' zygotes (`control.runtime.ray_zygote_fleet`), against a
fake `ray` (no cluster): at the runtime's start when the store has a vLLM deployment, when one
is scaled (to zero included: announced, or waiting for its first request) and on each node
that joins later, never for other backends or with zygotes off; closing stops each zygote
(its folder removed) before killing its actor."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from podium.control.runtime import ray_zygote_fleet
from podium.control.runtime.ray import RayRuntime
from podium.control.runtime.ray_zygote_fleet import ZygoteFleet
from podium.control.store import Store
from podium.routes.table import RouteTable


class RayError(Exception):
    pass


class FakeZygoteActor:
    def __init__(self, cluster: FakeCluster, name: str) -> None:
        self.cluster, self.name = cluster, name
        self.stop = SimpleNamespace(remote=lambda: cluster.stopped.append(name))


class FakeCluster:
    """What the runtime and its fleet use of `ray`: live nodes, and the actors made (zygotes,
    by name) and named ones listed, stopped and killed."""

    exceptions = SimpleNamespace(RayError=RayError)

    def __init__(self, *nodes: str) -> None:
        self.live = list(nodes)
        self.made: list[str] = []
        """The names of the zygote actors made (or got by name), in order."""
        self.named: list[dict[str, str]] = []
        self.stopped: list[str] = []
        self.killed: list[str] = []
        self.util = SimpleNamespace(
            list_named_actors=lambda all_namespaces: list(self.named),
            scheduling_strategies=SimpleNamespace(
                NodeAffinitySchedulingStrategy=lambda node_id, soft: node_id))

    def is_initialized(self) -> bool:
        return True

    def nodes(self) -> list[dict[str, Any]]:
        return [{"NodeID": n, "Alive": True} for n in self.live] + [
            {"NodeID": "dead-node", "Alive": False}]

    def remote(self, cls: type) -> Any:
        def options(**kw: Any) -> Any:
            if cls.__name__ == "NodeZygote":
                self.made.append(kw["name"])
            return SimpleNamespace(remote=lambda *args: None)
        return SimpleNamespace(options=options)

    def get_actor(self, name: str, namespace: str) -> FakeZygoteActor:
        return FakeZygoteActor(self, name)

    def wait(self, refs: list[Any], num_returns: int, timeout: float) -> tuple[list, list]:
        return refs, []

    def kill(self, actor: FakeZygoteActor, no_restart: bool) -> None:
        self.killed.append(actor.name)


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> FakeCluster:
    fake = FakeCluster("node-a", "node-b")
    monkeypatch.setitem(sys.modules, "ray", fake)
    return fake


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    found = Store.open(f"sqlite:///{tmp_path / 'control.db'}")
    found.announce_package("llm", "1", "vllm", str(tmp_path / "llm"), {})
    found.announce_package("echo", "1", "python", str(tmp_path / "echo"), {})
    yield found
    found.close()


def _runtime(store: Store, tmp_path: Path, zygote: bool = True) -> RayRuntime:
    return RayRuntime(store, RouteTable(), tmp_path / "instances", zygote=zygote)


def test_a_runtime_that_starts_with_a_vllm_deployment_starts_the_zygotes_at_once(
        cluster: FakeCluster, store: Store, tmp_path: Path) -> None:
    store.ensure_deployment("llm", "1", "red-black")
    _runtime(store, tmp_path, zygote=False)
    assert cluster.made == []  # zygotes off: none
    _runtime(store, tmp_path)
    assert cluster.made == ["podium-zygote@node-a", "podium-zygote@node-b"]  # the live nodes


def test_scaling_a_vllm_deployment_even_to_zero_starts_the_zygotes_before_any_launch(
        cluster: FakeCluster, store: Store, tmp_path: Path) -> None:
    runtime = _runtime(store, tmp_path)
    runtime.scale("echo", "1", 0)
    runtime.scale("nothing", "1", 0)  # not announced: no zygote, no error
    assert cluster.made == []  # none for another backend
    runtime.scale("llm", "1", 0)
    assert cluster.made == ["podium-zygote@node-a", "podium-zygote@node-b"]
    runtime.scale("llm", "1", 0)
    assert len(cluster.made) == 2  # once


def test_the_fleet_starts_zygotes_once_the_store_wants_them_then_on_nodes_that_join(
        cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    wanted = False
    fleet = ZygoteFleet(cluster, {"namespace": "ns", "workdir": "/w", "modules": None,
                                  "nice": 0}, lambda: wanted)
    fleet.check()
    assert cluster.made == []  # the first check waits CHECK_S
    monkeypatch.setattr(ray_zygote_fleet, "CHECK_S", 0.0)
    fleet.check()
    assert cluster.made == [] and not fleet.wanted  # no deployment wants them yet
    wanted = True  # a vLLM deployment appeared in the store
    fleet.check()
    assert cluster.made == ["podium-zygote@node-a", "podium-zygote@node-b"] and fleet.wanted
    fleet.check()
    assert len(cluster.made) == 2  # no node joined: nothing made
    cluster.live.append("node-c")
    fleet.check()
    assert cluster.made[2:] == ["podium-zygote@node-a", "podium-zygote@node-b",
                                "podium-zygote@node-c"]  # got (2) or made (node-c) by name
    assert fleet.nodes == {"node-a", "node-b", "node-c"}


def test_closing_stops_each_zygote_of_its_namespace_then_kills_its_actor(
        cluster: FakeCluster) -> None:
    cluster.named = [{"namespace": "ns", "name": "podium-zygote@node-a"},
                     {"namespace": "ns", "name": "llm-1-1.0"},  # an instance's host
                     {"namespace": "other", "name": "podium-zygote@node-a"}]
    fleet = ZygoteFleet(cluster, {"namespace": "ns"}, lambda: False)
    fleet.close()
    assert cluster.stopped == cluster.killed == ["podium-zygote@node-a"]

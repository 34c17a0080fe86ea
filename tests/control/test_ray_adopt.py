"""What a restarted Ray runtime takes over, decided against a fake `ray` (no cluster): every
case a previous control plane can leave behind in its namespace."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from podium.control.runtime import ray as ray_runtime
from podium.control.runtime.base import DRAINING, STARTING
from podium.control.runtime.ray import RayRuntime
from podium.control.store import Store
from podium.routes.table import RouteTable


class RayError(Exception):
    pass


@dataclass
class Ref:
    value: Any
    answered: bool = True


@dataclass
class Actor:
    name: str
    namespace: str
    place: dict[str, Any] | None = None
    """What its where() answers; None: it never answers (not placed, or its node is gone)."""
    where: Any = None

    def __post_init__(self) -> None:
        self.where = SimpleNamespace(remote=lambda: Ref(self.place, self.place is not None))


@dataclass
class FakeRay:
    """The part of `ray` that adoption uses."""

    actors: list[Actor] = field(default_factory=list)
    killed: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.exceptions = SimpleNamespace(RayError=RayError)
        self.util = SimpleNamespace(list_named_actors=lambda all_namespaces: [
            {"name": a.name, "namespace": a.namespace} for a in self.actors])

    def remote(self, cls: type) -> Any:
        return cls

    def get_actor(self, name: str, namespace: str) -> Actor:
        return next(a for a in self.actors if (a.name, a.namespace) == (name, namespace))

    def wait(self, refs: list[Ref], num_returns: int, timeout: float) -> tuple[list, list]:
        return [r for r in refs if r.answered], [r for r in refs if not r.answered]

    def get(self, ref: Ref, timeout: float | None = None) -> Any:
        return ref.value

    def kill(self, actor: Actor, no_restart: bool) -> None:
        self.killed.append(actor.name)


def _place(pid: int, exit_code: int | None = None) -> dict[str, Any]:
    return {"url": f"http://127.0.0.1:{pid}", "grpc_target": f"127.0.0.1:{pid + 1}",
            "http_port": pid, "grpc_port": pid + 1, "pid": pid, "node": "127.0.0.1",
            "node_id": f"node-{pid}", "actor_id": f"actor-{pid}", "exit_code": exit_code}


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store.open(f"sqlite:///{tmp_path / 'control.db'}")
    s.announce_package("echo", "1", "python", "/p", {})
    s.ensure_deployment("echo", "1", "red-black")
    return s


def test_a_restart_adopts_each_instances_live_actor_and_clears_the_rest(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = {state: store.add_instance("echo", "1", state=state)
            for state in ("ready", "draining", "crashed", "gone", "unplaced")}
    store.update_instance(rows["crashed"], state="ready")
    for name in ("gone", "unplaced"):
        store.update_instance(rows[name], state="ready")
    namespace = ray_runtime.namespace_for(
        store.engine.url.render_as_string(hide_password=True))
    fake = FakeRay([
        Actor(f"echo-1-{rows['ready']}#0", namespace, _place(1000)),  # replaced by #1
        Actor(f"echo-1-{rows['ready']}#1", namespace, _place(1100)),
        Actor(f"echo-1-{rows['draining']}#0", namespace, _place(1200)),
        Actor(f"echo-1-{rows['crashed']}#2", namespace, _place(1300, exit_code=-9)),
        Actor(f"echo-1-{rows['unplaced']}#0", namespace, None),
        Actor("echo-1-999#0", namespace, _place(1400)),  # its record is gone
        Actor(f"echo-1-{rows['ready']}#1", "podium-another-plane", _place(1500)),
        Actor("not-ours", namespace, _place(1600)),
        Actor("podium-zygote@node-1100", namespace),  # the node's zygote: the next plane's
        Actor("podium-zygote@node-1100", "podium-another-plane"),
    ])
    monkeypatch.setattr(ray_runtime, "connect", lambda address: False)
    monkeypatch.setitem(sys.modules, "ray", fake)

    runtime = RayRuntime(store, RouteTable(), tmp_path / "instances")

    views = {v.id: v for v in runtime.instances()}
    assert {(v.id, v.state, v.pid, v.node) for v in views.values()} == {
        (f"echo-1-{rows['ready']}", STARTING, 1100, "node-1100"),
        (f"echo-1-{rows['draining']}", DRAINING, 1200, "node-1200")}
    assert sorted(fake.killed) == sorted([
        f"echo-1-{rows['ready']}#0", f"echo-1-{rows['crashed']}#2",
        f"echo-1-{rows['unplaced']}#0", "echo-1-999#0"])
    states = {row.id: row.state for _, _, row in store.list_instances(include_stopped=True)}
    assert states == {rows["ready"]: "ready", rows["draining"]: "draining",
                      rows["crashed"]: "stopped", rows["gone"]: "stopped",
                      rows["unplaced"]: "stopped"}
    assert sorted(e.message for e in store.list_events("echo") if e.kind == "instance") == [
        f"echo-1-{rows['ready']}: adopted on Ray node node-1100 (actor actor-1100)",
        f"echo-1-{rows['draining']}: adopted on Ray node node-1200 (actor actor-1200)",
        f"echo-1-{rows['crashed']}: not adopted: its server had exited (-9)",
        f"echo-1-{rows['gone']}: not adopted: no live Ray actor",
        f"echo-1-{rows['unplaced']}: not adopted: its actor did not answer within 10 s"]
    # the deployment still wants one serving instance: scaling to 1 starts none
    runtime.scale("echo", "1", 1)
    assert len(runtime.instances()) == 2


def test_a_closing_plane_kills_its_zygotes_and_no_other_planes(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    namespace = ray_runtime.namespace_for(
        store.engine.url.render_as_string(hide_password=True))
    fake = FakeRay([Actor("podium-zygote@node-1", namespace),
                    Actor("podium-zygote@node-1", "podium-another-plane")])
    monkeypatch.setattr(ray_runtime, "connect", lambda address: False)
    monkeypatch.setitem(sys.modules, "ray", fake)
    runtime = RayRuntime(store, RouteTable(), tmp_path / "instances")
    assert fake.killed == []  # adoption leaves a zygote alone
    runtime.close()
    assert fake.killed == ["podium-zygote@node-1"]

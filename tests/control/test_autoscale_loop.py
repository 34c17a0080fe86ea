"""The autoscaler in the control loop: a real supervisor scraping fake engines' /metrics over
loopback HTTP (with the plane's credential), targets from the package, a fake clock.

Each "instance" is an in-process HTTP server answering `/health/ready` and vLLM's gauges on
`/metrics`; the test sets its gauges the way an engine under load would."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from podium.control.actions import Scale
from podium.control.api import create_app
from podium.control.loop import ControlLoop, LoopConfig
from podium.control.models import PackageRow
from podium.control.plane import ControlPlane
from podium.control.rollout_config import RolloutConfig
from podium.control.runtime.base import READY
from podium.control.runtime.supervisor import Instance, Supervisor
from podium.control.store import Store
from podium.control.world import RuntimeWorld
from podium.routes.stats import VersionStats
from podium.routes.table import RouteTable

KEY = "plane-key"
LLM = {"name": "smol", "version": "1", "backend": "vllm",
       "weights": {"source": "path", "path": "/models/smol"}}


class FakeEngine:
    """One instance's HTTP side: ready, and vLLM's gauges on /metrics behind the credential."""

    def __init__(self) -> None:
        self.waiting = 0.0
        self.kv = 0.0
        self.status = 200
        self.num_scrapes = 0
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.headers.get("Authorization") != f"Bearer {KEY}":
                    self._answer(401, b"")
                elif self.path == "/health/ready":
                    self._answer(200, b"ready")
                elif self.path == "/metrics":
                    engine.num_scrapes += 1
                    self._answer(engine.status, (
                        f'vllm:num_requests_waiting{{engine="0",model_name="smol"}} '
                        f'{engine.waiting}\nvllm:kv_cache_usage_perc{{engine="0",'
                        f'model_name="smol"}} {engine.kv}\n').encode())
                else:
                    self._answer(404, b"")

            def _answer(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class _Attached(Instance):
    engine: FakeEngine | None = None
    exited: bool = False


class AttachedRuntime(Supervisor[_Attached]):
    """The real supervisor; an instance's "process" is a FakeEngine server."""

    def __init__(self, store: Store, table: RouteTable, clock: Callable[[], float]) -> None:
        super().__init__(store, table, credential=KEY, probe_timeout_s=0.5,
                         signal_interval_s=0.01, drain_timeout_s=0, clock=clock)
        self.engines: list[FakeEngine] = []

    def _create(self, model: str, version: str, db_id: int) -> _Attached:
        return _Attached(f"{model}-{version}-{db_id}", model, version, db_id)

    def _launch(self, instance: _Attached, package: PackageRow) -> dict[str, Any]:
        instance.engine = FakeEngine()
        self.engines.append(instance.engine)
        instance.url = instance.engine.url
        return {}

    def _exit_code(self, instance: _Attached) -> int | None:
        return 0 if instance.exited else None

    def _terminate(self, instance: _Attached, *, force: bool) -> None:
        instance.exited = True

    def _release(self, instance: _Attached) -> None:
        if instance.engine is not None:
            instance.engine.close()

    def serving(self) -> list[FakeEngine]:
        return [i.engine for i in self._instances.values()
                if i.state == READY and i.engine is not None]


class Env:
    def __init__(self, tmp_path: Path) -> None:
        self.offset_ms = 0
        self.monotonic_s = 0.0
        """The supervisor's clock (its engine-signal scrapes are timed on it)."""
        self.store = Store.open(f"sqlite:///{tmp_path / 'c.db'}")
        self.table, self.stats = RouteTable(), VersionStats()
        self.runtime = AttachedRuntime(self.store, self.table, lambda: self.monotonic_s)
        self.plane = ControlPlane(self.store, RuntimeWorld(self.runtime, self.table, self.stats),
                                  clock=self.now, materialize=lambda _p: None)
        self.loop = ControlLoop(self.plane, self.runtime, self.table, self.stats,
                                LoopConfig(scale_down_cooldown_ms=60_000))

    def now(self) -> int:
        return int(time.time() * 1000) + self.offset_ms

    def deploy(self, manifest: dict[str, Any], low: int, high: int, count: int = 1) -> None:
        self.store.announce_package(manifest["name"], "1", manifest["backend"], "/p/1", manifest)
        self.store.apply([Scale(manifest["name"], "1", count)])
        self.store.set_scaling(manifest["name"], "1", low, high)

    def step(self, advance_ms: int = 0) -> int:
        """Move the fake clock on, run one pass; the deployment's wanted size after it."""
        self.offset_ms += advance_ms
        self.monotonic_s += 0.02  # past the scrape interval: every pass reads afresh
        self.loop.step()
        return self.store.list_deployments()[0].num_desired

    def ready(self, count: int) -> list[FakeEngine]:
        """Passes until `count` instances serve (each fake answers ready at once)."""
        for _ in range(50):
            engines = self.runtime.serving()
            if len(engines) == count and len(self.runtime.instances()) == count:
                return engines
            self.step()
        raise AssertionError(f"{count} instances never served: {self.runtime.instances()}")

    def events(self) -> list[str]:
        return [e.message for e in self.store.list_events() if e.kind == "scale"]


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path)
    yield e
    e.runtime.close(timeout_s=2)
    e.store.close()


@pytest.mark.parametrize(("gauge", "value", "reason"), [
    ("waiting", 3.0, "waiting 3/instance > target 1"),
    ("kv", 0.95, "kv_cache_usage 0.95/instance > target 0.8"),
], ids=["waiting", "kv-cache"])
def test_an_llm_scales_up_on_its_engine_signal_and_back_after_the_cooldown(
        env: Env, gauge: str, value: float, reason: str) -> None:
    env.deploy({**LLM, "autoscale": {"target_waiting": 1, "max_kv_cache_usage": 0.8,
                                     "scale_up_window_ms": 5_000,
                                     "scale_down_cooldown_ms": 20_000}}, 1, 3)
    [engine] = env.ready(1)
    setattr(engine, gauge, value)  # no request in flight at the gateway: only the engine knows
    assert env.step() == 1  # over its target since now
    assert env.step(4_000) == 1  # for 4 s: inside the window
    assert env.step(1_000) == (3 if gauge == "waiting" else 2)
    assert env.events()[0] == f"smol@1 -> {env.step()} (autoscale: {reason})"
    engines = env.ready(3 if gauge == "waiting" else 2)
    for e in engines:
        e.waiting, e.kv = 0.0, 0.1
    assert env.step() == len(engines)
    assert env.step(19_000) == len(engines)  # cooling down
    assert env.step(1_000) == len(engines) - 1
    # one at a time, each after a cooldown of its own
    for _ in range(len(engines) - 1):
        assert env.step(20_000) >= 1
    assert env.step(20_000) == 1
    assert env.ready(1)


def test_a_failed_scrape_holds_the_instances_instead_of_scaling_down(env: Env) -> None:
    env.deploy({**LLM, "autoscale": {"target_waiting": 1, "scale_down_cooldown_ms": 10_000}},
               1, 2, count=2)
    _idle, second = env.ready(2)
    second.status = 500  # its /metrics fails: idle or not, nobody knows
    # its last good reading (taken as it turned ready, both idle: low since then) stands for
    # 3 scrape intervals, 30 ms here; a pass within that would scale down on it, as designed.
    # The reading is let age first: the test is about after
    env.monotonic_s += 0.1
    for _ in range(10):
        assert env.step(10_000) == 2
    assert second.num_scrapes >= 10  # tried every pass (the interval is 10 ms here)
    second.status = 200
    assert env.step(1_000) == 2  # low from now: the cooldown starts again
    assert env.step(10_000) == 1
    assert "waiting 0/instance < target 1" in env.events()[0]


def test_a_package_without_engine_targets_is_never_scraped(env: Env) -> None:
    env.deploy({"name": "iris", "version": "1", "backend": "python",
                "autoscale": {"target_in_flight": 2, "scale_down_cooldown_ms": 5_000}}, 1, 3)
    [engine] = env.ready(1)
    engine.waiting = 50.0
    for _ in range(5):
        assert env.step(10_000) == 1
    assert engine.num_scrapes == 0
    [endpoint] = env.table.endpoints()
    endpoint.num_in_flight = 5  # its own target, not the plane's default of 8
    assert env.step() == 3
    assert env.events()[0] == "iris@1 -> 3 (autoscale: in_flight 5/instance > target 2)"


def test_deploy_instances_are_the_floor_until_bounds_are_set(env: Env) -> None:
    """`podium deploy --instances 2` keeps 2 (was: shrunk to 1 after the cooldown)."""
    env.store.announce_package("iris", "1", "python", "/p/1", {"backend": "python"})
    env.plane.deploy("iris", "1", RolloutConfig(stages=(100,), num_instances=2,
                                                analysis_window_ms=0, warm_delay_ms=0))
    env.ready(2)
    for _ in range(10):
        assert env.step(60_000) == 2
    row = env.store.list_deployments()[0]
    assert (row.min_instances, row.max_instances, row.num_desired) == (2, 2, 2)
    # the user opens a range through the API: now it is autoscaled, down to their floor
    client = TestClient(create_app(env.plane))
    bad = client.put("/v1/deployments/iris/1/scaling", json={"min_instances": 3,
                                                             "max_instances": 1})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "min_instances"
    assert client.put("/v1/deployments/iris/1/scaling",
                      json={"min_instances": 1, "max_instances": 4}).status_code == 200
    assert env.step() == 2
    assert env.step(60_000) == 1
    assert env.ready(1)


@pytest.mark.parametrize(("autoscale", "field"), [
    ({"target_waiting": 1}, "autoscale.target_waiting"),  # an engine signal, not an LLM
    ({"scale_down_cooldown_ms": -1}, "autoscale.scale_down_cooldown_ms"),
    ({"target_in_flight": 0}, "autoscale.target_in_flight"),
], ids=["engine-target-on-python", "negative-cooldown", "zero-in-flight"])
def test_bad_autoscale_targets_are_a_400_naming_the_field(
        env: Env, tmp_path: Path, autoscale: dict, field: str) -> None:
    from tests.support.control_api import package_dir

    client = TestClient(create_app(env.plane))
    (tmp_path / "bad").mkdir()
    r = client.post("/v1/packages", json={
        "path": package_dir(tmp_path / "bad", "iris", "1", autoscale=autoscale)})
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    assert field in r.json()["error"]["message"]
    good = client.post("/v1/packages", json={"path": package_dir(
        tmp_path, "iris", "1", autoscale={"target_in_flight": 4})})
    assert good.status_code == 201, good.text

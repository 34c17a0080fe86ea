"""The Ray runtime on a real multi-node Ray cluster on this machine (`ray.cluster_utils`: two
raylets with fake CPU counts): replicas on different nodes, custom resources, adoption after a
control-plane crash, and a node lost under load."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from podium.control.rollout_config import RolloutConfig
from podium.control.runtime.base import READY
from podium.control.runtime.ray import RayRuntime
from podium.control.store import Store
from podium.gateway.proxy import Gateway
from tests.support import echo_platform as platform_module
from tests.support.echo_platform import Load, Platform
from tests.support.servers import Served

pytestmark = pytest.mark.ray  # the `nodes` cluster (tests/README.md: tiers)

INSTANCE_CPUS = 0.5
NODE_CPUS = 2
"""Each node holds four instances: only the spread puts two replicas on different nodes."""
EU = "region-eu"

# x is how many milliseconds the request sleeps in the model: 1 for the load, more for the
# requests that are meant to be in flight when a node goes
SLOW_MODEL = '''
import os
import time
import numpy as np


class Model:
    def initialize(self, config):
        pass

    def execute(self, requests):
        time.sleep(max(float(r["x"].max()) for r in requests) / 1000)
        return [{"y": (r["x"] * 2).astype(np.float32),
                 "pid": np.full(r["x"].shape, os.getpid(), dtype=np.int64)} for r in requests]

    def finalize(self):
        pass
'''


def write_package(root: Path, version: str = "1", **resources: object) -> Path:
    """A Python-backend package `echo` (y = 2x, sleeping x ms, and the answering server's
    pid) asking for `resources`."""
    folder = root / f"echo-{version}-{abs(hash(json.dumps(resources, sort_keys=True)))}"
    folder.mkdir(parents=True)
    (folder / "model.py").write_text(SLOW_MODEL)
    (folder / "podium.json").write_text(json.dumps({
        "name": "echo", "version": version, "backend": "python", "max_batch_size": 8,
        "dynamic_batching": None,
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [1]},
                    {"name": "pid", "datatype": "INT64", "shape": [1]}],
        "resources": {"cpus": INSTANCE_CPUS, **resources}}))
    return folder


def _body(x: float) -> dict[str, Any]:
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [x]}]}


@dataclass
class RayNodes:
    cluster: Any
    ray: Any
    head: Any
    """The head node (`ray._private.node.Node`): the drivers' node, and the one with region-eu."""
    worker: Any
    """The other node; it can be removed (the drivers' node cannot)."""


@pytest.fixture(scope="module")
def nodes() -> Iterator[RayNodes]:
    """Two raylets on 127.0.0.1 with 2 fake CPUs each (four instances fit on either one):
    the head, which also offers region-eu, and a worker."""
    import ray
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    # Ray otherwise takes the machine's network address as every node's, the GCS's included;
    # read at import in Ray's child processes (the environment) and at each call here
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, "0")
        mp.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
        yield from _cluster(ray, Cluster)


def _cluster(ray: Any, cluster_class: Any) -> Iterator[RayNodes]:
    cluster, worker = _start_cluster(ray, cluster_class)
    ray.init(address=cluster.address, log_to_driver=False, _node_ip_address="127.0.0.1")
    yield RayNodes(cluster, ray, cluster.head_node, worker)
    ray.shutdown()
    cluster.shutdown()


def _start_cluster(ray: Any, cluster_class: Any, attempts: int = 2) -> tuple[Any, Any]:
    """The two raylets; started again once if one does not register with the GCS within
    Ray's fixed 30 s (a machine loaded by other work)."""
    local = {"node_ip_address": "127.0.0.1", "object_store_memory": 80 * 1024 * 1024,
             "num_cpus": NODE_CPUS}
    cluster = None
    for attempt in range(attempts):
        try:
            cluster = cluster_class(initialize_head=True, head_node_args={
                "include_dashboard": False, "resources": {EU: 1}, **local})
            # Cluster records itself as "the latest cluster" that any address-less
            # ray.init() on this machine joins: forget it, so none joins this one
            ray._common.utils.reset_ray_address()
            return cluster, cluster.add_node(**local)
        except Exception:
            if cluster is not None:
                cluster.shutdown()
            cluster = None
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def _store(tmp_path: Path) -> Store:
    return Store.open(f"sqlite:///{tmp_path / 'control.db'}")


def _announce(store: Store, folder: Path) -> None:
    manifest = json.loads((folder / "podium.json").read_text())
    store.announce_package(manifest["name"], manifest["version"], "python", str(folder),
                           manifest)
    store.ensure_deployment(manifest["name"], manifest["version"], "red-black")


def _wait(condition: Callable[[], bool], runtime: RayRuntime | None, timeout_s: float = 90,
          what: Callable[[], object] = lambda: None) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what()
        if runtime is not None:
            runtime.poll()
        time.sleep(0.1)


def _states(runtime: RayRuntime) -> list[str]:
    return [i.state for i in runtime.instances()]


def _events(store: Store) -> list[str]:
    return [e.message for e in store.list_events("echo")]


def test_replicas_spread_over_nodes_and_custom_resources_pick_the_node(
        nodes: RayNodes, tmp_path: Path) -> None:
    store = _store(tmp_path)
    _announce(store, write_package(tmp_path))
    runtime = RayRuntime(store, Gateway().table, tmp_path / "instances")
    try:
        runtime.scale("echo", "1", 2)
        _wait(lambda: _states(runtime) == [READY, READY], runtime,
              what=lambda: runtime.instances())
        # each node could hold both; SPREAD puts them on different ones
        assert len({i.node for i in runtime.instances()}) == 2
        assert {i.node for i in runtime.instances()} == {nodes.head.node_id,
                                                          nodes.worker.node_id}
        runtime.scale("echo", "1", 0)
        _wait(lambda: runtime.instances() == [], runtime, timeout_s=30)

        # a package asking for the eu label lands on the one node that has it, twice over
        _announce(store, write_package(tmp_path, "eu", custom={EU: 0.001}))
        runtime.scale("echo", "eu", 2)
        _wait(lambda: _states(runtime) == [READY, READY], runtime)
        assert {i.node for i in runtime.instances()} == {nodes.head.node_id}

        # one no node offers waits, and its events say which field and what nodes have
        _announce(store, write_package(tmp_path, "mars", custom={"region-mars": 0.001}))
        runtime.scale("echo", "mars", 1)
        [waiting] = runtime.instances("echo", "mars")
        assert (waiting.state, waiting.node) == ("starting", "")
        assert (f"{waiting.id}: waits for a Ray node: no live node offers "
                "resources.custom.region-mars=0.001 (largest node: 0)") in _events(store)
    finally:
        runtime.close()
        store.close()


# the first control plane: starts two instances, says where they are, then is killed
FIRST_PLANE = """
import json, sys, time
from pathlib import Path
from podium.control.runtime.ray import RayRuntime
from podium.control.store import Store
from podium.routes.table import RouteTable

runtime = RayRuntime(Store.open(sys.argv[2]), RouteTable(), Path(sys.argv[3]),
                     address=sys.argv[1])
runtime.scale("echo", "1", 2)
deadline = time.monotonic() + 120
while [i.state for i in runtime.instances()] != ["ready", "ready"]:
    assert time.monotonic() < deadline, runtime.instances()
    runtime.poll()
    time.sleep(0.1)
print(json.dumps([[i.id, i.pid, i.node] for i in runtime.instances()]), flush=True)
time.sleep(600)
"""


def test_a_restarted_control_plane_adopts_the_live_actors(nodes: RayNodes,
                                                          tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'control.db'}"
    store = _store(tmp_path)
    _announce(store, write_package(tmp_path))
    first = subprocess.Popen(
        [sys.executable, "-c", FIRST_PLANE, nodes.cluster.address, url,
         str(tmp_path / "instances")], stdout=subprocess.PIPE, text=True)
    try:
        line = first.stdout.readline() if first.stdout else ""
        assert line, "the first control plane exited before its instances were ready"
        before = {iid: (pid, node) for iid, pid, node in json.loads(line)}
    finally:
        first.kill()  # a crash: nothing is stopped, the driver just goes
        first.wait(timeout=30)
    placed = [m for m in _events(store) if ": placed on Ray node" in m]
    assert len(placed) == 2

    gateway = Gateway()
    served = Served(gateway.app())
    runtime = RayRuntime(store, gateway.table, tmp_path / "instances")
    try:
        # the same instances, the same servers, probed back in: nothing new booted
        assert {i.id: (i.pid, i.node) for i in runtime.instances()} == before
        _wait(lambda: _states(runtime) == [READY, READY], runtime, timeout_s=30)
        adopted = [m for m in _events(store) if ": adopted on Ray node" in m]
        assert sorted(_actor_ids(adopted)) == sorted(_actor_ids(placed))
        assert [m for m in _events(store) if ": placed on Ray node" in m] == placed
        names = [a["name"] for a in nodes.ray.util.list_named_actors(all_namespaces=True)
                 if a["namespace"] == runtime.namespace]
        assert sorted(names) == sorted(f"{iid}#0" for iid in before)
        r = httpx.post(served.url + "/v2/models/echo/versions/1/infer", json=_body(1.0),
                       timeout=10)
        assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [2.0]
    finally:
        runtime.close()
        served.stop()
        store.close()


def _actor_ids(events: list[str]) -> list[str]:
    return [m.rsplit("actor ", 1)[1].rstrip(")") for m in events]


FIRST = RolloutConfig(stages=(100,), num_instances=2, ready_timeout_ms=90_000,
                      analysis_window_ms=0, warm_delay_ms=0)
IN_FLIGHT_MS = 2000.0
NUM_SLOW = 4


@pytest.fixture
def ray_platform(nodes: RayNodes, tmp_path: Path,
                 monkeypatch: pytest.MonkeyPatch) -> Iterator[Platform]:
    """`podium up` wired as in `tests.support.echo_platform`, on the cluster."""
    monkeypatch.setattr(platform_module, "LocalRuntime", lambda store, table, workdir, **kw:
                        RayRuntime(store, table, workdir, **kw))
    p = Platform(tmp_path)
    yield p
    p.close()


def test_a_node_lost_under_load_moves_its_instance_and_fails_no_request(
        nodes: RayNodes, ray_platform: Platform, tmp_path: Path) -> None:
    """Last in the module: it takes a node away."""
    p = ray_platform
    p.plane.announce(str(write_package(tmp_path)))
    assert p.wait_done(p.deploy("1", FIRST)) == "succeeded"
    runtime = p.runtime
    assert isinstance(runtime, RayRuntime)
    [doomed] = [i for i in runtime.instances() if i.node == nodes.worker.node_id]
    [other] = [i for i in runtime.instances() if i.node == nodes.head.node_id]
    load = Load(p.url, num_clients=4)
    load.start()
    load.wait_requests(50)

    # requests both instances are working on when the doomed one's node goes (the gateway
    # sends each to the instance with the fewest in flight)
    with ThreadPoolExecutor(NUM_SLOW) as pool:
        slow = [pool.submit(httpx.post, p.url + "/v2/models/echo/infer",
                            json=_body(IN_FLIGHT_MS), timeout=60) for _ in range(NUM_SLOW)]
        doomed_endpoint = p.gateway.table.endpoint(doomed.id)
        p.wait_for(lambda: doomed_endpoint.num_in_flight >= 1, 20)
        in_flight = doomed_endpoint.num_in_flight
        removed = threading.Thread(target=nodes.cluster.remove_node, args=(nodes.worker,))
        removed.start()
        answers = [f.result() for f in slow]
    removed.join(timeout=60)

    # the instance comes back on the node that is left; the load never saw a failure
    p.wait_for(lambda: sorted((i.id, i.state, i.node) for i in runtime.instances()) == sorted(
        [(doomed.id, READY, other.node), (other.id, READY, other.node)]), 90)
    served_before = len(load.results)
    load.wait_requests(served_before + 50)
    results = load.stop()
    assert [r for r in results if r.status != 200] == []
    # in flight on the lost node: answered by its server (SIGTERMed as its raylet went, it
    # finishes what it holds) or, where its connection broke, resent once to the other instance
    assert [a.status_code for a in answers] == [200] * NUM_SLOW, [a.text for a in answers]
    outputs = [{o["name"]: o["data"][0] for o in a.json()["outputs"]} for a in answers]
    assert {o["y"] for o in outputs} == {2 * IN_FLIGHT_MS}
    by_lost = sum(o["pid"] == doomed.pid for o in outputs)
    print(f"in flight on the lost instance: {in_flight}; slow ones it answered: {by_lost}; "
          f"retries: {p.gateway.stats.retried}")
    assert in_flight >= 1
    events = _events(p.store)
    assert f"{doomed.id}: its Ray actor died (ActorDiedError)" in events
    assert runtime.num_crashes("echo", "1") == 1

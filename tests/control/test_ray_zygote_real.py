"""Instances on a real local Ray cluster forked from their node's zygote
(`control.runtime.ray_zygote`): an echo instance (its zygote imports `json`, started with the
runtime since the store has its deployment) forks, serves and dies with its host actor, then
is restarted forked again, and a closing plane takes its zygote and its folder with it; the
first real vLLM instance on the node, launched at once on a cluster with no zygote, waits for
its node's zygote's import and boots forked, with its engine core from its server's preloader
(forked from the zygote too), the server's environment in the engine, not the zygote's or
Ray's, and answers a chat request through the gateway."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from podium.control.runtime.base import READY
from podium.control.runtime.detached import pid_alive
from podium.control.runtime.ray import RayRuntime
from podium.control.runtime.ray_placement import actor_name
from podium.control.store import Store
from podium.gateway.proxy import Gateway
from podium.package.defaults import DEFAULT_MODEL
from tests.support.echo_platform import echo_deployed
from tests.support.llm_up import write_llm
from tests.support.preloader import engine_processes, preloader_pid
from tests.support.ray_cluster import BODY, INSTANCE_CPUS, ray_cluster
from tests.support.servers import Served

pytestmark = pytest.mark.ray
__all__ = ["ray_cluster"]  # the module's Ray head (a fixture)

CREDENTIAL = "ray-zygote-credential-0123456789"


def _wait_for(condition: Callable[[], bool], runtime: RayRuntime, timeout_s: float = 60,
              about: Callable[[], str] = lambda: "") -> None:
    start = time.monotonic()
    while not condition():
        waited = time.monotonic() - start
        assert waited < timeout_s, (f"still false after {waited:.1f} s: "
                                    f"{[(i.id, i.state, i.pid) for i in runtime.instances()]} "
                                    f"{about()}")
        runtime.poll()
        time.sleep(0.1)


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _zygotes_ready(runtime: RayRuntime, timeout_s: float) -> dict[str, Any]:
    nodes = runtime.start_zygotes()
    assert nodes
    _wait_for(lambda: all(runtime.zygotes().get(n) for n in nodes), runtime, timeout_s)
    return runtime.zygotes()


def _events(store: Store, model: str) -> list[str]:
    return [e.message for e in store.list_events(model)]


def _zygote_actors(ray: Any) -> list[str]:
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith("podium-zygote@")]


def test_an_echo_instance_forks_from_its_nodes_zygote_and_dies_with_its_host_actor(
        ray_cluster: Any, tmp_path: Path) -> None:
    store = echo_deployed(tmp_path)
    gateway = Gateway(upstream_credential=CREDENTIAL)
    served = Served(gateway.app())
    runtime = RayRuntime(store, gateway.table, tmp_path / "instances", num_cpus=INSTANCE_CPUS,
                         drain_timeout_s=5, credential=CREDENTIAL, zygote=True,
                         zygote_backends=("python",), zygote_modules=["json"])
    try:
        assert _zygote_actors(ray_cluster)  # made with the runtime: the store has the deployment
        [(node, zygote)] = _zygotes_ready(runtime, 60).items()
        runtime.scale("echo", "1", 1)
        _wait_for(lambda: [i.state for i in runtime.instances()] == [READY], runtime)
        [first] = runtime.instances()
        assert _parent(first.pid or 0) == zygote["pid"]  # the zygote's child, not the actor's
        assert any(m.startswith(f"{first.id}: placed on Ray node {node[:12]}") and
                   m.endswith(f", forked from the node's zygote (pid {zygote['pid']})")
                   for m in _events(store, "echo"))
        with httpx.Client(base_url=served.url, timeout=10) as client:
            r = client.post("/v2/models/echo/versions/1/infer", json=BODY)
        assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [6.0]
        r = httpx.post(f"{first.url}/v2/models/echo/versions/1/infer", json=BODY, timeout=10)
        assert r.status_code == 401  # the instance's environment (its credential), forked

        # the host actor dies: its end of the gate closes, the kernel sends the server SIGTERM
        host = ray_cluster.get_actor(actor_name(first.id, 0), namespace=runtime.namespace)
        ray_cluster.kill(host, no_restart=True)
        _wait_for(lambda: runtime.num_crashes("echo", "1") == 1, runtime)
        _wait_for(lambda: not pid_alive(first.pid or 0), runtime, timeout_s=40)
        recorded = Path(f"{zygote['socket']}.exits/{first.pid}")  # its status, by the zygote
        _wait_for(recorded.exists, runtime, timeout_s=10)  # that reaps it (every 0.2 s)
        assert int(recorded.read_text()) in (0, -15)  # drained on SIGTERM, or ended by it
        _wait_for(lambda: [i.state for i in runtime.instances()] == [READY], runtime)
        [second] = runtime.instances()
        assert second.pid != first.pid and _parent(second.pid or 0) == zygote["pid"]
        assert f"{first.id}: its Ray actor died (ActorDiedError)" in _events(store, "echo")

        runtime.scale("echo", "1", 0)
        _wait_for(lambda: runtime.instances() == [], runtime, timeout_s=20)
        assert not pid_alive(second.pid or 0)
    finally:
        runtime.close()
        served.stop()
        store.close()
    deadline = time.monotonic() + 30  # the plane took its zygote along (killed: gone soon)
    while _zygote_actors(ray_cluster):
        assert time.monotonic() < deadline, "the zygote actor outlived its plane"
        time.sleep(0.2)
    assert not Path(zygote["socket"]).parent.exists()  # its socket's folder removed


@pytest.mark.engine
@pytest.mark.timeout(600)
def test_a_vllm_instance_on_ray_boots_forked_from_its_nodes_zygote_and_serves_a_chat(
        ray_cluster: Any, tmp_path: Path, default_model_dir: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'control.db'}")
    folder = write_llm(tmp_path / "packages", "1")
    store.announce_package(DEFAULT_MODEL, "1", "vllm", str(folder),
                           json.loads((folder / "podium.json").read_text()))
    store.ensure_deployment(DEFAULT_MODEL, "1", "red-black")
    gateway = Gateway(upstream_credential=CREDENTIAL)
    served = Served(gateway.app())
    assert _zygote_actors(ray_cluster) == []  # the node has no zygote yet
    runtime = RayRuntime(store, gateway.table, tmp_path / "instances", num_cpus=INSTANCE_CPUS,
                         drain_timeout_s=10, credential=CREDENTIAL, zygote=True)
    try:
        runtime.scale(DEFAULT_MODEL, "1", 1)  # at once: the zygote has just started importing
        [instance] = runtime.instances()
        log_path = Path(instance.log_path or "")
        _wait_for(lambda: [i.state for i in runtime.instances()] == [READY], runtime,
                  timeout_s=300, about=lambda: log_path.read_text()[-3000:])
        [instance] = runtime.instances()
        [zygote] = runtime.zygotes().values()
        assert _parent(instance.pid or 0) == zygote["pid"]
        # the first instance on the node: forked (its host waited for the zygote's import)
        started = [m for m in _events(store, DEFAULT_MODEL)
                   if m.startswith(f"{instance.id}: placed on Ray node")]
        assert len(started) == 1 and re.search(
            rf", forked from the node's zygote \(pid {zygote['pid']}\)(, after waiting "
            r"[0-9.]+ s for its import)?$", started[0]), started
        log = log_path.read_text()
        # its engine preloader was forked from the zygote too, and its engine core from that
        assert "forked from the zygote (engine imported)" in log
        core, workers = engine_processes(preloader_pid(log))
        # the engine took the server's environment at the engine's start (PODIUM_ENGINE_PARENT,
        # set by the server then, puts the engine core in a process group of its own) ...
        assert os.getpgid(core.pid) == core.pid
        # ... without Ray's OMP_NUM_THREADS (which would have had its worker spawned)
        assert "engine worker forked from the engine core" in log, log[-3000:]
        assert len(workers) == 1 and workers[0].name().startswith("VLLM::Worker")
        r = httpx.post(f"{served.url}/v1/chat/completions", timeout=120,
                       json={"model": f"{DEFAULT_MODEL}@1", "max_tokens": 8,
                             "messages": [{"role": "user", "content": "Say hi"}]})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"]
    finally:
        runtime.close()
        served.stop()
        store.close()

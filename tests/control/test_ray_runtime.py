"""The Ray runtime on a real local Ray cluster (one head per module, 2 CPUs, no dashboard):
real `podium serve` instances in actors, the real gateway, and one rollout through the real
control loop."""

from __future__ import annotations

import inspect
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from podium.control.models import PackageRow
from podium.control.rollout_config import RolloutConfig
from podium.control.runtime.base import READY, InstanceView
from podium.control.runtime.detached import pid_alive
from podium.control.runtime.ray import RayRuntime, Resources, resources_for
from podium.control.store import Store
from podium.gateway.proxy import Gateway
from tests.support import echo_platform as platform_module
from tests.support.echo_platform import Load, Platform, echo_deployed, write_echo
from tests.support.ports import free_port
from tests.support.ray_cluster import BODY, FIRST, INSTANCE_CPUS, ray_cluster
from tests.support.servers import Served

__all__ = ["ray_cluster"]  # the module's Ray head (a fixture), shared with other Ray tests

CREDENTIAL = "ray-internal-credential-0123456789"


def _package(backend: str, **engine_args: object) -> PackageRow:
    return PackageRow(name="m", version="1", backend=backend, location="/p",
                      manifest={"backend": backend, "engine_args": engine_args})


@pytest.mark.parametrize(("package", "cluster_gpus", "wanted"), [
    (_package("python"), 8.0, Resources(1.0, 0.0)),
    (_package("vllm"), 0.0, Resources(1.0, 0.0)),
    (_package("vllm"), 4.0, Resources(1.0, 1.0)),
    (_package("vllm", tensor_parallel_size=2, pipeline_parallel_size=2), 4.0,
     Resources(1.0, 4.0)),
], ids=["classic-model-never-gets-a-gpu", "vllm-on-a-cpu-cluster-runs-on-cpu",
        "vllm-gets-one-gpu", "vllm-gets-one-gpu-per-parallel-rank"])
def test_resource_requests(package: PackageRow, cluster_gpus: float, wanted: Resources) -> None:
    assert resources_for(package, cluster_gpus) == wanted


@pytest.mark.parametrize(("args", "message"), [
    (["--runtime", "ray", "--ray-address", "127.0.0.1:{port}"],
     ["no Ray cluster answers at 127.0.0.1:{port}", "ray start --head --port {port}"]),
    (["--runtime", "ray", "--ray-address", "head-without-port"],
     ["'head-without-port' must be HOST:PORT"]),
    (["--ray-address", "127.0.0.1:{port}"], ["--ray-address 127.0.0.1:{port} needs --runtime ray"]),
    (["--ray-cpus", "4"], ["--ray-cpus 4.0 needs --runtime ray"]),
    (["--runtime", "ray", "--ray-cpus", "0"], ["--ray-cpus 0.0 is out of range", "e.g. 4"]),
], ids=["unreachable-head", "address-without-port", "address-without-ray-runtime",
        "cpus-without-ray-runtime", "zero-cpus"])
def test_up_with_a_bad_ray_address_fails_fast_naming_it_and_the_fix(
        tmp_path: Path, args: list[str], message: list[str]) -> None:
    port = free_port()  # nothing listens there
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "podium.cli", "up", *(a.format(port=port) for a in args)],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "PODIUM_HOME": str(tmp_path)}, check=False)
    assert result.returncode == 2, result.stderr
    for part in message:
        assert part.format(port=port) in result.stderr
    assert time.monotonic() - started < 30  # not Ray's own two minutes of retries


def _wait_for(condition: Callable[[], bool], runtime: RayRuntime, timeout_s: float = 60,
              about: Callable[[], str] = lambda: "") -> None:
    """Poll the runtime until `condition`; a timeout names the condition, the instances and
    what `about` adds (a CI run once timed out here without saying which wait it was)."""
    start = time.monotonic()
    while not condition():
        waited = time.monotonic() - start
        assert waited < timeout_s, (
            f"{inspect.getsource(condition).strip()} still false after {waited:.1f} s: "
            f"{[(i.id, i.state, i.pid) for i in runtime.instances()]} {about()}")
        runtime.poll()
        time.sleep(0.1)


def _process(pid: int, log_path: str | None) -> str:
    """What a process that should have ended is doing: its state, command, its log's end."""
    stat = Path(f"/proc/{pid}/stat")
    state = stat.read_text().rsplit(")", 1)[1].split()[0] if stat.exists() else "gone"
    command = Path(f"/proc/{pid}/cmdline").read_bytes()[:200] if stat.exists() else b""
    log = Path(log_path).read_text()[-1500:] if log_path and Path(log_path).exists() else ""
    return f"pid {pid} state {state} {command!r}; its log ends:\n{log}"


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_instances_run_in_ray_actors_restart_after_a_crash_and_drain_to_zero(
        ray_cluster: Any, tmp_path: Path) -> None:
    store = echo_deployed(tmp_path)
    gateway = Gateway(upstream_credential=CREDENTIAL)
    served = Served(gateway.app())
    runtime = RayRuntime(store, gateway.table, tmp_path / "instances",
                         num_cpus=INSTANCE_CPUS, drain_timeout_s=5, credential=CREDENTIAL)
    try:
        runtime.scale("echo", "1", 2)
        _wait_for(lambda: [i.state for i in runtime.instances()] == [READY, READY], runtime)
        instances = runtime.instances()
        assert len({i.url for i in instances}) == 2
        assert ray_cluster.available_resources()["CPU"] == 2 - 2 * INSTANCE_CPUS
        for instance in instances:  # each logs to its own file on the actor's node
            assert instance.log_path and "echo" in Path(instance.log_path).read_text().lower()
        with httpx.Client(base_url=served.url, timeout=10) as client:
            answers = [client.post("/v2/models/echo/versions/1/infer", json=BODY)
                       for _ in range(20)]
        assert {r.status_code for r in answers} == {200}
        assert {tuple(r.json()["outputs"][0]["data"]) for r in answers} == {(6.0,)}
        _assert_sealed(instances[0])

        crashed = instances[0]
        os.kill(crashed.pid or 0, signal.SIGKILL)
        _wait_for(lambda: runtime.num_crashes("echo", "1") == 1, runtime)
        restarted = next(i for i in runtime.instances() if i.id == crashed.id)
        assert restarted.num_restarts == 1
        _wait_for(lambda: [i.state for i in runtime.instances()] == [READY, READY], runtime)
        assert next(i for i in runtime.instances() if i.id == crashed.id).pid != crashed.pid
        events = [e.message for e in store.list_events("echo")]
        assert f"{crashed.id}: exited with status -9" in events

        # the actor itself dies (its worker killed, as when a node goes): the server goes with
        # it, and the instance is restarted in a new actor
        lost = runtime.instances()[1]
        os.kill(_parent(lost.pid or 0), signal.SIGKILL)
        _wait_for(lambda: runtime.num_crashes("echo", "1") == 2, runtime)
        # SIGTERM from the kernel (PR_SET_PDEATHSIG), then a graceful drain bounded by the
        # server's --shutdown-timeout (30 s); 10 s was once too short on a loaded machine
        _wait_for(lambda: not pid_alive(lost.pid or 0), runtime, timeout_s=40,
                  about=lambda: _process(lost.pid or 0, lost.log_path))
        _wait_for(lambda: [i.state for i in runtime.instances()] == [READY, READY], runtime)
        events = [e.message for e in store.list_events("echo")]
        assert f"{lost.id}: its Ray actor died (ActorDiedError)" in events

        pids = [i.pid or 0 for i in runtime.instances()]
        runtime.scale("echo", "1", 0)
        assert {i.state for i in runtime.instances()} == {"draining"}
        assert not any(e.can_take for e in gateway.table.endpoints())
        _wait_for(lambda: runtime.instances() == [], runtime, timeout_s=20)
        assert not any(pid_alive(pid) for pid in pids)
        assert runtime.num_crashes("echo", "1") == 2  # a requested stop is not a crash
        _wait_for(lambda: ray_cluster.available_resources().get("CPU") == 2, runtime)
        states = Counter(r.state for _, _, r in store.list_instances(include_stopped=True))
        assert states == {"stopped": 2}
    finally:
        runtime.close()
        served.stop()
        store.close()


def _assert_sealed(instance: InstanceView) -> None:
    """Called directly, bypassing the gateway, the instance takes only the credential."""
    path = "/v2/models/echo/versions/1/infer"
    for headers in ({}, {"Authorization": "Bearer guessed"}):
        r = httpx.post(instance.url + path, json=BODY, headers=headers, timeout=10)
        assert r.status_code == 401 and "API key" in r.json()["error"]
    assert httpx.get(instance.url + "/v2/health/live", timeout=10).status_code == 200
    r = httpx.post(instance.url + path, json=BODY, timeout=10,
                   headers={"Authorization": f"Bearer {CREDENTIAL}"})
    assert r.status_code == 200
    assert CREDENTIAL.encode() not in Path(f"/proc/{instance.pid}/cmdline").read_bytes()
    assert CREDENTIAL not in Path(instance.log_path or "").read_text()


def test_an_instance_the_cluster_cannot_place_waits_and_is_cancelled_by_a_drain(
        ray_cluster: Any, tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'control.db'}")
    folder = write_echo(tmp_path / "packages", "1")
    store.announce_package("echo", "1", "python", str(folder), {})
    store.ensure_deployment("echo", "1", "red-black")
    runtime = RayRuntime(store, Gateway().table, tmp_path / "instances", num_cpus=3)
    try:
        runtime.scale("echo", "1", 1)  # 3 CPUs on a 2-CPU cluster: never placed
        for _ in range(10):
            runtime.poll()
            time.sleep(0.1)
        [waiting] = runtime.instances()
        assert (waiting.state, waiting.url) == ("starting", "")
        assert (f"{waiting.id}: waits for a Ray node: no live node offers CPUs "
                "(resources.cpus, else --ray-cpus)=3 (largest node: 2)") in [
            e.message for e in store.list_events("echo")]
        runtime.scale("echo", "1", 0)
        _wait_for(lambda: runtime.instances() == [], runtime, timeout_s=10)
        assert runtime.num_crashes("echo", "1") == 0
        assert [r.state for _, _, r in store.list_instances(include_stopped=True)] == ["stopped"]
    finally:
        runtime.close()
        store.close()


# judged loosely on latency, as in test_e2e_rollout: 4 clients, Ray and 2 instances share 2 cores
STAGED = RolloutConfig(stages=(50, 100), num_instances=1, ready_timeout_ms=60_000,
                       analysis_window_ms=1_500, min_requests=20, warm_delay_ms=500,
                       max_p99_ratio=4.0, p99_slack_ms=100.0)


@pytest.fixture
def ray_platform(ray_cluster: Any, tmp_path: Path,
                 monkeypatch: pytest.MonkeyPatch) -> Iterator[Platform]:
    """`podium up` wired as in `tests.support.echo_platform`, on the Ray runtime instead."""
    monkeypatch.setattr(platform_module, "LocalRuntime", lambda store, table, workdir, **kw:
                        RayRuntime(store, table, workdir, num_cpus=INSTANCE_CPUS, **kw))
    p = Platform(tmp_path)
    assert isinstance(p.runtime, RayRuntime)
    yield p
    p.close()


def test_red_black_rollout_on_ray_drops_no_request(ray_platform: Platform,
                                                   tmp_path: Path) -> None:
    for version in ("1", "2"):
        ray_platform.plane.announce(str(write_echo(tmp_path / "packages", version)))
    assert ray_platform.wait_done(ray_platform.deploy("1", FIRST)) == "succeeded"
    load = Load(ray_platform.url, num_clients=4)
    load.start()
    load.wait_requests(100)
    rollout_id = ray_platform.deploy("2", STAGED)
    status = ray_platform.wait_done(rollout_id)
    load.wait_requests(len(load.results) + 100)
    results = load.stop()

    assert status == "succeeded", ray_platform.store.get_rollout(rollout_id).reason
    assert len(results) >= 300
    assert [r for r in results if r.status != 200] == []
    versions = Counter(r.version for r in results)
    assert versions["1"] > 0 and versions["2"] > 0
    assert {r.version for r in results[-50:]} == {"2"}
    ray_platform.wait_for(lambda: [i.version for i in ray_platform.runtime.instances()] == ["2"])


def test_a_region_on_ray_beside_a_local_one_rolls_out_after_it_with_no_failed_request(
        ray_cluster: Any, tmp_path: Path) -> None:
    """Regions with runtimes of their own kinds: a runs local processes, b Ray actors; echo
    1 -> 2 rolls out region by region under load through both gateways."""
    from tests.support.two_regions import BAKE_MS, NAMES, TwoRegions
    from tests.support.two_regions import STAGED as REGION_STAGED

    def on_ray(store: Store, table: Any, workdir: Path) -> RayRuntime:
        return RayRuntime(store, table, workdir, num_cpus=INSTANCE_CPUS, drain_timeout_s=10,
                          credential=CREDENTIAL)

    regions = TwoRegions(tmp_path, {"b": on_ray}, credential=CREDENTIAL)
    try:
        assert isinstance(regions.runtimes["b"], RayRuntime)
        for version in ("1", "2"):
            regions.plane.announce(str(write_echo(tmp_path / "packages", version)))
        regions.serve_v1()
        loads = {n: Load(regions.served[n].url, num_clients=4) for n in NAMES}
        for load in loads.values():
            load.start()
        for load in loads.values():
            load.wait_requests(50)
        rollout_id = regions.plane.deploy("echo", "2", REGION_STAGED)
        status = regions.wait_done(rollout_id, timeout_s=180)
        for load in loads.values():
            load.wait_requests(len(load.results) + 50)
        results = {n: load.stop() for n, load in loads.items()}

        assert status == "succeeded", regions.store.get_rollout(rollout_id).reason
        steps = regions.store.rollout_steps(rollout_id)
        a_done = next(s.at_ms for s in steps if "a: warm delay over" in s.note)
        b_start = next(s.at_ms for s in steps if "b starts" in s.note)
        assert b_start - a_done >= BAKE_MS
        for name, got in results.items():
            assert [r for r in got if r.status != 200] == [], name
            assert {r.version for r in got[-20:]} == {"2"}, name
        assert {i.version for i in regions.runtimes["b"].instances() if i.state == READY} == {
            "2"}  # b serves 2 from its Ray actors; 1 was drained there too
        assert regions.store.splits("echo", "b") == {"2": 100}
    finally:
        regions.close()

"""The local runtime with real (tiny) processes standing in for `podium serve`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from podium.control.runtime.base import READY
from podium.control.runtime.local import BOOT_NICE, SERVE_NICE
from tests.support.local_runtime_env import FAKE, Env, env, wait_for
from tests.support.polling import eventually

__all__ = ["env"]  # the fixture, shared through tests/support


def test_instances_start_become_ready_and_get_routed(env: Env) -> None:
    env.package("1", ready_after_s=0.5)
    runtime = env.runtime()
    runtime.scale("iris", "1", 2)
    assert [i.state for i in runtime.instances()] == ["starting", "starting"]
    assert env.table.models() == {}  # not routed before ready
    wait_for(lambda: all(i.state == READY for i in runtime.instances()), runtime)
    assert env.table.models() == {"iris": ["1"]}
    urls = {i.url for i in runtime.instances()}
    pids = {httpx.get(url + "/x").json()["pid"] for url in urls}
    assert pids == {i.pid for i in runtime.instances()}
    rows = env.store.list_instances("iris")
    assert [r.state for _, _, r in rows] == ["ready", "ready"]
    log = Path(runtime.instances()[0].log_path or "")
    assert "fake instance listening" in log.read_text()


def test_an_instance_boots_low_then_serves_below_the_gateway(env: Env) -> None:
    # ready 3 s after it listens: the boot priority is there to be seen until then, even on a
    # loaded host (with 1 s and a 5 s wait it was missed once in a fast run at load 5.7)
    env.package("1", ready_after_s=3.0)
    runtime = env.runtime()
    runtime.scale("iris", "1", 1)
    wait_for(lambda: runtime.instances()[0].pid is not None, runtime)
    pid = runtime.instances()[0].pid
    assert pid is not None
    # the gate execs `nice -n BOOT_NICE podium serve ...` once the pid is recorded
    wait_for(lambda: os.getpriority(os.PRIO_PROCESS, pid) == BOOT_NICE, runtime)
    assert runtime.instances()[0].state != READY
    wait_for(lambda: runtime.instances()[0].state == READY, runtime)
    serving = os.getpriority(os.PRIO_PROCESS, pid)
    if _may_lower_niceness():
        assert serving == SERVE_NICE
    else:  # an unprivileged plane cannot raise a process's priority: it stays low
        assert serving == BOOT_NICE
    assert 0 < SERVE_NICE < BOOT_NICE  # serving: below the gateway (0), above booting ones


def _may_lower_niceness() -> bool:
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    return os.geteuid() == 0 or soft == resource.RLIM_INFINITY or 20 - soft <= SERVE_NICE


def test_the_gateway_learns_the_packages_bound_idempotency_and_mode_when_it_routes(
        env: Env) -> None:
    env.package("1", manifest={"backend": "python", "idempotent": False, "max_batch_size": 4,
                               "dynamic_batching": {"max_queue": 10},
                               "frontends": "standalone"})
    env.package("2")  # declares none: the gateway's flag, resending allowed, embedded
    runtime = env.runtime()
    runtime.scale("iris", "1", 1)
    runtime.scale("iris", "2", 1)
    wait_for(lambda: len(env.table.endpoints()) == 2, runtime)
    policies = {v: (e.max_in_flight, e.idempotent, e.frontends)
                for _, v, e in env.table.routed()}
    # its queue plus one batch; standalone: the gateway refuses OpenAI requests for it
    assert policies == {"1": (14, False, "standalone"), "2": (None, True, "embedded")}


def test_a_crashed_instance_is_counted_and_restarted(env: Env) -> None:
    env.package("1", crash_after_s=0.8)
    runtime = env.runtime(max_restarts=1)
    runtime.scale("iris", "1", 1)
    first_pid = runtime.instances()[0].pid
    wait_for(lambda: runtime.num_crashes("iris", "1") >= 1, runtime)
    [instance] = runtime.instances()
    assert instance.pid != first_pid and instance.num_restarts == 1
    # after max_restarts it is given up on (and reported), not restarted forever
    wait_for(lambda: runtime.num_crashes("iris", "1") >= 2, runtime)
    assert runtime.instances() == []
    events = [e.message for e in env.store.list_events("iris")]
    assert any("exited with status 3" in m for m in events)


def test_scale_down_drains_before_stopping(env: Env) -> None:
    env.package("1")
    runtime = env.runtime(drain_timeout_s=5)
    runtime.scale("iris", "1", 2)
    wait_for(lambda: sum(i.state == READY for i in runtime.instances()) == 2, runtime)
    runtime.scale("iris", "1", 1)
    draining = [i for i in runtime.instances() if i.state == "draining"]
    assert len(draining) == 1
    endpoint = env.table.endpoint(draining[0].id)
    endpoint.num_in_flight = 1  # the gateway still has a request on it
    for _ in range(5):
        runtime.poll()
        time.sleep(0.05)
    assert os.path.exists(f"/proc/{draining[0].pid}")  # still running: request in flight
    assert not endpoint.can_take
    endpoint.num_in_flight = 0
    wait_for(lambda: len(runtime.instances()) == 1, runtime)
    for _ in range(10):  # a stopped instance stays stopped: it is not a crash to restart
        runtime.poll()
        time.sleep(0.05)
    assert [i.state for i in runtime.instances()] == [READY]
    assert not os.path.exists(f"/proc/{draining[0].pid}")
    assert env.table.models() == {"iris": ["1"]} and len(env.table.endpoints()) == 1
    states = sorted(r.state for _, _, r in env.store.list_instances(include_stopped=True))
    assert states == ["ready", "stopped"]


def test_a_restarted_control_plane_adopts_running_instances(env: Env) -> None:
    env.package("1")
    first = env.runtime()
    first.scale("iris", "1", 1)
    wait_for(lambda: first.instances()[0].state == READY, first)
    pid = first.instances()[0].pid
    env.runtimes.remove(first)  # "kill -9": the old runtime object simply disappears
    second = env.runtime()
    [adopted] = second.instances()
    assert adopted.pid == pid
    second.scale("iris", "1", 1)  # the desired state re-applied: nothing new started
    wait_for(lambda: second.instances()[0].state == READY, second)
    assert [i.pid for i in second.instances()] == [pid]


CRASHING_PLANE = """
import os, sys
from pathlib import Path
from podium.control.runtime.local import LocalRuntime
from podium.control.store import Store
from podium.routes.table import RouteTable

def fake_command(package, http_port, _grpc_port):
    return [sys.executable, sys.argv[3], package, str(http_port)]

store = Store.open(sys.argv[1])
record = store.update_instance

def dying(instance_id, **fields):
    if fields.get("pid"):
        os._exit(9)  # kill -9 right after the spawn, before its pid is written
    record(instance_id, **fields)

store.update_instance = dying
LocalRuntime(store, RouteTable(), Path(sys.argv[2]), command=fake_command).scale("iris", "1", 1)
"""


def _running(marker: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        if marker in (process.info["cmdline"] or []) and (
                process.info["status"] != psutil.STATUS_ZOMBIE):
            found.append(process)
    return found


def test_a_plane_killed_between_spawn_and_record_leaves_no_orphan(env: Env) -> None:
    """The crash falls after the process was spawned and before its pid was stored: the
    process never starts serving, and a restarted plane finds nothing to adopt or kill."""
    env.package("1")
    package = str(env.tmp / "iris-1")
    crash = subprocess.run([sys.executable, "-c", CRASHING_PLANE, str(env.store.engine.url),
                            str(env.tmp / "work"), str(FAKE)], cwd=Path(__file__).parents[2],
                           capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert crash.returncode == 9, crash.stderr
    try:
        eventually(lambda: not _running(package), 10)
        assert _running(package) == [], "an instance outlived the plane unrecorded"
    finally:
        for orphan in _running(package):
            orphan.kill()
    [(_, _, row)] = env.store.list_instances()
    assert row.pid is None and row.http_port is not None  # its ports were written first
    restarted = env.runtime()
    assert restarted.instances() == [] and env.store.list_instances() == []
    restarted.scale("iris", "1", 1)  # and the restarted plane starts it properly
    wait_for(lambda: restarted.instances()[0].state == READY, restarted)
    [(_, _, row)] = env.store.list_instances()
    assert row.pid == restarted.instances()[0].pid and _running(package)[0].pid == row.pid


def test_a_stranger_on_a_recorded_pid_is_not_adopted(env: Env) -> None:
    """A pid reused by another process after its instance died unwatched is not ours."""
    env.package("1")
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        instance_id = env.store.add_instance("iris", "1", state="ready", pid=stranger.pid,
                                             http_port=1, grpc_port=2)
        runtime = env.runtime()
        assert runtime.instances() == []
        assert env.store.list_instances() == [] and stranger.poll() is None
        assert instance_id
    finally:
        stranger.kill()
        stranger.wait()


def _bind(pid: int | None) -> str | None:
    """The VLLM_CPU_OMP_THREADS_BIND a running process was started with."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    values = [e.split(b"=", 1)[1].decode() for e in environ
              if e.startswith(b"VLLM_CPU_OMP_THREADS_BIND=")]
    return values[0] if values else None


def test_each_llm_instance_gets_its_own_core(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's `auto` binding would pin both workers to core 0; the runtime spreads them."""
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    env.package("1", backend="vllm", ready_after_s=0.2)
    env.package("2", ready_after_s=0.2)  # not an LLM: left to itself
    runtime = env.runtime()
    runtime.scale("iris", "1", 2)
    runtime.scale("iris", "2", 1)
    wait_for(lambda: all(i.state == READY for i in runtime.instances()), runtime)
    cores = sorted(os.sched_getaffinity(0))
    llm = [_bind(i.pid) for i in runtime.instances() if i.version == "1"]
    expected = [str(cores[0]), str(cores[1 % len(cores)])]
    assert sorted(llm) == sorted(expected)
    assert [_bind(i.pid) for i in runtime.instances() if i.version == "2"] == [None]


def test_a_lone_llm_instance_is_left_to_choose_its_cores(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """Alone, its server's worker_threads rule binds it (every core of a 2-core machine); a
    second one started beside it takes the core the fewest use, the lone one counting on
    every core."""
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    env.package("1", backend="vllm", ready_after_s=0.2)
    env.package("2", backend="vllm", ready_after_s=0.2)
    runtime = env.runtime()
    runtime.scale("iris", "1", 1)
    wait_for(lambda: all(i.state == READY for i in runtime.instances()), runtime)
    assert [_bind(i.pid) for i in runtime.instances()] == [None]
    runtime.scale("iris", "2", 1)  # a rollout's new version beside it
    wait_for(lambda: len(runtime.instances()) == 2
             and all(i.state == READY for i in runtime.instances()), runtime)
    cores = sorted(os.sched_getaffinity(0))
    assert [_bind(i.pid) for i in runtime.instances() if i.version == "2"] == [str(cores[0])]


def test_the_operators_binding_is_passed_through(env: Env,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    env.package("1", backend="vllm", ready_after_s=0.2)
    runtime = env.runtime()
    runtime.scale("iris", "1", 2)
    wait_for(lambda: all(i.state == READY for i in runtime.instances()), runtime)
    assert [_bind(i.pid) for i in runtime.instances()] == ["nobind", "nobind"]

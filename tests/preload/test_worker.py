"""The engine core's worker: forked, its OpenMP team bound one thread per CPU as vLLM's binding
says, when that binding is one thread per CPU; spawned (with the reason) otherwise."""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from podium.preload import worker

ONE = {"GOMP_CPU_AFFINITY": "0", "OMP_NUM_THREADS": "1"}


@pytest.fixture(autouse=True)
def _nothing_inherited(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker, "_inherited", {})


@pytest.mark.parametrize(("env", "cpu"), [
    (ONE, 0),
    ({"OMP_PLACES": "{1}", "OMP_PROC_BIND": "true", "OMP_NUM_THREADS": "1"}, 1),
    ({"KMP_AFFINITY": "granularity=fine,explicit,proclist=[3]", "OMP_NUM_THREADS": "1"}, 3),
], ids=["gomp", "omp-places", "iomp"])
def test_one_cpu_one_thread_forks_bound_to_that_cpu(env: dict[str, str], cpu: int) -> None:
    assert worker.fork_plan(env, 1) == ([cpu], "")


@pytest.mark.parametrize(("env", "cpus"), [
    ({"GOMP_CPU_AFFINITY": "0 1", "OMP_NUM_THREADS": "2"}, [0, 1]),
    ({"OMP_PLACES": "{2,3,5}", "OMP_PROC_BIND": "true", "OMP_NUM_THREADS": "3"}, [2, 3, 5]),
    ({"KMP_AFFINITY": "granularity=fine,explicit,proclist=[1,0]", "OMP_NUM_THREADS": "2"},
     [1, 0]),
], ids=["gomp", "omp-places", "iomp"])
def test_a_thread_per_cpu_forks_its_team_bound_in_that_order(
        env: dict[str, str], cpus: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker, "_runtime", lambda: object())  # the engine core's libgomp
    assert worker.fork_plan(env, 1) == (cpus, "")


@pytest.mark.parametrize(("env", "world_size", "why"), [
    ({"GOMP_CPU_AFFINITY": "0 1", "OMP_NUM_THREADS": "1"}, 1, "2 CPU(s), 1 thread(s)"),
    ({"GOMP_CPU_AFFINITY": "0 0", "OMP_NUM_THREADS": "2"}, 1, "2 CPU(s), 2 thread(s)"),
    ({}, 1, "no OpenMP binding"),
    (ONE, 2, "2 workers"),
    ({"GOMP_CPU_AFFINITY": "0-3", "OMP_NUM_THREADS": "1"}, 1, "no OpenMP binding"),
], ids=["fewer-threads", "a-cpu-twice", "nobind", "two-workers", "a-range"])
def test_anything_else_is_spawned_with_the_reason(env: dict[str, str], world_size: int,
                                                  why: str) -> None:
    cpu, reason = worker.fork_plan(env, world_size)
    assert cpu is None and why in reason


def test_a_binding_variable_the_preloader_started_with_means_spawn(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker, "_inherited", {"OMP_NUM_THREADS": "4"})
    cpu, reason = worker.fork_plan(ONE, 1)
    assert cpu is None and "OMP_NUM_THREADS set before the preloader started" in reason


def test_a_runtime_without_gomp_parallel_spawns_a_team(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker, "_runtime", lambda: None)
    cpus, reason = worker.fork_plan({"GOMP_CPU_AFFINITY": "0 1", "OMP_NUM_THREADS": "2"}, 1)
    assert cpus is None and "GOMP_parallel" in reason
    assert worker.fork_plan(ONE, 1) == ([0], "")  # one thread needs no region


def report(path: str, inherited_fds: list[int], **_: object) -> None:
    import torch

    Path(path).write_text(json.dumps({"cpus": sorted(os.sched_getaffinity(0)),
                                      "name": Path("/proc/self/comm").read_text().strip(),
                                      "threads": torch.get_num_threads(),
                                      "ppid": os.getppid(), "to_close": inherited_fds}))


def team_report(path: str, inherited_fds: list[int], **_: object) -> None:
    """The forked worker's threads after a parallel op ran: each thread's CPUs."""
    import torch

    x = torch.randn(512, 512)
    for _ in range(4):
        (x @ x).sum()
    threads = {}
    for task in Path("/proc/self/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list"):
                threads[task.name] = line.split()[1]
    Path(path).write_text(json.dumps({"main": threads.pop(str(os.getpid())),
                                      "others": sorted(threads.values()),
                                      "threads": torch.get_num_threads()}))


def test_a_forked_workers_team_is_bound_one_thread_per_cpu(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Forked from a fresh interpreter, as the engine core is from the preloader: a process
    whose OpenMP runtime already ran a team (this test process, after other tests' torch
    work) leaves its forked child's runtime waiting for threads that no longer exist (the
    precondition `bind_team` states), and the child hung here under xdist."""
    cores = sorted(os.sched_getaffinity(0))
    cpus = cores[:2] if len(cores) > 1 else cores * 2  # one CPU: both threads on it
    binding = {"GOMP_CPU_AFFINITY": " ".join(map(str, cpus)), "OMP_NUM_THREADS": "2"}
    for key in worker.BINDING:  # the fresh interpreter's runtime loads unbound
        monkeypatch.delenv(key, raising=False)
    out = tmp_path / "team.json"
    fresh = multiprocessing.get_context("spawn").Process(
        target=_fork_a_team_worker, args=(str(out), cpus, binding, len(cores) == 1))
    fresh.start()
    fresh.join(180)
    if fresh.exitcode is None:
        fresh.kill()
    assert fresh.exitcode == 0, f"the forked worker did not finish (exit {fresh.exitcode})"
    child = json.loads(out.read_text())
    assert child["threads"] == 2
    assert child["main"] == str(cpus[0])  # the team's thread 0, and what it starts later
    # exactly one thread (the team's second) on the second CPU; torch's others on the first
    assert child["others"].count(str(cpus[1])) >= 1
    if cpus[0] != cpus[1]:
        assert child["others"].count(str(cpus[1])) == 1
        assert set(child["others"]) <= {str(cpus[0]), str(cpus[1])}


def test_a_forked_worker_binds_itself_before_its_target_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = max(os.sched_getaffinity(0))
    for key, value in {"GOMP_CPU_AFFINITY": str(cpu), "OMP_NUM_THREADS": "1"}.items():
        monkeypatch.setenv(key, value)  # as vLLM's executor sets them around the start
    out = tmp_path / "worker.json"
    config = SimpleNamespace(parallel_config=SimpleNamespace(world_size=1))
    context = worker.WorkerContext()  # as vLLM's make_worker_process uses it
    ready_reader, ready_writer = context.Pipe(duplex=False)
    death_reader, death_writer = context.Pipe(duplex=False)
    proc = context.Process(target=report, args=(str(out),), kwargs={
        "vllm_config": config, "ready_pipe": ready_writer, "death_pipe": death_reader,
        "inherited_fds": []})
    proc.start()
    proc.join(120)
    assert proc.exitcode == 0
    child = json.loads(out.read_text())
    # vLLM's worker_main closes `inherited_fds`: the parent's ends, so the death pipe's EOF
    # reaches the worker when the engine core dies
    assert child == {"cpus": [cpu], "name": "VLLM::Worker", "threads": 1, "ppid": os.getpid(),
                     "to_close": [ready_reader.fileno(), death_writer.fileno()]}


def test_vllms_own_title_becomes_the_forked_workers_name(tmp_path: Path) -> None:
    titles: list[str] = []

    def set_process_title(name: str, suffix: str = "", prefix: str = "VLLM") -> None:
        titles.append(name)  # vLLM's: setproctitle, which does nothing in a forked child

    out = tmp_path / "comm"
    pid = os.fork()
    if pid == 0:  # the child: as vLLM's worker_main titles itself
        try:
            worker._naming(set_process_title)(name="Worker", suffix="TP0")
            out.write_text(Path("/proc/self/comm").read_text())
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert out.read_text().strip() == "VLLM::Worker_TP"  # the kernel keeps 15 characters


def test_naming_never_fails_the_start() -> None:
    def odd_title(*args: object) -> None:
        pass

    comm = Path("/proc/self/comm").read_text()
    worker._naming(odd_title)("not", "what", "vLLM", "passes")  # no exception, no name
    assert Path("/proc/self/comm").read_text() == comm


def _fork_a_team_worker(out: str, cpus: list[int], binding: dict[str, str],
                        one_cpu: bool) -> None:
    """In a fresh interpreter: load the OpenMP runtime unbound (torch, as the preloader
    does), set vLLM's binding for its worker, fork the worker through `WorkerContext` as the
    engine core does and wait for its `team_report`; exit 0 when it finished cleanly."""
    import torch  # noqa: F401  (the runtime loads now, before the binding is set)

    os.environ.update(binding)
    worker._inherited = {}
    if one_cpu:  # fork_plan refuses a CPU twice; the binding itself is what's tested
        worker.fork_plan = lambda env, n: (cpus, "")
    config = SimpleNamespace(parallel_config=SimpleNamespace(world_size=1))
    context = worker.WorkerContext()
    _ready_reader, ready_writer = context.Pipe(duplex=False)
    death_reader, _death_writer = context.Pipe(duplex=False)
    proc = context.Process(target=team_report, args=(out,), kwargs={
        "vllm_config": config, "ready_pipe": ready_writer, "death_pipe": death_reader,
        "inherited_fds": []})
    proc.start()
    proc.join(120)
    if proc.exitcode is None:
        proc.kill()
    sys.exit(0 if proc.exitcode == 0 else 1)

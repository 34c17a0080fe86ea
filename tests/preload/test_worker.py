"""The engine core's worker: forked and bound to its CPU when vLLM binds it to one CPU with one
OpenMP thread, spawned (with the reason) otherwise."""

from __future__ import annotations

import json
import os
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
    assert worker.fork_plan(env, 1) == (cpu, "")


@pytest.mark.parametrize(("env", "world_size", "why"), [
    ({"GOMP_CPU_AFFINITY": "0 1", "OMP_NUM_THREADS": "2"}, 1, "2 CPU(s), 2 thread(s)"),
    ({}, 1, "no OpenMP binding"),
    (ONE, 2, "2 workers"),
    ({"GOMP_CPU_AFFINITY": "0-3", "OMP_NUM_THREADS": "1"}, 1, "no OpenMP binding"),
], ids=["two-cpus", "nobind", "two-workers", "a-range"])
def test_anything_else_is_spawned_with_the_reason(env: dict[str, str], world_size: int,
                                                  why: str) -> None:
    cpu, reason = worker.fork_plan(env, world_size)
    assert cpu is None and why in reason


def test_a_binding_variable_the_preloader_started_with_means_spawn(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker, "_inherited", {"OMP_NUM_THREADS": "4"})
    cpu, reason = worker.fork_plan(ONE, 1)
    assert cpu is None and "OMP_NUM_THREADS set before the preloader started" in reason


def report(path: str, inherited_fds: list[int], **_: object) -> None:
    import torch

    Path(path).write_text(json.dumps({"cpus": sorted(os.sched_getaffinity(0)),
                                      "name": Path("/proc/self/comm").read_text().strip(),
                                      "threads": torch.get_num_threads(),
                                      "ppid": os.getppid(), "to_close": inherited_fds}))


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

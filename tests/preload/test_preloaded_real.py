"""A real instance whose engine core forked from the preloader: it serves (OpenAI and KServe),
and its engine runs with the server's settings, not the preloader's. The session instance is
the preloaded case. A preloader killed before the engine starts is bypassed with a warning,
never a failed boot: that case is the int8 instance of tests/package/test_precision_real.py
(`tests/support/preloader.py::start_bypassed`), which boots an engine of its own anyway."""

from __future__ import annotations

import os
import re
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import API_KEY, LLM
from tests.support.harness import RunningInstance
from tests.support.preloader import engine_processes, preloader_pid
from tests.support.spare import SPARE_ENV, Spare

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]
HEADERS = {"authorization": f"Bearer {API_KEY}"}


def test_the_shared_instance_booted_through_the_preloader_and_serves(
        instance: RunningInstance) -> None:
    log = instance.log()
    preloader = preloader_pid(log)
    assert "engine preloader bypassed" not in log
    assert engine_processes(preloader)[0].is_running()  # forked by it, not spawned by the server
    r = httpx.post(f"{instance.openai_url}/chat/completions", headers=HEADERS, timeout=120,
                   json={"model": LLM, "max_tokens": 4,
                         "messages": [{"role": "user", "content": "Say hi"}]})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"]
    body = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1],
                        "data": ["The capital of France is"]},
                       {"name": "sampling_parameters", "datatype": "BYTES", "shape": [1],
                        "data": ['{"max_tokens": 3}']}]}
    r = httpx.post(f"{instance.http_url}/v2/models/{LLM}/infer", headers=HEADERS, json=body,
                   timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"][0]


def test_the_engine_has_the_servers_settings_not_the_preloaders(
        instance: RunningInstance) -> None:
    log = instance.log()
    preloader = preloader_pid(log)
    core, _ = engine_processes(preloader)
    # set by the server when it starts the engine, after the preloader started: the engine
    # core acted on it (podium.engine_patches.lifecycle: a process group of its own) ...
    assert b"PODIUM_ENGINE_PARENT=" not in Path(f"/proc/{preloader}/environ").read_bytes()
    assert os.getpgid(core.pid) == core.pid
    # ... and the worker sized its KV cache by the server's VLLM_CPU_KVCACHE_SPACE
    space = os.environ["VLLM_CPU_KVCACHE_SPACE"]
    assert re.search(rf"\(Worker pid=\d+\).*Explicitly set \({float(space)}/", log), space
    # vLLM's CPU platform preloads libgomp for its engine: the preloader started with it
    maps = Path(f"/proc/{core.pid}/maps").read_text()
    assert "libgomp" in maps


def _threads(pid: int) -> dict[int, tuple[str, int]]:
    """Each thread of `pid`: (its `Cpus_allowed_list`, its CPU time in clock ticks)."""
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        status = (task / "status").read_text()
        cpus = re.search(r"^Cpus_allowed_list:\s*(\S+)", status, re.M).group(1)  # type: ignore[union-attr]
        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        found[int(task.name)] = (cpus, int(fields[11]) + int(fields[12]))  # utime + stime
    return found


def test_each_forked_workers_openmp_team_is_bound_as_chosen_at_boot(
        spare_instance: Spare) -> None:
    """The worker-thread choice of the boot (the spare instance runs `auto`: every core of a
    2-core instance), read back from /proc: in its engine's worker, forked from its engine core
    (not spawned), the main thread (the team's thread 0) on the first CPU and one team thread
    alone on each other CPU, which computed."""
    from podium.backends.vllm import worker_threads

    instance = spare_instance.get()
    log = instance.log()
    chosen = worker_threads.choose("auto", {**os.environ, **SPARE_ENV}, os.sched_getaffinity(0))
    assert "engine worker spawned" not in log
    forked = re.findall(r"engine worker forked from the engine core, its OpenMP team bound "
                        r"to CPU\(s\) (\d+(?:,\d+)*)", log)
    assert forked, log[-3000:]
    if chosen.bind is not None:  # auto chose the team (this 2-core kind): the log says so
        assert f"{chosen.threads} thread(s) on CPU(s) {chosen.bind} (auto" in log
        assert set(forked) == {chosen.bind}
    preloader = preloader_pid(log)
    workers = [w for core in psutil.Process(preloader).children() for w in core.children()]
    assert len(workers) == len(forked)
    for worker in workers:
        assert "spawn_main" not in " ".join(worker.cmdline())  # forked, not spawned
        cpus = forked[0].split(",")
        threads = _threads(worker.pid)
        assert threads.pop(worker.pid)[0] == cpus[0]
        for cpu in cpus[1:]:  # one team thread on each other CPU, alone there, and it ran
            team = [time for bound, time in threads.values() if bound == cpu]
            assert len(team) == 1 and team[0] > 0, (cpu, threads)
        assert {bound for bound, _ in threads.values()} <= set(cpus), threads


def test_the_boot_cuts_ran_in_the_real_engine(instance: RunningInstance) -> None:
    """The engine patches that shortened `start engine` acted in the engine's processes: the
    worker's KV cache allocation went through the kernel-zeroed mapping (logged by the patch as
    it maps it, the size vLLM asked for), and the engine core loaded its tokenizer beside the
    worker. Off (``PODIUM_KV_LAZY_ZERO=0``) or not registered, neither line is written."""
    log = instance.log()
    assert "engine core: its tokenizer loads while the worker starts" in log
    found = re.search(r"\(Worker pid=\d+\).*KV cache: (\d+) bytes mapped, zeroed by the "
                      r"kernel as first used", log)
    assert found, log[-3000:]
    space_gib = float(os.environ["VLLM_CPU_KVCACHE_SPACE"])
    assert 0.9 * space_gib * 2**30 <= int(found.group(1)) <= space_gib * 2**30

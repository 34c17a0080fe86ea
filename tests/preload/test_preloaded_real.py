"""A real instance whose engine core forked from the preloader: it serves (OpenAI and KServe),
its engine runs with the server's settings, not the preloader's, and a preloader killed before
the engine starts is bypassed with a warning, never a failed boot."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import API_KEY, LLM
from tests.support.harness import RunningInstance, start_instance

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]
HEADERS = {"authorization": f"Bearer {API_KEY}"}
PRELOADER = re.compile(r"boot step start preloader took [0-9.]+s \(pid (\d+),")


def _preloader(log: str) -> int:
    found = PRELOADER.search(log)
    assert found, "no preloader in the boot log"
    return int(found.group(1))


def _engine_processes(parent: int) -> tuple[psutil.Process, list[psutil.Process]]:
    """The first engine core among `parent`'s children (a forked engine core keeps the
    preloader's process name, a spawned one is named by vLLM; either has its worker, spawned
    or forked, as its child; the server's and the preloader's other children have none)."""
    children = psutil.Process(parent).children()
    cores = [c for c in children if c.name().startswith("VLLM::EngineCore")
             or any(w.name().startswith("VLLM::Worker") for w in c.children())
             or c.children()]
    assert len(cores) >= 1, [c.name() for c in children]
    return cores[0], cores[0].children()


def test_the_shared_instance_booted_through_the_preloader_and_serves(
        instance: RunningInstance) -> None:
    log = instance.log()
    preloader = _preloader(log)
    assert "engine preloader bypassed" not in log
    assert _engine_processes(preloader)[0].is_running()  # forked by it, not spawned by the server
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
    preloader = _preloader(log)
    core, _ = _engine_processes(preloader)
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


def test_a_preloader_killed_before_the_engine_starts_is_bypassed(
        tmp_path: Path, default_model_dir: Path) -> None:
    from podium.package.defaults import write_default_package

    package = write_default_package(tmp_path / "pkg")
    instance = start_instance([str(package.root)], tmp_path / "instance.log", api_key=API_KEY)
    try:
        deadline = time.monotonic() + 300
        while not PRELOADER.search(instance.log()):
            assert time.monotonic() < deadline and instance.process.poll() is None, \
                instance.log()[-3000:]
            time.sleep(0.05)
        preloader = _preloader(instance.log())
        os.kill(preloader, signal.SIGKILL)  # the engine check is still importing vLLM
        instance.wait_ready()
        log = instance.log()
        assert "start engine" in log.split("engine preloader bypassed", 1)[0]
        assert "engine preloader bypassed: it (pid" in log
        core, _ = _engine_processes(instance.process.pid)
        assert core.ppid() == instance.process.pid  # spawned the usual way
        r = httpx.post(f"{instance.openai_url}/chat/completions", headers=HEADERS,
                       timeout=120, json={"model": LLM, "max_tokens": 2,
                                          "messages": [{"role": "user", "content": "Hi"}]})
        assert r.status_code == 200, r.text
    finally:
        instance.stop()

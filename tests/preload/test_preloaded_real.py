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
import pytest

from tests.conftest import API_KEY, LLM
from tests.support.harness import RunningInstance
from tests.support.preloader import engine_processes, preloader_pid

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

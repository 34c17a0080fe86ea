"""A standalone package of the default LLM on the real engine: tritonclient HTTP and gRPC
generate, /v1 refused naming the mode, nothing of the OpenAI layer imported in the instance
process, the gRPC port closed while the engine starts, and the boot log in the seed's order.
Last, the instance is killed outright (SIGKILL) and its engine must stop itself.

ONE engine boot for the module: the instance serves the standalone LLM and a standalone
Python probe that reports the instance process's `sys.modules` over KServe.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest

from tests.conftest import LLM
from tests.support.harness import RunningInstance, start_instance
from tests.support.polling import eventually

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

PROBE = '''
import sys

import numpy as np


class Model:
    def initialize(self, config):
        pass

    def execute(self, requests):
        prefix = requests[0]["prefix"][0]
        prefix = prefix.decode() if isinstance(prefix, bytes) else str(prefix)
        names = sorted(m for m in sys.modules if m == prefix or m.startswith(prefix + "."))
        return [{"modules": np.array(names, dtype=object)}]

    def finalize(self):
        pass
'''
ENGINE_OWN_OPENAI_MODULES = {
    "vllm.entrypoints.openai", "vllm.entrypoints.openai.chat_completion",
    "vllm.entrypoints.openai.chat_completion.protocol", "vllm.entrypoints.openai.parser",
    "vllm.entrypoints.openai.parser.harmony_utils", "vllm.entrypoints.openai.responses",
    "vllm.entrypoints.openai.responses.protocol"}
"""What vLLM 0.32's engine imports of vllm.entrypoints.openai by itself (`AsyncLLM` →
`v1.structured_output` → `parser.abstract_parser` → the chat and responses request models):
pydantic protocol modules, no serving class. Everything else under it is the OpenAI layer."""


@dataclass
class Booted:
    instance: RunningInstance
    grpc_checks_while_starting: list[bool]
    """For each check while readiness was 503: whether the gRPC port accepted a connection."""


def _repository(root: Path) -> Path:
    from podium.package.defaults import default_llm_manifest
    from podium.package.package import write_manifest

    write_manifest(root / LLM, {**default_llm_manifest(), "frontends": "standalone"})
    probe = root / "modules"
    probe.mkdir()
    (probe / "model.py").write_text(PROBE)
    (probe / "podium.json").write_text(json.dumps({
        "name": "modules", "backend": "python", "frontends": "standalone",
        "max_batch_size": 0, "inputs": [{"name": "prefix", "datatype": "BYTES", "shape": [1]}],
        "outputs": [{"name": "modules", "datatype": "BYTES", "shape": [-1]}]}))
    return root


def _ready(instance: RunningInstance) -> bool:
    try:
        return httpx.get(f"{instance.http_url}/health/ready", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _grpc_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def booted(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Booted]:
    root = tmp_path_factory.mktemp("standalone")
    instance = start_instance(["--repository", str(_repository(root / "repo"))],
                              root / "instance.log")
    checks: list[bool] = []
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not _ready(instance):
            assert instance.process.poll() is None, instance.log()[-4000:]
            is_open = _grpc_open(instance.grpc_port)
            if not _ready(instance):  # still starting after the check: it counts
                checks.append(is_open)
            time.sleep(0.5)
        instance.wait_ready(timeout_s=60)
        yield Booted(instance, checks)
    finally:
        killed = instance.process.poll() == -signal.SIGKILL  # by the last test, on purpose
        code = instance.stop()
        assert killed or code == 0, instance.log()[-4000:]


def _generate_inputs(module, prompt: str) -> list:
    text = module.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([prompt.encode()], dtype=object))
    sampling = module.InferInput("sampling_parameters", [1], "BYTES")
    sampling.set_data_from_numpy(np.array([json.dumps(
        {"max_tokens": 4, "temperature": 0}).encode()], dtype=object))
    exclude = module.InferInput("exclude_input_in_output", [1], "BOOL")
    exclude.set_data_from_numpy(np.array([True]))
    return [text, sampling, exclude]


def _loaded(module, url: str, prefix: str) -> set[str]:
    client = module.InferenceServerClient(url)
    tensor = module.InferInput("prefix", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([prefix.encode()], dtype=object))
    return {m.decode() for m in client.infer("modules", [tensor]).as_numpy("modules")}


def test_the_grpc_port_stays_closed_while_the_engine_starts(booted: Booted) -> None:
    assert booted.grpc_checks_while_starting, "readiness was never seen 503 during boot"
    assert not any(booted.grpc_checks_while_starting), "gRPC accepted before ready"


def test_a_standalone_llm_answers_tritonclient_over_http_and_grpc(booted: Booted) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    http = httpclient.InferenceServerClient(booted.instance.http_url.removeprefix("http://"))
    assert http.is_model_ready(LLM)
    text = http.infer(LLM, _generate_inputs(httpclient, "The capital of France is"))
    assert text.as_numpy("text_output")[0].decode().strip()
    grpc = grpcclient.InferenceServerClient(booted.instance.grpc_url)
    assert grpc.is_server_ready()
    text = grpc.infer(LLM, _generate_inputs(grpcclient, "One, two,"))
    assert text.as_numpy("text_output")[0].decode().strip()


def test_v1_is_refused_naming_the_mode_and_the_instance_serves_on(booted: Booted) -> None:
    url = booted.instance.http_url
    for path in ("/v1/chat/completions", "/v1/completions"):
        r = httpx.post(f"{url}{path}", json={"model": LLM, "prompt": "hi",
                                             "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 404, r.text
        message = r.json()["error"]["message"]
        assert "runs standalone" in message and '"frontends": "standalone"' in message
    assert httpx.get(f"{url}/v1/models").status_code == 404
    r = httpx.post(f"{url}/v2/models/{LLM}/generate",
                   json={"text_input": "Hello", "parameters": {"max_tokens": 2}}, timeout=120)
    assert r.status_code == 200 and r.json()["text_output"], r.text


def test_nothing_of_the_openai_layer_is_imported_in_the_instance(booted: Booted) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    url = booted.instance.http_url.removeprefix("http://")
    assert "vllm.v1.engine.async_llm" in _loaded(httpclient, url, "vllm.v1")  # the probe sees
    assert _loaded(httpclient, url, "podium.frontends.openai") == set()
    entrypoints = _loaded(grpcclient, booted.instance.grpc_url, "vllm.entrypoints")
    assert not {m for m in entrypoints if m.startswith("vllm.entrypoints.launchers")}
    assert not {m for m in entrypoints if "serving" in m.rsplit(".", 1)[-1]}
    openai = {m for m in entrypoints if m.startswith("vllm.entrypoints.openai")}
    assert openai <= ENGINE_OWN_OPENAI_MODULES, openai - ENGINE_OWN_OPENAI_MODULES


def test_the_boot_log_shows_each_step_in_the_seeds_order_ending_with_the_port(
        booted: Booted) -> None:
    log = booted.instance.log()
    order = ["open packages", "mount frontends", "check engine", "resolve weights",
             "load plugins", "wipe metrics directory", f"start engine {LLM}@1",
             "open gRPC port"]
    at = [log.index(f"boot step {step} took ") for step in order]
    assert at == sorted(at), order
    assert "standalone: KServe v2 over HTTP and gRPC; no OpenAI layer" in log
    ready = next(line for line in log.splitlines() if "ready: 2 model(s)" in line)
    assert ready.rsplit(" → ", 1)[1].startswith("open gRPC port ")


def test_a_killed_server_takes_its_engine_with_it(booted: Booted) -> None:
    """SIGKILL (the OOM killer, a supervisor) gives the server no chance to stop its engine:
    the engine core sees its server gone and stops itself, aborting what it ran. Before, it
    kept running with its KV cache for good.

    Last in this module, on its instance (done serving): the suite starts no engine for it
    alone (tests/server/test_shutdown.py holds the drain)."""
    instance = booted.instance
    children = psutil.Process(instance.process.pid).children(recursive=True)
    assert children, "the engine core runs in a child process"
    body = {"text_input": "Tell a story:",
            "parameters": {"max_tokens": 400, "ignore_eos": True}}

    def generate() -> None:
        with contextlib.suppress(httpx.HTTPError):  # the server is killed under it
            httpx.post(f"{instance.http_url}/v2/models/{LLM}/generate", json=body, timeout=60)

    request = threading.Thread(target=generate)
    request.start()
    try:
        assert eventually(lambda: _running(instance) >= 1, timeout_s=60), "never generating"
        instance.process.kill()
        instance.process.wait(10)
        _, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, f"engine processes outlived their server: {alive}"
        assert "that started this engine core is gone" in instance.log()
        request.join(30)
    finally:
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()


def _running(instance: RunningInstance) -> float:
    """The requests the engine is running now (its own gauge; the in-flight gauge is the
    OpenAI layer's, which a standalone instance has not)."""
    text = httpx.get(f"{instance.http_url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:num_requests_running{"))

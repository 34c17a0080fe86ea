"""The gRPC port opens only once every model is loaded; HTTP answers liveness from the start.

A Python model whose `initialize` takes a few seconds holds boot in its load step: meanwhile
HTTP liveness is 200, readiness and inference 503, and the gRPC port refuses connections. Once
ready, gRPC serves, and the boot log ends with the port opening."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.support.harness import PODIUM, start_instance

MODEL = '''
import pathlib, time


class Model:
    def initialize(self, config):
        gate = pathlib.Path(config["model_repository"]) / "go"
        print("initialize started", flush=True)
        while not gate.exists():  # the test says when the load may finish
            time.sleep(0.05)

    def execute(self, requests):
        return [{"y": r["x"] * 2} for r in requests]

    def finalize(self):
        pass
'''


def _package(root: Path) -> Path:
    root.mkdir()
    (root / "model.py").write_text(MODEL)
    (root / "podium.json").write_text(json.dumps({
        "name": "slow", "version": "1", "backend": "python", "module": "model.py",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [1]}]}))
    return root


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _wait(predicate, what: str, instance, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert instance.process.poll() is None, instance.log()[-3000:]
        assert time.monotonic() < deadline, f"never {what}:\n{instance.log()[-3000:]}"
        time.sleep(0.1)


def test_grpc_port_stays_closed_until_every_model_is_ready(tmp_path: Path) -> None:
    package = _package(tmp_path / "slow")
    instance = start_instance([str(package)], tmp_path / "instance.log")
    try:
        _wait(lambda: "initialize started" in instance.log(), "started loading", instance)
        url = instance.http_url
        assert httpx.get(f"{url}/v2/health/live").status_code == 200
        assert httpx.get(f"{url}/v2/health/ready").status_code == 503
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}
        assert httpx.post(f"{url}/v2/models/slow/infer", json=body).status_code == 503
        assert not _port_open(instance.grpc_port), "gRPC port open while the model loads"

        (package / "go").touch()
        _wait(lambda: httpx.get(f"{url}/v2/health/ready").status_code == 200, "ready",
              instance)
        client = grpcclient.InferenceServerClient(instance.grpc_url)
        assert client.is_server_ready()
        tensor = grpcclient.InferInput("x", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.array([[1.5]], dtype=np.float32))
        assert client.infer("slow", [tensor]).as_numpy("y").tolist() == [[3.0]]

        log = instance.log()
        steps = [line for line in log.splitlines() if "boot step" in line and "took" in line]
        assert "open gRPC port" in steps[-1], steps  # the last boot step
        assert log.index("boot step open gRPC port took") < log.index("ready: 1 model")
    finally:
        assert instance.stop() == 0


def test_a_taken_grpc_port_is_a_boot_error_naming_the_flag(tmp_path: Path) -> None:
    package = _package(tmp_path / "slow")
    (package / "go").touch()
    log = tmp_path / "taken.log"
    with socket.socket() as taken, log.open("wb") as out:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = subprocess.run([*PODIUM, "serve", str(package), "--host", "127.0.0.1",
                               "--http-port", "0", "--grpc-port", str(port)],
                              stdout=out, stderr=subprocess.STDOUT, timeout=120).returncode
    text = log.read_text()
    assert code == 1, text[-2000:]
    assert f"cannot open the gRPC port 127.0.0.1:{port}" in text, text[-2000:]
    assert "--grpc-port" in text


pytestmark = pytest.mark.timeout(300)

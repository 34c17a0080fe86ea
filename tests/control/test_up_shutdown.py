"""SIGTERM ends `podium up` within `--shutdown-timeout` while an API request and a gateway
request are stuck, and its instances are stopped on the way out."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import threading
import time
from pathlib import Path

import httpx

from tests.support.control_cli import podium
from tests.support.up_process import Up, alive, wait

TIMEOUT_S = 6
SLACK_S = 4.0

STUCK_MODEL = '''
import time


class Model:
    def execute(self, requests):
        if float(requests[0]["x"].ravel()[0]) == 42:
            print("execute stuck", flush=True)
            time.sleep(3600)
        return [{"y": r["x"]} for r in requests]
'''


def _stuck_package(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "model.py").write_text(STUCK_MODEL)
    (root / "podium.json").write_text(json.dumps({
        "name": "stuck", "version": "1", "backend": "python", "module": "model.py",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [1]}]}))
    return root


def _instance_logs(home: Path) -> str:
    return "".join(p.read_text(errors="replace")
                   for p in (home / "instances" / "logs").glob("*.log"))


def test_sigterm_ends_up_in_time_with_stuck_requests(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    up = Up(home, args=("--shutdown-timeout", str(TIMEOUT_S)))
    up.start()
    assert up.process is not None
    stuck_api: socket.socket | None = None
    try:
        package = _stuck_package(tmp_path / "pkgs" / "stuck-1")
        assert podium("announce", str(package), "--api", up.api) == 0
        assert podium("deploy", "stuck@1", "--stages", "100", "--analysis-window", "0",
                      "--warm-delay", "0", "--api", up.api) == 0
        wait(lambda: up.rollout(1)["status"] == "succeeded", what="stuck@1 deployed")
        [instance] = up.status()["models"]["stuck"]["versions"]["1"]["instances"]
        # a gateway request the model never answers ...
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [42.0]}]}
        threading.Thread(target=lambda: _post(up.gateway + "/v2/models/stuck/infer", body),
                         daemon=True).start()
        wait(lambda: "execute stuck" in _instance_logs(home), what="the stuck request")
        # ... and an API request whose body never comes
        stuck_api = socket.create_connection(("127.0.0.1", up.api_port))
        stuck_api.sendall(b"POST /v1/packages HTTP/1.1\r\nHost: x\r\nContent-Type: "
                          b"application/json\r\nContent-Length: 1000\r\n\r\n{\"path\": ")
        time.sleep(0.5)
        sent = time.monotonic()
        up.process.send_signal(signal.SIGTERM)
        code = up.process.wait(TIMEOUT_S + SLACK_S + 20)
        took = time.monotonic() - sent
    finally:
        if stuck_api is not None:
            stuck_api.close()
        if up.process.poll() is None:
            up.process.kill()
            up.process.wait()
    assert took <= TIMEOUT_S + SLACK_S, took
    assert code == 0, (home / "up.log").read_text()[-3000:]
    wait(lambda: not alive(instance["pid"]), what="the instance stopped", timeout_s=5)


def _post(url: str, body: dict) -> None:
    with contextlib.suppress(httpx.HTTPError):  # cut off by the shutdown: what we want
        httpx.post(url, json=body, timeout=60)

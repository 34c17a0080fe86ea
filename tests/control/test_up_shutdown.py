"""SIGTERM of `podium up`: the gateway drains (a request in flight is answered), and everything
ends within `--shutdown-timeout` while an API request and gateway requests are stuck; its
gateway and instances are stopped on the way out."""

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

TIMEOUT_S = 10
SLOW_S = 3.5
"""A request this long, begun just before SIGTERM, still fits the gateway's drain (half the
timeout, less its reserve); the API's quarter, all the old in-process gateway had, does not."""
SLACK_S = 4.0

STUCK_MODEL = '''
import time


class Model:
    def execute(self, requests):
        x = float(requests[0]["x"].ravel()[0])
        if x == 42:
            print("execute stuck", flush=True)
            time.sleep(3600)
        if x == 7:
            print("execute slow", flush=True)
            time.sleep(SLOW_S)
        return [{"y": r["x"]} for r in requests]
'''


def _stuck_package(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "model.py").write_text(STUCK_MODEL.replace("SLOW_S", str(SLOW_S)))
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
    stuck_gateway: socket.socket | None = None
    try:
        package = _stuck_package(tmp_path / "pkgs" / "stuck-1")
        assert podium("announce", str(package), "--api", up.api) == 0
        assert podium("deploy", "stuck@1", "--stages", "100", "--analysis-window", "0",
                      "--warm-delay", "0", "--api", up.api) == 0
        wait(lambda: up.rollout(1)["status"] == "succeeded", what="stuck@1 deployed")
        [instance] = up.status()["models"]["stuck"]["versions"]["1"]["instances"]
        [gateway_pid] = up.gateway_pids()
        infer = up.gateway + "/v2/models/stuck/infer"
        wait(lambda: _post(infer, 1.0) == 200, what="the gateway's route to stuck@1")
        # a request the gateway is still relaying when SIGTERM comes ...
        slow: list[int | None] = []
        threading.Thread(target=lambda: slow.append(_post(infer, 7.0)), daemon=True).start()
        wait(lambda: "execute slow" in _instance_logs(home), what="the slow request")
        # ... one the model never answers (it runs once the slow one is done) ...
        threading.Thread(target=lambda: _post(infer, 42.0), daemon=True).start()
        # ... a gateway request whose body never comes ...
        stuck_gateway = socket.create_connection(("127.0.0.1", up.http_port))
        stuck_gateway.sendall(b"POST /v2/models/stuck/infer HTTP/1.1\r\nHost: x\r\n"
                              b"Content-Length: 1000\r\n\r\n{")
        # ... and an API request whose body never comes
        stuck_api = socket.create_connection(("127.0.0.1", up.api_port))
        stuck_api.sendall(b"POST /v1/packages HTTP/1.1\r\nHost: x\r\nContent-Type: "
                          b"application/json\r\nContent-Length: 1000\r\n\r\n{\"path\": ")
        time.sleep(0.2)
        sent = time.monotonic()
        up.process.send_signal(signal.SIGTERM)
        code = up.process.wait(TIMEOUT_S + SLACK_S + 20)
        took = time.monotonic() - sent
    finally:
        for stuck in (stuck_api, stuck_gateway):
            if stuck is not None:
                stuck.close()
        if up.process.poll() is None:
            up.process.kill()
            up.process.wait()
    assert took <= TIMEOUT_S + SLACK_S, took
    assert code == 0, (home / "up.log").read_text()[-3000:]
    wait(lambda: bool(slow), what="the slow request's answer", timeout_s=5)
    assert slow == [200]  # drained: answered, not cut off
    wait(lambda: not alive(instance["pid"]) and not alive(gateway_pid),
         what="the instance and the gateway stopped", timeout_s=5)


def _post(url: str, x: float) -> int | None:
    """The status of a KServe infer of `x`; None when the shutdown cut it off."""
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [x]}]}
    with contextlib.suppress(httpx.HTTPError):
        return httpx.post(url, json=body, timeout=60).status_code
    return None

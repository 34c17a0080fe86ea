"""`podium up` as a real process: the CLI drives it, and `kill -9` mid-rollout under 16-client
load fails no request (the gateway process and the instances outlive it), then a restart ends in
a consistent state (rollout resumed, instances and gateway adopted, none orphaned)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.support.control_cli import podium
from tests.support.echo_platform import Load, write_echo
from tests.support.up_process import Up, alive, wait

BODY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}


def test_kill_9_mid_rollout_under_load_fails_no_request_and_the_rollout_resumes(
        up: Up, tmp_path: Path) -> None:
    up.start()
    for version in ("1", "2"):
        assert podium("announce", str(write_echo(tmp_path / "pkgs", version)),
                      "--api", up.api) == 0
    assert podium("deploy", "echo@1", "--stages", "100", "--analysis-window", "0",
                  "--warm-delay", "0", "--api", up.api) == 0
    wait(lambda: up.rollout(1)["status"] == "succeeded", what="v1 deployed",
         detail=up.diagnosis)
    wait(lambda: len(up.pids("1")) == 1, what="v1 ready", detail=up.diagnosis)
    up.wait_serving("1")
    [v1_pid] = up.pids("1")
    [gateway_pid] = up.gateway_pids()
    load = Load(up.gateway)  # 16 clients back to back, through the whole story
    load.start()
    load.wait_requests(200)
    assert podium("deploy", "echo@2", "--stages", "50,100", "--analysis-window", "4",
                  "--warm-delay", "1", "--api", up.api) == 0
    wait(lambda: up.rollout(2)["phase"] == "analyze", what="the 50% stage",
         detail=up.diagnosis)
    [v2_pid] = up.pids("2")

    assert up.process is not None
    up.process.send_signal(signal.SIGKILL)
    up.process.wait(timeout=10)
    killed_at = time.monotonic()
    # the data plane outlives the control plane: gateway and instances run, traffic flows
    assert alive(v1_pid) and alive(v2_pid) and alive(gateway_pid)
    load.wait_requests(len(load.results) + 200)

    up.start()  # same PODIUM_HOME: same SQLite store
    wait(lambda: up.rollout(2)["status"] == "succeeded", what="the resumed rollout",
         detail=up.diagnosis)
    wait(lambda: up.pids("1") == [] and not alive(v1_pid), what="v1 drained and stopped",
         detail=up.diagnosis)
    load.wait_requests(len(load.results) + 200)
    results = load.stop()

    assert [r for r in results if r.status != 200] == []
    assert len([r for r in results if r.started > killed_at]) >= 200
    assert {r.version for r in results} == {"1", "2"}
    assert {r.version for r in results[-50:]} == {"2"}
    assert up.pids("2") == [v2_pid]  # adopted, not started twice
    assert up.gateway_pids() == [gateway_pid]  # the same gateway, adopted
    r = httpx.post(up.gateway + "/v2/models/echo/infer", json=BODY, timeout=10)
    assert (r.status_code, r.json()["model_version"]) == (200, "2")
    grpc_client = grpcclient.InferenceServerClient(f"127.0.0.1:{up.grpc_port}")
    x = grpcclient.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.array([[1.0]], dtype=np.float32))
    assert grpc_client.infer("echo", [x]).get_response().model_version == "2"

    # a clean stop drains and stops every instance and gateway it runs
    up.process.terminate()
    assert up.process.wait(timeout=60) == 0
    wait(lambda: not alive(v2_pid) and not alive(gateway_pid),
         what="v2 and the gateway stopped with podium up", timeout_s=30)


KEY = "control-key-0123456789"


def test_api_key_guards_the_api_the_cli_and_two_gateways(tmp_path: Path) -> None:
    up = Up(tmp_path, api_key=KEY, args=("--gateways", "2"))
    up.start()  # /health answers without a key: liveness probes carry none
    try:
        package = str(write_echo(tmp_path / "pkgs", "1"))
        # the API: refused without the key, nothing changed, then accepted with it
        r = httpx.get(up.api + "/v1/status", timeout=10)
        assert r.status_code == 401 and "Authorization: Bearer" in r.json()["error"]["message"]
        assert podium("announce", package, "--api", up.api) == 2
        assert podium("announce", package, "--api", up.api, "--api-key", "wrong") == 2
        auth = {"Authorization": f"Bearer {KEY}"}
        assert httpx.get(up.api + "/v1/packages", headers=auth, timeout=10).json() == []
        assert podium("announce", package, "--api", up.api, "--api-key", KEY) == 0
        assert podium("deploy", "echo@1", "--stages", "100", "--analysis-window", "0",
                      "--warm-delay", "0", "--api", up.api, "--api-key", KEY) == 0
        wait(lambda: httpx.get(up.api + "/v1/rollouts/1", headers=auth,
                               timeout=10).json()["status"] == "succeeded", what="echo@1")
        wait(lambda: httpx.post(up.gateway + "/v2/models/echo/infer", json=BODY, headers=auth,
                                timeout=10).status_code == 200, what="the gateway's table")
        # the gateway over HTTP: same key, same answer shape as an instance
        r = httpx.post(up.gateway + "/v2/models/echo/infer", json=BODY, timeout=10)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        r = httpx.post(up.gateway + "/v2/models/echo/infer", json=BODY, headers=auth,
                       timeout=10)
        assert (r.status_code, r.json()["model_version"]) == (200, "1")
        # and over gRPC
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{up.grpc_port}")
        x = grpcclient.InferInput("x", [1, 1], "FP32")
        x.set_data_from_numpy(np.array([[1.0]], dtype=np.float32))
        with pytest.raises(grpcclient.InferenceServerException, match="API key missing"):
            client.infer("echo", [x])
        assert client.infer("echo", [x], headers={"authorization": f"Bearer {KEY}"}
                            ).get_response().model_version == "1"
        _two_gateways_share_the_port(up, auth)
    finally:
        assert up.process is not None
        up.process.terminate()
        up.process.wait(timeout=60)


def _two_gateways_share_the_port(up: Up, auth: dict[str, str]) -> None:
    """Both gateways take connections on the one port and route by the same table; one
    killed is restarted by `podium up`."""
    def gateways() -> list[dict]:
        return httpx.get(up.api + "/v1/gateways", headers=auth, timeout=10).json()

    def outcomes() -> dict[str, int]:
        return {g["id"]: g["num_outcomes"] for g in gateways()}

    def ask(num: int) -> None:
        for _ in range(num):  # a new connection each: the kernel spreads them
            r = httpx.post(up.gateway + "/v2/models/echo/infer", json=BODY, headers=auth,
                           timeout=10)
            assert (r.status_code, r.json()["model_version"]) == (200, "1")

    wait(lambda: [(g["id"], g["in_sync"]) for g in gateways()] == [
        ("gateway-0", True), ("gateway-1", True)], what="two gateways with the table")
    before = outcomes()
    ask(30)
    wait(lambda: all(outcomes()[g] > before[g] for g in before), what="both gateways used")
    killed = up.gateway_pids()[0]
    os.kill(killed, signal.SIGKILL)
    wait(lambda: len(up.gateway_pids()) == 2 and killed not in up.gateway_pids(),
         what="the killed gateway restarted")
    wait(lambda: all(g["in_sync"] and g["pid"] != killed for g in gateways()),
         what="the restarted gateway synced")
    ask(10)

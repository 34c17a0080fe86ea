"""`podium gateway` on its own: it serves before any control plane answers (live, not ready,
a clear 404) and SIGTERM ends it at once when idle; a port already taken is refused naming it,
one shared with a sibling gateway is not."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import httpx
import pytest

from podium.errors import InvalidArgument
from podium.gateway.process import bind
from tests.support.ports import free_port
from tests.support.up_process import wait

BODY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}


def _gateway(*args: str) -> list[str]:
    return [sys.executable, "-m", "podium.cli", "gateway", "--host", "127.0.0.1",
            "--grpc-port", "-1", *args]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PODIUM_API_KEY"}


def test_a_gateway_without_its_control_plane_serves_and_stops_at_once() -> None:
    port = free_port()
    process = subprocess.Popen(
        _gateway("--http-port", str(port), "--control", f"http://127.0.0.1:{free_port()}",
                 "--shutdown-timeout", "300"),
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait(lambda: _status(url + "/health/live") == 200, what="the gateway", timeout_s=60)
        assert _status(url + "/health/ready") == 503  # no route table yet
        r = httpx.post(url + "/v2/models/echo/infer", json=BODY, timeout=10)
        assert r.status_code == 404 and "'echo' is not deployed" in r.text
        process.send_signal(signal.SIGTERM)
        # nothing in flight: it exits without waiting for its 300 s deadline (this wait's
        # bound is far below it, so a gateway that sat out the deadline fails here)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.stdout is not None
    output = process.stdout.read()
    assert b"waiting for the control plane" in output
    # the start's heap is out of the collector's reach: no full pass over it stalls requests
    assert b"heap frozen: " in output, output


def test_a_taken_port_names_itself_and_the_flag_and_a_shared_one_binds() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(InvalidArgument, match=f"cannot listen on 127.0.0.1:{port}: .*"
                                                  "--http-port"):
            bind("127.0.0.1", port, reuse_port=True)  # the holder did not share it
    first = bind("127.0.0.1", 0, reuse_port=True)
    second = bind("127.0.0.1", first.getsockname()[1], reuse_port=True)  # a sibling gateway
    first.close()
    second.close()


def _status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return None

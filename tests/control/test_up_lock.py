"""A second `podium up` on a running one's home and ports is refused and changes nothing."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest

from tests.support.control_cli import podium
from tests.support.echo_platform import write_echo
from tests.support.up_process import Up, alive, wait

BODY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}


def test_a_second_up_on_the_same_home_and_ports_is_refused_and_changes_nothing(
        up: Up, tmp_path: Path) -> None:
    up.start()
    assert podium("announce", str(write_echo(tmp_path / "pkgs", "1")), "--api", up.api) == 0
    assert podium("deploy", "echo@1", "--stages", "100", "--analysis-window", "0",
                  "--warm-delay", "0", "--api", up.api) == 0
    wait(lambda: up.rollout(1)["status"] == "succeeded", what="echo@1 deployed")
    # min = max = 2 on a running deployment starts the second instance
    assert podium("scale", "echo@1", "--min", "2", "--max", "2", "--api", up.api) == 0
    wait(lambda: len(up.pids("1")) == 2, what="the second instance")
    pids = sorted(up.pids("1"))
    events = up.get("/v1/events?limit=1000")

    second = subprocess.run(up.command(), env=up.env(), capture_output=True, text=True,
                            timeout=60)
    assert up.process is not None
    assert second.returncode == 2, second.stderr
    [line] = second.stderr.strip().splitlines()  # one line, no traceback
    assert line.startswith(f"podium: error: another podium up (pid {up.process.pid} on ")
    assert (f"gateway :{up.http_port}, gRPC :{up.grpc_port}, API :{up.api_port}) already "
            "runs the control plane of this home") in line

    # the first one's deployment is untouched: same instances, serving, nothing written
    assert up.process.poll() is None
    assert sorted(up.pids("1")) == pids and all(alive(p) for p in pids)
    for _ in range(4):
        r = httpx.post(up.gateway + "/v2/models/echo/infer", json=BODY, timeout=10)
        assert (r.status_code, r.json()["model_version"]) == (200, "1")
    assert up.get("/v1/events?limit=1000") == events


@pytest.mark.postgres
def test_a_second_up_on_another_home_but_the_same_postgres_database_is_refused(
        tmp_path: Path, fresh_postgres: str) -> None:
    homes = [tmp_path / "a", tmp_path / "b"]
    for home in homes:
        home.mkdir()
    first, second = (Up(home, args=("--database", fresh_postgres)) for home in homes)
    first.start()
    try:
        refused = subprocess.run(second.command(), env=second.env(), capture_output=True,
                                 text=True, timeout=60)
        assert refused.returncode == 2, refused.stderr
        [line] = refused.stderr.strip().splitlines()
        assert first.process is not None
        assert f"another podium up (pid {first.process.pid} on " in line
        assert "already runs the control plane of database" in line
        assert first.process.poll() is None and first.get("/v1/status")["models"] == {}
    finally:
        assert first.process is not None
        first.process.terminate()
        assert first.process.wait(timeout=60) == 0

"""PostgreSQL stopped mid-rollout under `podium up`: traffic flows on the last split, the loop
pauses with one logged reason, and the rollout finishes once the database is back.

The test runs its own PostgreSQL server (scripts/postgres.sh with its own directory and port),
so stopping it cannot disturb the shared one the store tests use.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.control_cli import podium
from tests.support.echo_platform import Load, write_echo
from tests.support.ports import free_port
from tests.support.up_process import Up, wait

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "postgres.sh"
PAUSED = "control loop paused"
RESUMED = "control loop resumed"


class Postgres:
    """A PostgreSQL server of this test's own, stopped and started on demand."""

    def __init__(self) -> None:
        self.env = {**os.environ, "PODIUM_PG_DIR": "/tmp/podium-postgres-faults",
                    "PODIUM_PG_PORT": str(free_port()),
                    "PODIUM_PG_DB": f"faults_{uuid.uuid4().hex[:8]}"}
        self.url = self._script().strip().splitlines()[-1].split("=", 1)[1]

    def stop(self) -> None:
        self._script("stop")

    def start(self) -> None:
        self._script()

    def _script(self, *args: str) -> str:
        result = subprocess.run(["bash", str(SCRIPT), *args], env=self.env, capture_output=True,
                                text=True, timeout=300, check=False)
        assert result.returncode == 0, result.stderr[-2000:]
        return result.stdout


@pytest.fixture
def postgres() -> Iterator[Postgres]:
    server = Postgres()
    yield server
    server.stop()


def _status(up: Up) -> int:
    try:
        return httpx.get(up.api + "/v1/rollouts/2", timeout=10).status_code
    except httpx.HTTPError:
        return 0


@pytest.mark.postgres
def test_postgres_stopped_mid_rollout_pauses_the_loop_and_drops_no_request(
        postgres: Postgres, tmp_path: Path) -> None:
    up = Up(tmp_path, args=("--database", postgres.url))
    up.start()
    try:
        for version in ("1", "2"):
            assert podium("announce", str(write_echo(tmp_path / "pkgs", version)),
                          "--api", up.api) == 0
        assert podium("deploy", "echo@1", "--stages", "100", "--analysis-window", "0",
                      "--warm-delay", "0", "--api", up.api) == 0
        wait(lambda: up.rollout(1)["status"] == "succeeded", what="v1 deployed")
        load = Load(up.gateway, num_clients=4)
        load.start()
        load.wait_requests(100)
        assert podium("deploy", "echo@2", "--stages", "50,100", "--analysis-window", "2",
                      "--warm-delay", "1", "--api", up.api) == 0
        wait(lambda: up.rollout(2)["phase"] == "analyze", what="the 50% stage")
        stage = up.rollout(2)["weight_new"]

        postgres.stop()
        stopped_at = time.monotonic()
        log = tmp_path / "up.log"
        wait(lambda: PAUSED in log.read_text(), what="the pause logged", timeout_s=15)
        assert _status(up) == 503  # the API says the database is away, and keeps serving
        time.sleep(3)  # an analysis window and more with nothing written
        during = [r for r in load.results if r.started > stopped_at]
        postgres.start()
        wait(lambda: up.rollout(2)["status"] != "running", what="the resumed rollout",
             timeout_s=60)
        final = up.rollout(2)
        load.wait_requests(len(load.results) + 100)
        results = load.stop()
    finally:
        assert up.process is not None
        up.process.terminate()
        up.process.wait(timeout=60)

    assert final["status"] == "succeeded", final["reason"]
    assert any("paused" in s["note"] for s in final["steps"])
    text = log.read_text()
    assert text.count(PAUSED) == 1, text[-3000:]  # one line per outage, not one per pass
    assert text.count(RESUMED) == 1
    assert "database is unreachable" in text
    assert "Traceback" not in text, text[-3000:]
    failures = [r for r in results if r.status != 200]
    assert failures == [], Counter((r.status, r.error) for r in failures)
    # the outage kept the last split: both versions served while nothing could be written
    assert stage == 50 and {r.version for r in during} == {"1", "2"}, Counter(
        r.version for r in during)
    assert {r.version for r in results[-50:]} == {"2"}

"""`podium up` as a real process on free ports, and waiting on what it does."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.support.ports import free_port


class Up:
    """One `podium up` process on free ports with its own PODIUM_HOME."""

    def __init__(self, home: Path, *, api_key: str | None = None,
                 args: tuple[str, ...] = ()) -> None:
        self.home = home
        self.api_key = api_key
        self.args = args
        self.http_port, self.api_port, self.grpc_port = free_port(), free_port(), free_port()
        self.api = f"http://127.0.0.1:{self.api_port}"
        self.gateway = f"http://127.0.0.1:{self.http_port}"
        self.process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        """The command line `start` runs (a second `podium up` may run it again)."""
        return [sys.executable, "-m", "podium.cli", "up", "--host", "127.0.0.1",
                "--http-port", str(self.http_port), "--api-port", str(self.api_port),
                "--grpc-port", str(self.grpc_port),
                *(["--api-key", self.api_key] if self.api_key else []), *self.args]

    def env(self) -> dict[str, str]:
        return {**os.environ, "PODIUM_HOME": str(self.home)}

    def start(self) -> None:
        log = (self.home / "up.log").open("ab")
        self.process = subprocess.Popen(self.command(), env=self.env(), stdout=log,
                                        stderr=subprocess.STDOUT)
        wait(lambda: _ok(self.api + "/health"), what="the control-plane API")

    def get(self, path: str) -> object:
        return httpx.get(self.api + path, timeout=10).json()

    def status(self) -> dict:
        return self.get("/v1/status")  # type: ignore[return-value]

    def rollout(self, rollout_id: int) -> dict:
        return self.get(f"/v1/rollouts/{rollout_id}")  # type: ignore[return-value]

    def gateway_pids(self) -> list[int]:
        """Pids of the gateway processes this home's `podium up` recorded."""
        pids = []
        for record in sorted((self.home / "gateways").glob("gateway-*.json")):
            with contextlib.suppress(OSError, ValueError):
                pids.append(json.loads(record.read_text())["pid"])
        return pids

    def wait_serving(self, version: str, model: str = "echo") -> None:
        """Until the gateway answers a KServe request of `model` from `version` (its table
        reaches it a moment after the control plane changes)."""
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}
        last = ["no answer yet"]

        def serving() -> bool:
            try:
                r = httpx.post(f"{self.gateway}/v2/models/{model}/infer", json=body, timeout=10)
            except httpx.HTTPError as exc:
                last[0] = f"{type(exc).__name__}: {exc}"
                return False
            last[0] = f"{r.status_code} {r.text[:300]}"
            return r.status_code == 200 and r.json()["model_version"] == version

        wait(serving, what=f"the gateway serving {model}@{version}",
             detail=lambda: f"the gateway's last answer: {last[0]}\n{self.diagnosis()}")

    def diagnosis(self) -> str:
        """What the plane and its gateways say and logged last (for a failed wait)."""
        parts = []
        try:
            gateways = httpx.get(self.api + "/v1/gateways", timeout=5).text
            parts.append(f"GET /v1/gateways: {gateways}")
        except httpx.HTTPError as exc:
            parts.append(f"GET /v1/gateways: {exc!r}")
        for log in [self.home / "up.log", *sorted((self.home / "gateways").glob("*.log"))]:
            with contextlib.suppress(OSError):
                tail = log.read_text(errors="replace").splitlines()[-25:]
                parts.append(f"--- {log.name} (last {len(tail)} lines)\n" + "\n".join(tail))
        return "\n".join(parts)

    def kill_gateways(self) -> None:
        """SIGKILL the recorded gateways (after a test that left them without a plane)."""
        for pid in self.gateway_pids():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)

    def pids(self, version: str) -> list[int]:
        versions = self.status()["models"].get("echo", {}).get("versions", {})
        return [i["pid"] for i in versions.get(version, {}).get("instances", [])
                if i["state"] == "ready"]


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def wait(condition: Callable[[], bool], *, what: str, timeout_s: float = 90,
         interval_s: float = 0.1, detail: Callable[[], str] | None = None) -> None:
    """Poll `condition` every `interval_s`; fail naming `what` (and what `detail` says) after
    `timeout_s`. A wait for an engine to boot polls every second: each poll costs the control
    plane CPU time that the booting engine shares."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what}"
                                 + (f"\n{detail()}" if detail else ""))
        time.sleep(interval_s)


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not count)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"

"""`podium up` assembled in-process for end-to-end tests: real `podium serve` instances, a real
gateway on loopback, the real control loop, with test-sized timings."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from podium.control.loop import ControlLoop, LoopConfig
from podium.control.plane import ControlPlane
from podium.control.rollout_config import RolloutConfig
from podium.control.runtime.local import LocalRuntime
from podium.control.store import Store
from podium.control.world import RuntimeWorld
from podium.gateway.process import KEEP_ALIVE_S
from podium.gateway.proxy import Gateway
from tests.support.servers import Served

ECHO_MODEL = '''
import numpy as np


class Model:
    def initialize(self, config):
        self.scale = float(config["parameters"]["scale"])
        self.fail = bool(config["parameters"].get("fail", False))
        if config["parameters"].get("boot_fail"):
            raise RuntimeError("this version cannot load")

    def execute(self, requests):
        if self.fail:
            raise RuntimeError("this version is broken")
        return [{"y": (r["x"] * self.scale).astype(np.float32)} for r in requests]

    def finalize(self):
        pass
'''


def write_echo(root: Path, version: str, **parameters: object) -> Path:
    """A Python-backend package `echo` whose output is x * scale (or an error)."""
    folder = root / f"echo-{version}"
    folder.mkdir(parents=True)
    (folder / "model.py").write_text(ECHO_MODEL)
    (folder / "podium.json").write_text(json.dumps({
        "name": "echo", "version": version, "backend": "python", "module": "model.py",
        "class_name": "Model", "max_batch_size": 64,
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [1]}],
        "parameters": {"scale": 1, **parameters}}))
    return folder


def echo_deployed(tmp_path: Path) -> Store:
    """A SQLite store under `tmp_path` with echo@1 (scale 3) announced and deployed red-black:
    a runtime given it starts echo instances."""
    store = Store.open(f"sqlite:///{tmp_path / 'control.db'}")
    folder = write_echo(tmp_path / "packages", "1", scale=3)
    store.announce_package("echo", "1", "python", str(folder),
                           json.loads((folder / "podium.json").read_text()))
    store.ensure_deployment("echo", "1", "red-black")
    return store


class Platform:
    """Store + gateway + local runtime + control loop, as `podium up` wires them."""

    def __init__(self, root: Path) -> None:
        self.store = Store.open(f"sqlite:///{root / 'control.db'}")
        self.gateway = Gateway()
        self.runtime = LocalRuntime(self.store, self.gateway.table, root / "instances",
                                    drain_timeout_s=10)
        world = RuntimeWorld(self.runtime, self.gateway.table, self.gateway.stats)
        self.plane = ControlPlane(self.store, world, materialize=lambda _p: None)
        self.loop = ControlLoop(self.plane, self.runtime, self.gateway.table,
                                self.gateway.stats, LoopConfig(interval_s=0.2))
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        # with the keep-alive of `podium gateway`: uvicorn's 5 s default closed a pooled
        # connection as a client (stalled on a loaded machine) sent on it, a ReadError that
        # the real gateway would not give
        self.served = Served(self.gateway.app(), timeout_keep_alive=KEEP_ALIVE_S)
        self.url = self.served.url

    def deploy(self, version: str, config: RolloutConfig) -> int:
        return self.plane.deploy("echo", version, config)

    def wait_done(self, rollout_id: int, timeout_s: float = 120) -> str:
        deadline = time.monotonic() + timeout_s
        while (status := self.store.get_rollout(rollout_id).status) == "running":
            assert time.monotonic() < deadline, self.plane.rollout(rollout_id)
            time.sleep(0.1)
        return status

    def wait_for(self, condition: Callable[[], bool], timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            assert time.monotonic() < deadline, "condition not reached"
            time.sleep(0.02)

    def close(self) -> None:
        self.loop.stop()
        self.thread.join(timeout=10)
        with self.plane.lock:
            self.runtime.close()
        self.served.stop()
        self.store.close()


@dataclass
class Result:
    started: float
    at: float
    status: int
    version: str | None
    error: str = ""


@dataclass
class Load:
    """`num_clients` clients calling the gateway back to back until stopped."""

    url: str
    path: str = "/v2/models/echo/infer"
    num_clients: int = 16
    results: list[Result] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()

    def stop(self) -> list[Result]:
        self._stop.set()
        self._thread.join(timeout=30)
        return self.results

    def wait_requests(self, count: int, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.results) < count:
            assert time.monotonic() < deadline, f"only {len(self.results)} requests"
            time.sleep(0.05)

    async def _run(self) -> None:
        limits = httpx.Limits(max_connections=self.num_clients)
        async with httpx.AsyncClient(base_url=self.url, timeout=30, limits=limits) as client:
            await asyncio.gather(*(self._client(client) for _ in range(self.num_clients)))

    async def _client(self, client: httpx.AsyncClient) -> None:
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                r = await client.post(self.path, json=body)
                version = r.json().get("model_version") if r.status_code == 200 else None
                self.results.append(Result(started, time.monotonic(), r.status_code, version,
                                           "" if r.status_code == 200 else r.text[:200]))
            except httpx.HTTPError as exc:
                self.results.append(Result(started, time.monotonic(), 0, None, repr(exc)))

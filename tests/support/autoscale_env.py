"""The autoscaler in a control loop over fake engines: a real supervisor scraping in-process
HTTP servers that answer `/health/ready` and vLLM's gauges on `/metrics`, a fake clock
(used by tests/control/test_autoscale_loop.py and test_scale_to_zero.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from podium.control.actions import Scale
from podium.control.loop import ControlLoop, LoopConfig
from podium.control.models import PackageRow
from podium.control.plane import ControlPlane
from podium.control.runtime.base import READY
from podium.control.runtime.supervisor import Instance, Supervisor
from podium.control.store import Store
from podium.control.world import RuntimeWorld
from podium.routes.stats import VersionStats
from podium.routes.table import RouteTable

KEY = "plane-key"
LLM = {"name": "smol", "version": "1", "backend": "vllm",
       "weights": {"source": "path", "path": "/models/smol"}}


class FakeEngine:
    """One instance's HTTP side: ready, and vLLM's gauges on /metrics behind the credential."""

    def __init__(self) -> None:
        self.waiting = 0.0
        self.kv = 0.0
        self.status = 200
        self.num_scrapes = 0
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.headers.get("Authorization") != f"Bearer {KEY}":
                    self._answer(401, b"")
                elif self.path == "/health/ready":
                    self._answer(200, b"ready")
                elif self.path == "/metrics":
                    engine.num_scrapes += 1
                    self._answer(engine.status, (
                        f'vllm:num_requests_waiting{{engine="0",model_name="smol"}} '
                        f'{engine.waiting}\nvllm:kv_cache_usage_perc{{engine="0",'
                        f'model_name="smol"}} {engine.kv}\n').encode())
                else:
                    self._answer(404, b"")

            def _answer(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class _Attached(Instance):
    engine: FakeEngine | None = None
    exited: bool = False


class AttachedRuntime(Supervisor[_Attached]):
    """The real supervisor; an instance's "process" is a FakeEngine server."""

    def __init__(self, store: Store, table: RouteTable, clock: Callable[[], float]) -> None:
        super().__init__(store, table, credential=KEY, probe_timeout_s=0.5,
                         signal_interval_s=0.01, drain_timeout_s=0, clock=clock)
        self.engines: list[FakeEngine] = []

    def _create(self, model: str, version: str, db_id: int) -> _Attached:
        return _Attached(f"{model}-{version}-{db_id}", model, version, db_id)

    def _launch(self, instance: _Attached, package: PackageRow) -> dict[str, Any]:
        instance.engine = FakeEngine()
        self.engines.append(instance.engine)
        instance.url = instance.engine.url
        return {}

    def _exit_code(self, instance: _Attached) -> int | None:
        return 0 if instance.exited else None

    def _terminate(self, instance: _Attached, *, force: bool) -> None:
        instance.exited = True

    def _release(self, instance: _Attached) -> None:
        if instance.engine is not None:
            instance.engine.close()

    def serving(self) -> list[FakeEngine]:
        return [i.engine for i in self._instances.values()
                if i.state == READY and i.engine is not None]


class Env:
    def __init__(self, tmp_path: Path) -> None:
        self.offset_ms = 0
        self.monotonic_s = 0.0
        """The supervisor's clock (its engine-signal scrapes are timed on it)."""
        self.store = Store.open(f"sqlite:///{tmp_path / 'c.db'}")
        self.table, self.stats = RouteTable(), VersionStats()
        self.runtime = AttachedRuntime(self.store, self.table, lambda: self.monotonic_s)
        self.plane = ControlPlane(self.store, RuntimeWorld(self.runtime, self.table, self.stats),
                                  clock=self.now, materialize=lambda _p: None)
        self.loop = ControlLoop(self.plane, self.runtime, self.table, self.stats,
                                LoopConfig(scale_down_cooldown_ms=60_000))

    def now(self) -> int:
        return int(time.time() * 1000) + self.offset_ms

    def deploy(self, manifest: dict[str, Any], low: int, high: int, count: int = 1) -> None:
        self.store.announce_package(manifest["name"], "1", manifest["backend"], "/p/1", manifest)
        self.store.apply([Scale(manifest["name"], "1", count)])
        self.store.set_scaling(manifest["name"], "1", low, high)

    def step(self, advance_ms: int = 0) -> int:
        """Move the fake clock on, run one pass; the deployment's wanted size after it."""
        self.offset_ms += advance_ms
        self.monotonic_s += 0.02  # past the scrape interval: every pass reads afresh
        self.loop.step()
        return self.store.list_deployments()[0].num_desired

    def ready(self, count: int) -> list[FakeEngine]:
        """Passes until `count` instances serve (each fake answers ready at once)."""
        for _ in range(50):
            engines = self.runtime.serving()
            if len(engines) == count and len(self.runtime.instances()) == count:
                return engines
            self.step()
        raise AssertionError(f"{count} instances never served: {self.runtime.instances()}")

    def events(self) -> list[str]:
        return [e.message for e in self.store.list_events() if e.kind == "scale"]


@contextmanager
def open_env(tmp_path: Path) -> Iterator[Env]:
    """An `Env` in `tmp_path`, closed (runtime, then store) on the way out."""
    e = Env(tmp_path)
    try:
        yield e
    finally:
        e.runtime.close(timeout_s=2)
        e.store.close()

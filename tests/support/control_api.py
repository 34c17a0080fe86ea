"""A control plane over a fake world, driven through its REST API (the `env` fixture)."""

from __future__ import annotations

import json
from pathlib import Path

from fastapi.testclient import TestClient

from podium.control.api import create_app
from podium.control.plane import ControlPlane
from podium.control.store import Store
from tests.support.fake_world import FakeWorld

FAST = {"ready_timeout_ms": 5_000, "analysis_window_ms": 1_000, "warm_delay_ms": 1_000,
        "min_requests": 5}


def package_dir(root: Path, name: str, version: str, **extra: object) -> str:
    """A python-backend package folder `name-version` under `root`."""
    folder = root / f"{name}-{version}"
    folder.mkdir()
    (folder / "podium.json").write_text(json.dumps(
        {"name": name, "version": version, "backend": "python", **extra}))
    return str(folder)


class Env:
    """A control plane on a SQLite store and a fake world with a fake clock."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.world = FakeWorld()
        self.store = Store.open(f"sqlite:///{tmp_path / 'c.db'}")
        self.plane = ControlPlane(self.store, self.world, clock=lambda: self.world.now_ms,
                                  materialize=lambda _p: None)
        self.client = TestClient(create_app(self.plane))

    def run_until_done(self, limit_ms: int = 60_000) -> None:
        while self.store.list_rollouts(status="running") and self.world.now_ms < limit_ms:
            self.plane.tick()
            self.world.now_ms += 250

    def snapshot(self) -> tuple:
        """Everything a bad request must leave untouched."""
        return ([(p.name, p.version) for p in self.store.list_packages()],
                [(r.id, r.status, r.num_steps) for r in self.store.list_rollouts()],
                [(d.model, d.version, d.num_desired, d.min_instances, d.max_instances)
                 for d in self.store.list_deployments()])


def deployed(env: Env) -> None:
    """iris@1 and iris@2 announced, iris@1 rolled out and serving."""
    for version in ("1", "2"):
        r = env.client.post("/v1/packages", json={"path": package_dir(env.tmp, "iris", version)})
        assert r.status_code == 201, r.text
    r = env.client.post("/v1/rollouts", json={"model": "iris", "version": "1", **FAST})
    assert r.status_code == 201, r.text
    env.run_until_done()

"""`status` reads the store in a fixed number of queries, whatever the number of deployments
(the console polls it: one query per deployment made its first render slow at 150)."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import event

from podium.control.api import create_app
from podium.control.plane import ControlPlane
from podium.control.store import Store
from tests.support.control_api import Env, package_dir
from tests.support.fake_world import FakeWorld

FAST = {"ready_timeout_ms": 5_000, "analysis_window_ms": 0, "warm_delay_ms": 0,
        "stages": [100]}


class _StoreEnv(Env):
    """`Env` over the store under test (SQLite, then PostgreSQL)."""

    def __init__(self, tmp_path: Path, store: Store) -> None:
        self.tmp, self.world, self.store = tmp_path, FakeWorld(), store
        self.plane = ControlPlane(store, self.world, clock=lambda: self.world.now_ms,
                                  materialize=lambda _p: None)
        self.client = TestClient(create_app(self.plane))


def _populate(env: Env, first: int, last: int) -> None:
    for m in range(first, last):
        name = f"model-{m:03d}"
        for version in ("1", "2"):
            r = env.client.post("/v1/packages",
                                json={"path": package_dir(env.tmp, name, version)})
            assert r.status_code == 201, r.text
            strategy = "red-black" if version == "1" else "versioned"
            r = env.client.post("/v1/rollouts", json={"model": name, "version": version,
                                                      "strategy": strategy, **FAST})
            assert r.status_code == 201, r.text
            env.run_until_done(limit_ms=env.world.now_ms + 60_000)


def _statements(env: Env) -> tuple[int, dict]:
    seen: list[str] = []

    def count(_conn, _cursor, statement, *_args) -> None:
        seen.append(statement)
    event.listen(env.store.engine, "before_cursor_execute", count)
    try:
        status = env.plane.status()
    finally:
        event.remove(env.store.engine, "before_cursor_execute", count)
    return len(seen), status


def test_status_queries_do_not_grow_with_the_deployments(tmp_path: Path, store: Store) -> None:
    env = _StoreEnv(tmp_path, store)
    _populate(env, 0, 2)
    instance = env.store.add_instance("model-001", "2", state="ready", pid=7, http_port=9001)
    few, status = _statements(env)
    _populate(env, 2, 12)
    many, bigger = _statements(env)
    assert few == many <= 8, (few, many)
    assert len(bigger["models"]) == 12
    # what the batched read shows is what each model holds
    one = bigger["models"]["model-001"]
    assert one["splits"] == {"1": 100}
    assert one["aliases"] == {"latest": "2"}
    assert sorted(one["versions"]) == ["1", "2"]
    assert [i["id"] for i in one["versions"]["2"]["instances"]] == [instance]
    assert one["versions"]["2"]["instances"][0]["http_port"] == 9001
    assert one["versions"]["1"]["instances"] == []
    assert bigger["models"]["model-011"]["aliases"] == {"latest": "2"}
    assert status["models"]["model-000"] == bigger["models"]["model-000"]

"""The control-plane database going away and coming back, on a database the test switches off.

Fast: a SQLite file behind a connection factory that refuses while "stopped" (what a stopped
PostgreSQL does to every new connection). The real PostgreSQL run is `test_faults_postgres.py`.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from podium.control import rollout
from podium.control.api import create_app
from podium.control.loop import ControlLoop, LoopConfig
from podium.control.plane import ControlPlane
from podium.control.rollout_config import RolloutConfig
from podium.control.runtime.base import READY
from podium.control.runtime.local import LocalRuntime
from podium.control.store import Store, StoreUnavailable
from podium.routes.stats import VersionStats
from podium.routes.table import RouteTable
from tests.support.fake_world import FakeWorld

FAKE_SERVE = Path(__file__).parents[1] / "support" / "fake_serve.py"


class SwitchableDatabase:
    """A migrated SQLite file whose every new connection is refused while `up` is False."""

    def __init__(self, path: Path) -> None:
        self.path, self.up = path, True
        Store.open(f"sqlite:///{path}").close()  # the schema
        self.store = Store(create_engine("sqlite://", creator=self._connect, poolclass=NullPool))

    def _connect(self) -> sqlite3.Connection:
        if not self.up:
            raise sqlite3.OperationalError("connection refused (the test stopped the database)")
        return sqlite3.connect(self.path, check_same_thread=False)


class WatchedRuntime:
    """The runtime side of the loop: counts how often instances were checked."""

    def __init__(self) -> None:
        self.num_polls = 0

    def poll(self) -> None:
        self.num_polls += 1


def test_the_api_answers_503_naming_the_database_then_serves_when_it_is_back(
        tmp_path: Path) -> None:
    db = SwitchableDatabase(tmp_path / "c.db")
    client = TestClient(create_app(ControlPlane(db.store, FakeWorld(),
                                                materialize=lambda _p: None)))
    db.up = False
    answer = client.get("/v1/status")
    assert answer.status_code == 503, answer.text
    assert "control-plane database is unreachable" in answer.text
    assert "connection refused" in answer.text
    with pytest.raises(StoreUnavailable):
        db.store.list_rollouts()
    db.up = True
    assert client.get("/v1/status").status_code == 200


FIRST = RolloutConfig(stages=(100,), ready_timeout_ms=5_000, analysis_window_ms=0,
                      warm_delay_ms=0)
STAGED = RolloutConfig(stages=(50, 100), ready_timeout_ms=5_000, analysis_window_ms=2_000,
                       min_requests=10, warm_delay_ms=1_000)


def _loop(tmp_path: Path) -> tuple[SwitchableDatabase, FakeWorld, WatchedRuntime, ControlLoop]:
    db = SwitchableDatabase(tmp_path / "c.db")
    world = FakeWorld()
    plane = ControlPlane(db.store, world, clock=lambda: world.now_ms,
                         materialize=lambda _p: None)
    runtime = WatchedRuntime()
    loop = ControlLoop(plane, runtime, RouteTable(), VersionStats(),  # type: ignore[arg-type]
                       LoopConfig(interval_s=0.5))
    for version in ("1", "2"):
        db.store.announce_package("iris", version, "python", f"/p/{version}", {})
    return db, world, runtime, loop


def _passes(loop: ControlLoop, world: FakeWorld, until: Callable[[], bool],
            limit_ms: int = 60_000) -> None:
    while not until():
        assert world.now_ms < limit_ms, "the loop never got there"
        loop.run_once()
        world.now_ms += 500


def test_the_loop_pauses_once_keeps_the_split_and_resumes_the_rollout(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    db, world, runtime, loop = _loop(tmp_path)
    store = db.store
    first = loop.plane.deploy("iris", "1", FIRST)
    _passes(loop, world, lambda: store.get_rollout(first).status == rollout.SUCCEEDED)
    rollout_id = loop.plane.deploy("iris", "2", STAGED)
    _passes(loop, world, lambda: store.get_rollout(rollout_id).state.phase == "analyze")
    before = store.get_rollout(rollout_id)
    assert world.split["iris"] == {"1": 50, "2": 50}

    db.up = False
    polls = runtime.num_polls
    with caplog.at_level(logging.DEBUG, logger="podium.control"):
        for _ in range(20):  # 10 s: five analysis windows, twice the ready timeout
            loop.run_once()
            world.now_ms += 500
        paused = [r for r in caplog.records if "control loop paused" in r.getMessage()]
        assert len(paused) == 1, [r.getMessage() for r in caplog.records]
        assert paused[0].levelno == logging.WARNING
        assert "database is unreachable" in paused[0].getMessage()
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert loop.outage is not None
        assert world.split["iris"] == {"1": 50, "2": 50}  # traffic stays on the last split
        assert runtime.num_polls >= polls + 19  # instances are still watched every pass

        db.up = True
        loop.run_once()
    resumed = [r.getMessage() for r in caplog.records if "control loop resumed" in r.getMessage()]
    assert len(resumed) == 1 and loop.outage is None
    after = store.get_rollout(rollout_id)
    assert after.state.phase == "analyze"
    assert after.state.leg.stage_index == before.state.leg.stage_index
    # the window's clock moved on by the pause: the stage is judged on time the plane could act
    assert after.state.leg.phase_since_ms == before.state.leg.phase_since_ms + 10_000
    notes = [s.note for s in store.rollout_steps(rollout_id)]
    assert any("paused 10000 ms (database unreachable" in n for n in notes)
    assert any("control loop paused 10.0 s" in e.message for e in store.list_events())
    _passes(loop, world, lambda: store.get_rollout(rollout_id).status != rollout.RUNNING)
    assert store.get_rollout(rollout_id).status == rollout.SUCCEEDED
    assert world.split["iris"] == {"2": 100}


def test_a_pause_does_not_count_against_the_ready_timeout() -> None:
    state = rollout.begin("iris", "2", "1", FIRST, num_old=1)
    state = rollout.step(state, rollout.Observation(new=rollout.VersionHealth()), 0).state
    assert state.phase == "wait_ready"
    not_ready = rollout.Observation(new=rollout.VersionHealth(num_ready=0))
    assert rollout.step(state, not_ready, 6_000).state.status == rollout.ROLLED_BACK
    resumed = rollout.resume(state, 4_000, "database unreachable")
    assert resumed is not None and resumed.actions == []
    assert rollout.step(resumed.state, not_ready, 6_000) is None  # 2 s of waiting, not 6
    assert rollout.step(resumed.state, not_ready, 9_000).state.status == rollout.ROLLED_BACK


def _fake_serve(package: str, http_port: int, _grpc_port: int) -> list[str]:
    return [sys.executable, str(FAKE_SERVE), package, str(http_port)]


def _poll_until(runtime: LocalRuntime, condition: Callable[[], bool],
                timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        with contextlib.suppress(StoreUnavailable):  # what the loop does while paused
            runtime.poll()
        time.sleep(0.05)


def test_instances_are_routed_and_crashes_counted_once_while_the_database_is_away(
        tmp_path: Path) -> None:
    db = SwitchableDatabase(tmp_path / "c.db")
    table = RouteTable()
    for version, behaviour in (("1", '{"ready_after_s": 1.0}'),
                               ("2", '{"crash_after_s": 1.5}')):
        folder = tmp_path / f"iris-{version}"
        folder.mkdir()
        (folder / "behaviour.json").write_text(behaviour)
        db.store.announce_package("iris", version, "python", str(folder), {})
        db.store.ensure_deployment("iris", version, "red-black")
    runtime = LocalRuntime(db.store, table, tmp_path / "work", command=_fake_serve,
                           boot_nice=0)
    try:
        runtime.scale("iris", "2", 1)
        _poll_until(runtime, lambda: runtime.instances("iris", "2")[0].state == READY)
        runtime.scale("iris", "1", 1)  # recorded and spawned; ready only after the outage began
        db.up = False
        with pytest.raises(StoreUnavailable):
            db.store.list_instances()

        # iris@1 becomes ready: routed now, its state written later
        _poll_until(runtime, lambda: "1" in table.models().get("iris", []))
        # iris@2 crashes: out of routing at once, counted once, restarted only once recorded
        _poll_until(runtime, lambda: runtime.num_crashes("iris", "2") == 1)
        assert table.models()["iris"] == ["1"]
        dead = runtime.instances("iris", "2")[0].pid
        for _ in range(10):
            with pytest.raises(StoreUnavailable):
                runtime.poll()
        assert runtime.num_crashes("iris", "2") == 1
        assert runtime.instances("iris", "2")[0].pid == dead

        db.up = True
        runtime.poll()
        [restarted] = runtime.instances("iris", "2")
        assert restarted.pid != dead and restarted.num_restarts == 1
        states = {v: i.state for _, v, i in db.store.list_instances()}
        assert states == {"1": READY, "2": "starting"}
        assert any("exited with status 3" in e.message for e in db.store.list_events("iris"))
    finally:
        db.up = True
        runtime.close(timeout_s=5)

"""`podium up`'s loop keeps the plane's database lock: once another plane took it (while this
one's lock connection was gone), this one stops acting, once, and stops itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from podium.control import loop as control_loop
from podium.control.actions import Scale
from podium.control.loop import ControlLoop
from podium.control.plane import ControlPlane
from podium.control.plane_lock import AlreadyRunning
from podium.control.store import Store
from podium.control.world import RuntimeWorld
from podium.routes.stats import VersionStats
from podium.routes.table import RouteTable
from tests.support.ready_runtime import FakeRuntime


class Lock:
    def __init__(self) -> None:
        self.answers: list[bool | AlreadyRunning] = []
        self.calls = 0

    def renew(self) -> bool:
        self.calls += 1
        answer = self.answers.pop(0) if self.answers else True
        if isinstance(answer, AlreadyRunning):
            raise answer
        return answer


def test_a_deposed_plane_stops_acting_and_stops_itself(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(control_loop, "LOCK_CHECK_S", 0.0)
    store = Store.open(f"sqlite:///{tmp_path / 'c.db'}")
    runtime, table, stats = FakeRuntime(), RouteTable(), VersionStats()
    plane = ControlPlane(store, RuntimeWorld(runtime, table, stats), materialize=lambda _p: None)
    lock, stopped = Lock(), []
    loop = ControlLoop(plane, runtime, table, stats, feeds=[], gateways=[],
                       plane_lock=lock, on_deposed=lambda: stopped.append(True))
    store.apply([Scale("iris", "1", 1)])

    lock.answers = [False]  # the database could not be asked: the pass still runs
    loop.step()
    assert runtime.counts == {("iris", "1"): 1} and loop.deposed is None
    store.apply([Scale("iris", "1", 2)])
    plane.driver.resync()  # what a failed pass does: the next one re-applies the stored world
    loop.step()
    assert runtime.counts == {("iris", "1"): 2}  # a loop that holds its lock acts
    lock.answers = [AlreadyRunning("another podium up (pid 7) already runs ...")]
    store.apply([Scale("iris", "1", 3)])
    plane.driver.resync()
    loop.step()
    assert loop.deposed is not None and stopped == [True]
    loop.step()  # and nothing after: no scale, no further lock check
    assert runtime.counts == {("iris", "1"): 2} and lock.calls == 3 and stopped == [True]
    store.close()

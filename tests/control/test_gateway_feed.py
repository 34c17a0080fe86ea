"""The control plane's side of its gateway processes: a drain ends only once every gateway
routes by a table that marks it, outcomes reach the rollout analysis, the table goes out as
soon as it changes."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from podium.control.api import create_app
from podium.control.gateway_api import add_gateway_routes
from podium.control.gateway_feed import PublishedTable, RouteFeed
from podium.control.plane import ControlPlane
from podium.control.store import Store
from podium.routes.stats import VersionStats
from podium.routes.sync import ENCODER, Outcomes, SyncReport
from podium.routes.table import Endpoint
from tests.support.fake_world import FakeWorld
from tests.support.polling import eventually


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def _feed(clock: Clock, *, grace_s: float = 0.0) -> RouteFeed:
    table = PublishedTable()
    feed = table.feed = RouteFeed(table, VersionStats(), clock=clock, grace_s=grace_s)
    table.set_split("echo", {"1": 100})
    table.add_endpoint("echo", "1", Endpoint("echo-1-1", "http://a"))
    feed.open()
    return feed


def _report(feed: RouteFeed, gateway: str, generation: int, in_flight: int = 0) -> int:
    """One sync turn of `gateway` routing by `generation`; returns the generation answered."""
    answer = feed.sync(SyncReport(gateway, feed.epoch, generation,
                                  in_flight={"echo-1-1": in_flight}), wait_s=0)
    return answer.generation


def test_a_drain_waits_for_every_gateway_to_take_the_table(clock: Clock) -> None:
    feed = _feed(clock)
    g = _report(feed, "a", -1)
    _report(feed, "b", -1)
    _report(feed, "a", g), _report(feed, "b", g)
    feed.table.drain("echo-1-1")
    endpoint = feed.table.endpoint("echo-1-1")
    assert endpoint.num_in_flight == 2  # neither gateway knows yet: both may still send
    drained = _report(feed, "a", g)  # a is told; its report was still under the old table
    assert endpoint.num_in_flight == 2
    _report(feed, "a", drained, in_flight=1)  # a routes by the new table, 1 request left
    assert endpoint.num_in_flight == 2  # a's request + b, still on the old table
    _report(feed, "b", drained)
    assert endpoint.num_in_flight == 1
    _report(feed, "a", drained, in_flight=0)
    assert endpoint.num_in_flight == 0  # now the instance may stop


def test_a_later_unrelated_change_does_not_hold_a_finished_drain(clock: Clock) -> None:
    feed = _feed(clock)
    feed.table.add_endpoint("echo", "1", Endpoint("echo-1-2", "http://b"))
    feed.table.drain("echo-1-1")
    drained = _report(feed, "a", -1)
    _report(feed, "a", drained)
    assert feed.table.endpoint("echo-1-1").num_in_flight == 0
    feed.table.endpoint("echo-1-2").healthy = False  # a probe failed: a new generation
    assert _report(feed, "a", drained) > drained  # a is one table behind now ...
    assert feed.table.endpoint("echo-1-1").num_in_flight == 0  # ... but knew of the drain


def test_a_silent_gateway_stops_counting(clock: Clock) -> None:
    feed = _feed(clock)
    _report(feed, "a", -1, in_flight=4)
    assert feed.table.endpoint("echo-1-1").num_in_flight == 4
    clock.now += feed.stale_s + 1
    feed.changed()
    assert feed.table.endpoint("echo-1-1").num_in_flight == 0
    assert [g["live"] for g in feed.gateways()] == [False]


def test_after_a_restart_a_drain_waits_for_gateways_not_heard_from(clock: Clock) -> None:
    feed = _feed(clock, grace_s=3.0)
    feed.table.drain("echo-1-1")  # no gateway reported yet: one on an old table may exist
    assert feed.table.endpoint("echo-1-1").num_in_flight == 1
    clock.now += 3.5
    feed.changed()
    assert feed.table.endpoint("echo-1-1").num_in_flight == 0


def test_outcomes_reach_the_analysis(clock: Clock) -> None:
    feed = _feed(clock)
    outcomes = Outcomes("echo", "1", [1000, 1001, 1002], [5.0, 7.0, 9.0], [True, False, True])
    feed.sync(SyncReport("a", outcomes=[outcomes]), wait_s=0)
    health = feed.stats.health("echo", "1", since_ms=1001)
    assert (health.num_requests, health.num_errors, health.p99_ms) == (2, 1, 9.0)
    assert feed.gateways()[0]["num_outcomes"] == 3


def test_a_change_answers_a_waiting_gateway_at_once(clock: Clock) -> None:
    feed = _feed(clock)
    current = feed.sync(SyncReport("a"), wait_s=0)
    assert current.routes is not None and current.routes["echo"].splits == {"1": 100}
    answers: list[Any] = []
    # an hour's wait: only the change can answer it inside the test's 30 s join
    waiting = threading.Thread(target=lambda: answers.append(
        feed.sync(SyncReport("a", feed.epoch, current.generation), wait_s=3600)), daemon=True)
    waiting.start()
    assert eventually(lambda: len(feed._cond._waiters) == 1)  # it waits for a change
    feed.table.set_split("echo", {"1": 50, "2": 50})
    waiting.join(30)
    assert not waiting.is_alive(), "the change did not answer the waiting gateway"
    answer = answers[0]
    assert answer.routes is not None and answer.routes["echo"].splits == {"1": 50, "2": 50}


def test_no_table_until_the_first_loop_pass(clock: Clock) -> None:
    table = PublishedTable()
    feed = table.feed = RouteFeed(table, VersionStats(), clock=clock)
    assert feed.sync(SyncReport("a"), wait_s=0).routes is None  # gateways keep their own
    feed.open()
    assert feed.sync(SyncReport("a"), wait_s=0).routes == {}


@pytest.mark.parametrize("body,named", [
    (b"{not json", "the request body is not valid JSON"),
    (b'{"gateway_id": 3}', "Expected `str`, got `int` - at `$.gateway_id`"),
    (b'{"gateway_id": "a", "colour": "red"}', "unknown field `colour`"),
], ids=["not-json", "wrong-type", "unknown-field"])
def test_a_bad_sync_report_is_a_400_and_the_next_good_one_works(
        clock: Clock, tmp_path: Path, body: bytes, named: str) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'c.db'}")
    try:
        feed = _feed(clock)
        app = create_app(ControlPlane(store, FakeWorld(), materialize=lambda _p: None))
        add_gateway_routes(app, feed, wait_s=0)
        client = TestClient(app)
        json = {"content-type": "application/json"}
        bad = client.post("/v1/gateways/sync", content=body, headers=json)
        assert bad.status_code == 400 and named in bad.json()["error"]["message"], bad.text
        good = client.post("/v1/gateways/sync", content=ENCODER.encode(SyncReport("a")),
                           headers=json)
        assert good.status_code == 200
        assert good.json()["routes"]["echo"]["splits"] == {"1": 100}
        assert [g["id"] for g in client.get("/v1/gateways").json()] == ["a"]
    finally:
        store.close()


def test_the_control_api_sums_every_gateways_traffic_in_its_metrics(
        clock: Clock, tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'c.db'}")
    try:
        feed = _feed(clock)
        app = create_app(ControlPlane(store, FakeWorld(), materialize=lambda _p: None))
        add_gateway_routes(app, feed, wait_s=0)
        client = TestClient(app)
        json = {"content-type": "application/json"}
        for gateway, ok in (("a", [True, True]), ("b", [True, False])):
            report = SyncReport(gateway, outcomes=[
                Outcomes("echo", "1", [1, 2], [3.0, 4.0], ok)])
            assert client.post("/v1/gateways/sync", content=ENCODER.encode(report),
                               headers=json).status_code == 200
        text = client.get("/metrics").text
        assert 'podium:gateway_requests_total{model="echo",outcome="ok",version="1"} 3.0' in text
        assert ('podium:gateway_requests_total{model="echo",outcome="error",version="1"} 1.0'
                in text)
        assert 'podium:gateway_split_weight{model="echo",version="1"} 100.0' in text
    finally:
        store.close()


def test_each_gateway_is_told_what_the_others_have_in_flight(clock: Clock) -> None:
    """Several gateways in front of one instance share its bound: each answer carries the
    other live gateways' last counts, never the asking gateway's own, nor a silent one's."""
    feed = _feed(clock)
    feed.sync(SyncReport("a", "", -1, in_flight={"echo-1-1": 5}), wait_s=0)
    feed.sync(SyncReport("b", "", -1, in_flight={"echo-1-1": 2}), wait_s=0)
    answer = feed.sync(SyncReport("c", "", -1, in_flight={"echo-1-1": 1}), wait_s=0)
    assert answer.elsewhere == {"echo-1-1": 7}
    assert feed.sync(SyncReport("a", "", -1, in_flight={"echo-1-1": 5}),
                     wait_s=0).elsewhere == {"echo-1-1": 3}
    clock.now += feed.stale_s + 1  # a and b went silent
    assert feed.sync(SyncReport("c", "", -1, in_flight={}), wait_s=0).elsewhere == {}

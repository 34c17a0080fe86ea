"""A model's traffic per version over the last minutes (`GET /v1/traffic`): requests, errors
and exact p50/p99 latency per bucket, from what the gateways report."""

from __future__ import annotations

import time
from pathlib import Path

from fastapi.testclient import TestClient

from podium.control.api import create_app
from podium.control.gateway_api import add_gateway_routes
from podium.control.gateway_feed import PublishedTable, RouteFeed
from podium.control.plane import ControlPlane
from podium.control.store import Store
from podium.routes.stats import Outcome, VersionStats
from podium.routes.sync import ENCODER, Outcomes, SyncReport
from podium.routes.traffic import quantile, series
from tests.support.fake_world import FakeWorld


def test_buckets_hold_each_requests_latency_and_quantiles_are_exact() -> None:
    stats = VersionStats()
    now = 100_000
    for i in range(100):  # v1: latencies 1..100 ms in the bucket [90 s, 100 s)
        stats.record("echo", "1", Outcome(now - 5_000, float(i + 1), i % 10 != 0))
    stats.record("echo", "2", Outcome(now - 15_000, 7.0, True))
    stats.record("echo", "2", Outcome(now - 60_000, 999.0, True))  # before the span
    stats.record("other", "1", Outcome(now - 1_000, 5.0, True))
    got = series(stats, "echo", now_ms=now, span_ms=30_000, step_ms=10_000)
    assert sorted(got) == ["1", "2"]
    last = got["1"]["buckets"][-1]
    assert last == {"start_ms": 90_000, "num_requests": 100, "num_errors": 10,
                    "p50_ms": 50.0, "p99_ms": 99.0}
    assert [b["num_requests"] for b in got["2"]["buckets"]] == [0, 1, 0]
    assert got["2"]["buckets"][0]["p50_ms"] is None
    assert got["2"]["total"]["num_requests"] == 1 and got["2"]["total"]["p99_ms"] == 7.0
    assert got["2"]["recent"]["num_requests"] == 1  # the last minute
    assert got["1"]["recent"]["p99_ms"] == 99.0
    assert quantile([], 0.5) is None and quantile([3.0], 0.99) == 3.0


def test_the_api_reads_the_gateways_reports_per_version(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'c.db'}")
    try:
        table = PublishedTable()
        feed = table.feed = RouteFeed(table, VersionStats(), grace_s=0)
        table.set_split("echo", {"1": 90, "2": 10})
        feed.open()
        app = create_app(ControlPlane(store, FakeWorld(), materialize=lambda _p: None))
        add_gateway_routes(app, feed, wait_s=0)
        client = TestClient(app)
        at = int(time.time() * 1000) - 1_000
        for gateway, version, latencies in (("a", "1", [10.0, 20.0, 30.0]),
                                            ("b", "1", [40.0]), ("b", "2", [500.0, 700.0])):
            report = SyncReport(gateway, outcomes=[Outcomes(
                "echo", version, [at] * len(latencies), latencies, [True] * len(latencies))])
            assert client.post("/v1/gateways/sync", content=ENCODER.encode(report),
                               headers={"content-type": "application/json"}).status_code == 200

        bad = client.get("/v1/traffic", params={"model": "echo", "span_s": 3600, "step_s": 1})
        assert bad.status_code == 400
        assert "3600 buckets; at most 600: widen step_s" in bad.json()["error"]["message"]
        r = client.get("/v1/traffic", params={"model": "echo", "span_s": 60, "step_s": 10})
        assert r.status_code == 200, r.text
        versions = r.json()["versions"]
        assert versions["1"]["total"] == {**versions["1"]["total"], "num_requests": 4,
                                          "num_errors": 0, "p50_ms": 20.0, "p99_ms": 40.0}
        assert versions["2"]["total"]["p50_ms"] == 500.0
        assert versions["2"]["total"]["p99_ms"] == 700.0
        assert len(versions["1"]["buckets"]) == 6
        assert client.get("/v1/traffic", params={"model": "ghost"}).json()["versions"] == {}
        assert client.get("/v1/traffic").status_code == 400  # the model is required
    finally:
        store.close()

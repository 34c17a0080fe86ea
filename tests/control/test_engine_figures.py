"""The LLM figures per version (`GET /v1/engines`): tokens/s, TTFT p50/p99, KV cache and queue
from the ready instances' /metrics, scraped at a bounded rate, only for LLM packages."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from podium.control.actions import Scale
from podium.control.api import create_app
from podium.control.engine_api import add_engine_routes
from podium.control.engine_figures import EngineFigures
from podium.control.plane import ControlPlane
from podium.control.runtime.base import READY, STARTING, InstanceView
from podium.control.store import Store
from tests.support.fake_metrics import KV_CACHE, TOKENS_PER_S, exposition, fake_instance
from tests.support.fake_world import FakeWorld


def _view(url: str, *, id: str = "smol-1-1", state: str = READY) -> InstanceView:
    return InstanceView(id=id, model="smol", version="1", state=state, url=url, pid=1,
                        num_restarts=0, log_path=None)


def test_rates_and_quantiles_come_from_the_last_two_scrapes() -> None:
    with fake_instance(api_key="k") as url:
        figures = EngineFigures(lambda _m, _v: [_view(url)],
                                httpx.Client(headers={"Authorization": "Bearer k"}),
                                interval_s=0.0)
        first = figures.read("smol", "1")
        assert first["num_read"] == 1 and first["generated_per_s"] is None  # one reading
        assert first["kv_cache_usage"] == KV_CACHE and first["waiting"] == 1.0
        time.sleep(0.5)
        second = figures.read("smol", "1")
    assert second["generated_per_s"] == pytest.approx(TOKENS_PER_S, rel=0.1)
    # the fake's TTFT: 90% in (0.05, 0.1], 10% in (0.2, 0.4]
    assert 50 < second["ttft_p50_ms"] <= 100 and 200 < second["ttft_p99_ms"] <= 400
    assert second["running"] == 3.0


def test_scrapes_are_bounded_a_failed_one_keeps_the_last_and_unready_ones_are_skipped() -> None:
    answers: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        answers.append(1)
        if len(answers) == 2:
            return httpx.Response(503)
        return httpx.Response(200, text=exposition(float(len(answers))))
    now = [0.0]
    views = [_view("http://i1"), _view("http://i2", id="smol-1-2", state=STARTING)]
    figures = EngineFigures(lambda _m, _v: views, httpx.Client(
        transport=httpx.MockTransport(handler)), interval_s=2.0, clock=lambda: now[0])
    for _ in range(5):  # five consoles at once: one scrape
        assert figures.read("smol", "1")["num_read"] == 1
    assert len(answers) == 1
    now[0] = 2.0
    failed = figures.read("smol", "1")  # 503: the last reading stands, never a zero
    assert len(answers) == 2 and failed["num_read"] == 1 and failed["kv_cache_usage"] == KV_CACHE
    assert failed["num_ready"] == 1  # the starting instance is not scraped


def test_the_api_shows_llm_versions_only(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'c.db'}")
    try:
        for name, backend in (("smol", "vllm"), ("iris", "python")):
            store.announce_package(name, "1", backend, str(tmp_path), {})
            store.apply([Scale(name, "1", 1)])
        app = create_app(ControlPlane(store, FakeWorld(), materialize=lambda _p: None))
        seen: list[tuple[str, str]] = []

        def instances(model: str, version: str) -> list[InstanceView]:
            seen.append((model, version))
            return []
        add_engine_routes(app, store, EngineFigures(instances, httpx.Client()),
                          region="default")
        client = TestClient(app)
        bad = client.get("/v1/engines", params={"model": "Not A Name"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "model"
        r = client.get("/v1/engines", params={"model": "smol"})
        assert r.status_code == 200, r.text
        assert r.json()["versions"]["1"]["num_ready"] == 0
        assert r.json()["versions"]["1"]["generated_per_s"] is None
        assert client.get("/v1/engines", params={"model": "iris"}).json()["versions"] == {}
        assert seen == [("smol", "1")]  # the classic model's instances were never scraped
    finally:
        store.close()

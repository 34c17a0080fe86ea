"""The model page's per-version figures in headless Chromium: requests/s, error rate, p50 and
p99 latency from the gateways' reports (`GET /v1/traffic`), and an LLM version's engine figures
(`GET /v1/engines`), over an in-process control API."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from podium.control.actions import Scale, SetSplit
from podium.control.api import create_app
from podium.control.engine_api import add_engine_routes
from podium.control.engine_figures import EngineFigures
from podium.control.gateway_api import add_gateway_routes
from podium.control.gateway_feed import PublishedTable, RouteFeed
from podium.control.runtime.base import READY, InstanceView
from podium.routes.stats import Outcome, VersionStats
from tests.support.control_api import FAST, Env, deployed
from tests.support.fake_metrics import fake_instance
from tests.support.servers import Served

pytestmark = pytest.mark.browser
KEY = "console-traffic-key-0123456789"


def test_each_version_shows_its_own_p50_and_p99(tmp_path: Path, browser: Any,
                                                shoot: Callable[..., None]) -> None:
    from playwright.sync_api import expect

    env = Env(tmp_path)
    deployed(env)  # iris@1 serving, iris@2 announced
    r = env.client.post("/v1/rollouts", json={"model": "iris", "version": "2",
                                              "strategy": "versioned", **FAST})
    assert r.status_code == 201, r.text
    env.run_until_done()
    table = PublishedTable()
    feed = table.feed = RouteFeed(table, VersionStats(), grace_s=0)
    feed.open()
    now = int(time.time() * 1000)
    for ago_s in (45, 35, 25, 5):  # four 10 s buckets with traffic, the last minute in all
        for i in range(25):  # v1: 1..25 ms, one error in five; v2: ten times slower
            feed.stats.record("iris", "1", Outcome(now - ago_s * 1000, float(i + 1), i % 5 != 0))
            feed.stats.record("iris", "2", Outcome(now - ago_s * 1000, 10.0 * (i + 1), True))
    app = create_app(env.plane, api_key=KEY)
    add_gateway_routes(app, feed, wait_s=0)
    served = Served(app)
    try:
        page = browser.new_page()
        page.goto(served.url + "/console/#/model/iris")
        page.fill("#admin-key", KEY)
        page.keyboard.press("Enter")
        one, two = (page.locator(f'.version[data-version="{v}"]') for v in ("1", "2"))
        # 100 requests in the last minute each; v1's latencies 1..25 ms four times over
        expect(one.locator(".rate")).to_have_text("1.67")
        expect(one.locator(".errors")).to_have_text("20.0%")
        expect(one.locator(".p50")).to_have_text("13.0 ms")
        expect(one.locator(".p99")).to_have_text("25.0 ms")
        expect(two.locator(".p50")).to_have_text("130.0 ms")
        expect(two.locator(".p99")).to_have_text("250.0 ms")
        expect(two.locator(".errors")).to_have_text("0.0%")
        expect(one.locator(".spark polyline")).to_have_count(4)  # the four charts drawn
        label = one.locator(".spark").nth(3).get_attribute("aria-label") or ""
        assert label.startswith("p99 latency over the last") and label.endswith("peak 25.00")
        shoot(page, "console-model-latency", full_page=True)
    finally:
        served.stop()
        env.store.close()


def test_an_llm_version_shows_tokens_ttft_kv_cache_and_queue(tmp_path: Path, browser: Any,
                                                             shoot: Callable[..., None]) -> None:
    """An LLM version's engine figures, read from an instance's /metrics (a fake vLLM
    exposition on loopback whose counters grow at known rates: no engine started)."""
    from playwright.sync_api import expect

    env = Env(tmp_path)
    env.store.announce_package("smol", "1", "vllm", str(tmp_path), {})
    env.store.apply([Scale("smol", "1", 1), SetSplit("smol", {"1": 100})])
    with fake_instance() as url:
        view = InstanceView(id="smol-1-1", model="smol", version="1", state=READY, url=url,
                            pid=1, num_restarts=0, log_path=None)
        app = create_app(env.plane, api_key=KEY)
        add_engine_routes(app, env.store, EngineFigures(lambda _m, _v: [view], httpx.Client(),
                                                        interval_s=0.5), region="default")
        served = Served(app)
        try:
            page = browser.new_page()
            page.goto(served.url + "/console/#/model/smol")
            page.fill("#admin-key", KEY)
            page.keyboard.press("Enter")
            card = page.locator('.version[data-version="1"]')
            expect(card.locator(".kv")).to_have_text("42%")
            expect(card.locator(".queue")).to_have_text("1 waiting, 3 running")
            # from the second reading on: the fake generates 100 tokens/s
            expect(card.locator(".tokens")).to_have_text(re.compile(r"^(9\d|10\d)\.\d$"))
            expect(card.locator(".ttft")).to_have_text(re.compile(r"^\d+ ms / \d+ ms$"))
            expect(card.locator(".llm .spark polyline")).to_have_count(4, timeout=15_000)
            shoot(page, "console-model-llm", full_page=True)
        finally:
            served.stop()
            env.store.close()


def test_with_regions_each_version_shows_its_regions_own_figures(tmp_path: Path,
                                                                 browser: Any) -> None:
    from playwright.sync_api import expect

    env = Env(tmp_path)
    app = create_app(env.plane, api_key=KEY)
    now = int(time.time() * 1000)
    for region, latency in (("eu", 10.0), ("us", 80.0)):
        env.store.apply([Scale("iris", "1", 1, region=region),
                         SetSplit("iris", {"1": 100}, region=region)])
        table = PublishedTable()
        feed = table.feed = RouteFeed(table, VersionStats(), grace_s=0)
        feed.open()
        for _ in range(30):
            feed.stats.record("iris", "1", Outcome(now - 2_000, latency, True))
        add_gateway_routes(app, feed, wait_s=0, prefix=f"/regions/{region}")
    served = Served(app)
    try:
        page = browser.new_page()
        page.goto(served.url + "/console/#/model/iris")
        page.fill("#admin-key", KEY)
        page.keyboard.press("Enter")
        for region, p99 in (("eu", "10.0 ms"), ("us", "80.0 ms")):
            card = page.locator(f'.version[data-version="1"][data-region="{region}"]')
            expect(card.locator(".p99")).to_have_text(p99)
            expect(card.locator("h3 .tag")).to_have_text(region)
            expect(card.locator(".rate")).to_have_text("0.50")
    finally:
        served.stop()
        env.store.close()

"""What hangs off a model, in headless Chromium over an in-process control API: LoRA adapters
under their base model (a stored state: an adapter needs an LLM base, none is started) and a
pipeline's steps with their latency, outcomes and variant split (a fake pipeline instance whose
/metrics holds the real step families)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from podium.control.actions import Scale, SetSplit
from podium.control.api import create_app
from podium.control.gateway_api import add_gateway_routes
from podium.control.gateway_feed import PublishedTable, RouteFeed
from podium.control.pipeline_figures import PipelineFigures, add_pipeline_routes
from podium.control.runtime.base import READY, InstanceView
from podium.routes.stats import Outcome, VersionStats
from tests.support.control_api import Env
from tests.support.fake_pipeline import StepMetrics, fake_pipeline_instance
from tests.support.servers import Served

pytestmark = pytest.mark.browser
KEY = "console-related-key-0123456789"


def _open(browser: Any, url: str) -> Any:
    page = browser.new_page()
    page.goto(url)
    page.fill("#admin-key", KEY)
    page.keyboard.press("Enter")
    return page


def test_adapters_show_under_their_base_with_their_split_and_figures(
        tmp_path: Path, browser: Any, shoot: Callable[..., None]) -> None:
    from playwright.sync_api import expect

    env = Env(tmp_path)
    env.store.announce_package("smol", "1", "vllm", str(tmp_path), {})
    for version in ("1", "2"):
        env.store.announce_package("tone", version, "lora", str(tmp_path), {
            "backend": "lora", "name": "tone", "version": version, "base": "smol@1", "rank": 8})
    env.store.apply([Scale("smol", "1", 1), SetSplit("smol", {"1": 100}),
                     Scale("tone", "1", 1), Scale("tone", "2", 1),
                     SetSplit("tone", {"1": 80, "2": 20})])
    table = PublishedTable()
    feed = table.feed = RouteFeed(table, VersionStats(), grace_s=0)
    feed.open()
    now = int(time.time() * 1000)
    for i in range(30):  # tone@1: 30 requests of 1..30 ms; tone@2: 6 of 100 ms, one failed
        feed.stats.record("tone", "1", Outcome(now - 5_000, float(i + 1), True))
    for i in range(6):
        feed.stats.record("tone", "2", Outcome(now - 5_000, 100.0, i != 0))
    app = create_app(env.plane, api_key=KEY)
    add_gateway_routes(app, feed, wait_s=0)
    served = Served(app)
    try:
        page = _open(browser, served.url + "/console/#/")
        base = page.locator('.card[data-model="smol"]')
        adapter = base.locator('.adapter[data-adapter="tone"]')
        expect(adapter.locator(".split")).to_have_attribute("data-split", "1 80%, 2 20%")
        expect(adapter.locator('tr[data-version="2"] .share')).to_have_text("20%")
        expect(page.locator('.card[data-model="tone"]')).to_have_count(0)  # not on its own
        shoot(page, "console-adapters-overview", full_page=True)

        page.goto(served.url + "/console/#/model/smol")
        adapter = page.locator('.adapter[data-adapter="tone"]')
        one, two = (adapter.locator(f'tr[data-version="{v}"]') for v in ("1", "2"))
        expect(one.locator(".rate")).to_have_text("0.50")
        expect(one.locator(".p50")).to_have_text("15.0 ms")
        expect(one.locator(".p99")).to_have_text("30.0 ms")
        expect(two.locator(".errors")).to_have_text("16.7%")
        expect(two.locator(".p99")).to_have_text("100.0 ms")
        shoot(page, "console-adapters-model", full_page=True)

        adapter.locator('a[href="#/model/tone"]').click()
        expect(page.locator(".adapter-of a")).to_have_text("smol")
    finally:
        served.stop()
        env.store.close()


def test_a_pipeline_shows_each_steps_latency_outcomes_and_variant_split_live(
        tmp_path: Path, browser: Any, shoot: Callable[..., None]) -> None:
    from playwright.sync_api import expect

    env = Env(tmp_path)
    env.store.announce_package("recs", "1", "pipeline", str(tmp_path), {})
    env.store.apply([Scale("recs", "1", 1), SetSplit("recs", {"1": 100})])
    metrics = StepMetrics()

    def serve(n: int) -> None:  # n requests: 3 in 4 control, the rank step gated to control
        for i in range(n):
            variant = "treatment" if i % 4 == 0 else "control"
            metrics.observe("arm", variant, "ok", 0.002)
            metrics.observe("features", variant, "timeout" if i == 0 else "ok", 0.02)
            metrics.observe("rank", variant, "ok" if variant == "control" else "not_run",
                            0.2 if variant == "control" else 0.0)

    serve(40)
    with fake_pipeline_instance(metrics) as url:
        view = InstanceView(id="recs-1-1", model="recs", version="1", state=READY, url=url,
                            pid=1, num_restarts=0, log_path=None)
        app = create_app(env.plane, api_key=KEY)
        add_pipeline_routes(app, env.store, PipelineFigures(lambda _m, _v: [view],
                                                            httpx.Client(), interval_s=0.2),
                            region="default")
        served = Served(app)
        try:
            page = _open(browser, served.url + "/console/#/model/recs")
            card = page.locator('.pipeline[data-version="1"]')
            expect(card.locator(".variants")).to_have_attribute(
                "data-split", "control 75.0% (30), treatment 25.0% (10)")
            arm, features, rank = (card.locator(f'tr[data-step="{s}"]')
                                   for s in ("arm", "features", "rank"))
            expect(arm.locator(".requests")).to_have_text("40")
            expect(arm.locator(".mean")).to_have_text("2.0 ms")
            expect(features.locator(".outcomes")).to_have_text("ok 39 timeout 1")
            expect(rank.locator(".outcomes")).to_have_text("not_run 10 ok 30")
            expect(rank.locator(".by-variant")).to_have_text("control 30, treatment 10")
            # histogram quantiles: 10 not_run in the first bucket, 30 in (0.1, 0.25] s
            expect(rank.locator(".p50")).to_have_text("150.0 ms")
            expect(rank.locator(".p99")).to_have_text("248.0 ms")
            shoot(page, "console-pipeline", full_page=True)
            serve(40)  # live: the next polls show the new totals without a reload
            expect(arm.locator(".requests")).to_have_text("80")
            expect(card.locator(".variants")).to_have_attribute(
                "data-split", "control 75.0% (60), treatment 25.0% (20)")
        finally:
            served.stop()
            env.store.close()

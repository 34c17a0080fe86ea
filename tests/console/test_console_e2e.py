"""The console in a real headless Chromium over a real `podium up` (python-backend `echo`
versions, no LLM): what an operator sees, and what the buttons ask the API."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.console_load import Trickle
from tests.support.echo_platform import write_echo
from tests.support.up_process import Up, wait

pytestmark = pytest.mark.browser
KEY = "console-admin-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
# p99 is judged loosely: the gateway, two instances and the browser share 2 loaded cores (as in
# tests/control/test_e2e_rollout.py); the broken version fails on its error rate
QUICK = {"analysis_window_ms": 3_000, "min_requests": 5, "warm_delay_ms": 1_000,
         "ready_timeout_ms": 60_000, "max_p99_ratio": 4.0, "p99_slack_ms": 100.0}


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    """`podium up` with the admin key, echo@1 serving, echo@2 and a broken echo@3 announced."""
    u = Up(tmp_path, api_key=KEY)
    u.start()
    try:
        for version, params in (("1", {}), ("2", {}), ("3", {"fail": True})):
            path = str(write_echo(tmp_path / "packages", version, **params))
            r = httpx.post(u.api + "/v1/packages", json={"path": path}, headers=AUTH, timeout=10)
            assert r.status_code == 201, r.text
        first = call(u, "POST", "/v1/rollouts", {"model": "echo", "version": "1",
                                                  "stages": [100], "analysis_window_ms": 0,
                                                  "warm_delay_ms": 0})
        wait(lambda: call(u, "GET", f"/v1/rollouts/{first['id']}")["status"] == "succeeded",
             what="echo@1 deployed", detail=u.diagnosis)
        yield u
    finally:
        assert u.process is not None
        u.process.terminate()
        u.process.wait(timeout=60)
        u.kill_gateways()


def call(u: Up, method: str, path: str, body: dict | None = None) -> Any:
    r = httpx.request(method, u.api + path, json=body, headers=AUTH, timeout=10)
    assert r.status_code < 300, r.text
    return r.json()


def test_an_operator_watches_deploys_and_rolls_back(up: Up, browser: Any,
                                                    shoot: Callable[..., None]) -> None:
    from playwright.sync_api import expect

    page = browser.new_page()
    page.goto(up.api + "/console")
    # without the key, the API's own refusal shows; typed once, the page reads everything
    expect(page.locator("#error")).to_contain_text("401")
    expect(page.locator("#error")).to_contain_text("Authorization: Bearer")
    page.fill("#admin-key", KEY)
    page.click("text=Use key")
    card = page.locator('[data-model="echo"]')
    expect(card.locator(".split")).to_have_attribute("data-split", "1 100%")
    expect(card.locator(".seg")).to_have_text("1 100%")
    expect(card).to_contain_text("latest: 1")
    expect(card.locator(".badge.ready")).to_have_count(1)
    expect(page.locator("#error")).to_be_hidden()
    expect(page.locator("table.gateways")).to_contain_text("in sync")
    shoot(page, "console-overview")

    with Trickle(up.gateway, "echo", key=KEY):
        # a Red-Black deploy clicked through the model page: confirmed, sent with the key
        page.click('[data-model="echo"] h3 a')
        expect(page.locator("#deploy")).to_be_visible()
        deploy_form(page, "2", "50,100")
        with page.expect_request(lambda r: r.url.endswith("/v1/rollouts")
                                 and r.method == "POST") as sent:
            page.click("#confirm-ok")
        assert sent.value.all_headers()["authorization"] == f"Bearer {KEY}"
        # the stage timeline moves: 50% current, then 50% passed and 100% current, then done
        expect(page.locator('.stage.current[data-stage="1"]')).to_be_visible(timeout=60_000)
        expect(page.locator("#rollout-stage")).to_have_text("1/2")
        # the live split bar: half of the traffic on each version at the 50% stage
        expect(page.locator(".split")).to_have_attribute("data-split", "1 50%, 2 50%",
                                                         timeout=60_000)
        shoot(page, "console-rollout-running")
        expect(page.locator('.stage.current[data-stage="2"]')).to_be_visible(timeout=60_000)
        expect(page.locator('.stage.passed[data-stage="1"]')).to_be_visible()
        expect(page.locator("#rollout-status")).to_have_text("succeeded", timeout=60_000)
        expect(page.locator(".stage.passed")).to_have_count(2)
        expect(page.locator(".steps")).to_contain_text("analysis passed at 50%")

        # the model page: both versions side by side with live figures
        page.goto(up.api + "/console/#/model/echo")
        expect(page.locator(".split")).to_have_attribute("data-split", "2 100%", timeout=30_000)
        version2 = page.locator('.version[data-version="2"]')
        expect(version2.locator(".spark polyline")).to_have_count(4, timeout=30_000)
        wait(lambda: float(version2.locator(".rate").inner_text() or 0) > 0,
             what="v2's request rate on the model page")
        # p50/p99 of v2 from the gateway's reports of the trickle's requests
        expect(version2.locator(".p99")).to_have_text(re.compile(r"^\d+\.\d ms$"))
        expect(version2.locator(".p50")).to_have_text(re.compile(r"^\d+\.\d ms$"))
        # `podium up` serves the engine figures too: echo is no LLM, so none are scraped
        assert call(up, "GET", "/v1/engines?model=echo") == {"model": "echo", "versions": {}}
        expect(version2.locator(".llm")).to_have_count(0)
        shoot(page, "console-model", full_page=True)

        # an unknown version: the API's message, word for word
        refused = httpx.post(up.api + "/v1/rollouts", headers=AUTH, timeout=10,
                             json={"model": "echo", "version": "9"}).json()["error"]["message"]
        deploy_form(page, "9", "")
        page.click("#confirm-ok")
        expect(page.locator("#error")).to_contain_text(refused)

        # a broken version rolls back on its own; the rollout page says why
        broken = call(up, "POST", "/v1/rollouts", {"model": "echo", "version": "3",
                                                    "stages": [50, 100], **QUICK})
        page.goto(up.api + f"/console/#/rollout/{broken['id']}")
        expect(page.locator("#rollout-status")).to_have_text("rolled_back", timeout=90_000)
        expect(page.locator("[data-reason]")).to_contain_text("analysis failed at 50%")
        expect(page.locator(".stage.failed")).to_have_count(1)
        shoot(page, "console-rollback-reason", full_page=True)

    # roll back by hand: echo goes back to 1, asked with the key
    page.goto(up.api + "/console/#/model/echo")
    page.click("#rollback")
    expect(page.locator("#confirm-text")).to_contain_text("Roll echo back")
    with page.expect_request(lambda r: r.url.endswith("/v1/models/echo/rollback")) as sent:
        page.click("#confirm-ok")
    assert sent.value.all_headers()["authorization"] == f"Bearer {KEY}"
    expect(page.locator("#rollout-title")).to_contain_text("2 → 1")
    expect(page.locator("#rollout-status")).to_have_text("succeeded", timeout=90_000)

    # events, filtered by model: the plane's own log of the above
    page.goto(up.api + "/console/#/events")
    page.fill("#event-model", "echo")
    rows = page.locator("table.events tbody tr")
    expect(rows.first).to_be_visible()
    expect(page.locator("table.events")).to_contain_text("echo@1")
    shoot(page, "console-events")
    page.fill("#event-model", "nothing-here")
    expect(rows).to_have_count(0)

    # a phone's screen
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(up.api + "/console/#/")
    expect(page.locator('[data-model="echo"] .split')).to_have_attribute(
        "data-split", "1 100%", timeout=30_000)
    shoot(page, "console-phone")
    _report_polling_cpu(up, browser)


def deploy_form(page: Any, version: str, stages: str) -> None:
    page.fill('#deploy [name="version"]', version)
    page.fill('#deploy [name="stages"]', stages)
    page.click("#deploy summary")
    for name, value in QUICK.items():
        page.fill(f'#deploy [name="{name}"]', str(value))
    page.click("#deploy button[type=submit]")
    from playwright.sync_api import expect
    expect(page.locator("#confirm")).to_be_visible()


def _report_polling_cpu(up: Up, browser: Any) -> None:
    """The plane's CPU with 5 consoles polling the overview vs none (reported, not judged):
    over 3 s each in the suite (two polls of the 1.5 s overview), `PODIUM_CONSOLE_CPU_S=10`
    for the figure docs/benchmarks.md reports."""
    seconds = float(os.environ.get("PODIUM_CONSOLE_CPU_S", "3"))
    assert up.process is not None
    idle = _cpu_over(up.process.pid, seconds)
    pages = [browser.new_page() for _ in range(5)]
    for p in pages:  # sessionStorage is per tab: each is given the key
        p.goto(up.api + "/console/#/")
        p.fill("#admin-key", KEY)
        p.click("text=Use key")
    from playwright.sync_api import expect
    for p in pages:
        expect(p.locator('[data-model="echo"]')).to_be_visible()
    polled = _cpu_over(up.process.pid, seconds)
    print(f"\nconsole polling: podium up CPU {100 * idle / seconds:.1f}% idle, "
          f"{100 * polled / seconds:.1f}% with 5 consoles open ({seconds:.0f} s each)")


def _cpu_over(pid: int, seconds: float) -> float:
    def used() -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    before = used()
    time.sleep(seconds)
    return used() - before

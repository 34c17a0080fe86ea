"""The console's actions in headless Chromium over an in-process control API (a fake world, no
instances): confirmed or cancelled, sent with the key, refused with the API's message."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from podium.control.api import create_app
from tests.support.control_api import FAST, Env, deployed
from tests.support.servers import Served

pytestmark = pytest.mark.browser
KEY = "console-actions-key-0123456789"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Env, Served]]:
    env = Env(tmp_path)
    deployed(env)  # iris@1 serving, iris@2 announced
    s = Served(create_app(env.plane, api_key=KEY))
    yield env, s
    s.stop()
    env.store.close()


def bounds(env: Env) -> tuple[int, int]:
    row = next(d for d in env.store.list_deployments("iris") if d.version == "1")
    return row.min_instances, row.max_instances


def test_scale_is_confirmed_sent_with_the_key_and_refusals_show(
        served: tuple[Env, Served], browser: Any) -> None:
    from playwright.sync_api import expect

    env, s = served
    page = browser.new_page()
    sent: list[tuple[str, str, str | None]] = []
    page.on("request", lambda r: sent.append((r.method, r.url, r.headers.get("authorization")))
            if r.method != "GET" else None)
    page.goto(s.url + "/console/#/model/iris")
    page.fill("#admin-key", KEY)
    page.keyboard.press("Enter")  # the key form submits from the keyboard
    expect(page.locator('.version[data-version="1"]')).to_be_visible()
    before = bounds(env)

    # Escape on the confirm dialog: nothing is sent, nothing changes
    page.fill('#scale [name="version"]', "1")
    page.fill('#scale [name="min_instances"]', "2")
    page.fill('#scale [name="max_instances"]', "3")
    page.click("#scale button[type=submit]")
    expect(page.locator("#confirm")).to_be_visible()
    expect(page.locator("#confirm-text")).to_have_text("Scale iris@1 to 2..3 instances?")
    page.keyboard.press("Escape")
    expect(page.locator("#confirm")).to_be_hidden()
    assert sent == [] and bounds(env) == before

    # confirmed from the keyboard: the PUT carries the key; the table shows the new bounds
    page.click("#scale button[type=submit]")
    page.focus("#confirm-ok")
    page.keyboard.press("Enter")
    expect(page.locator("table.versions")).to_contain_text("(2..3)")
    assert bounds(env) == (2, 3)
    assert sent == [("PUT", s.url + "/v1/deployments/iris/1/scaling", f"Bearer {KEY}")]

    # a refusal is the API's own message
    page.fill('#scale [name="min_instances"]', "5")
    page.fill('#scale [name="max_instances"]', "2")
    page.click("#scale button[type=submit]")
    page.click("#confirm-ok")
    refused = env.client.put("/v1/deployments/iris/1/scaling",
                             headers={"Authorization": f"Bearer {KEY}"},
                             json={"min_instances": 5, "max_instances": 2})
    expect(page.locator("#error")).to_contain_text(refused.json()["error"]["message"])
    assert bounds(env) == (2, 3)


def test_every_control_is_a_labelled_button_link_or_field(served: tuple[Env, Served],
                                                        browser: Any) -> None:
    """Keyboard and screen readers: fields have labels, actions are real buttons."""
    _env, s = served
    page = browser.new_page()
    page.goto(s.url + "/console/#/model/iris")
    for field in page.locator("input, select").all():
        label = field.evaluate("e => e.labels.length ? e.labels[0].textContent.trim() : ''")
        assert label, field.evaluate("e => e.outerHTML")
    assert page.locator("[onclick], div[role=button], span[role=button]").count() == 0
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"


def test_pause_and_resume_a_rollout_from_its_page(served: tuple[Env, Served], browser: Any,
                                                  shoot: Any) -> None:
    from playwright.sync_api import expect

    env, s = served
    auth = {"Authorization": f"Bearer {KEY}"}
    r = env.client.post("/v1/rollouts", headers=auth, json={
        "model": "iris", "version": "2", **FAST, "stages": [50, 100]})
    assert r.status_code == 201, r.text
    rollout_id = r.json()["id"]
    while env.store.get_rollout(rollout_id).state.phase != "analyze":
        env.plane.tick()
        env.world.now_ms += 250
    page = browser.new_page()
    sent: list[tuple[str, str, str | None]] = []
    page.on("request", lambda q: sent.append((q.method, q.url, q.headers.get("authorization")))
            if q.method != "GET" else None)
    page.goto(s.url + f"/console/#/rollout/{rollout_id}")
    page.fill("#admin-key", KEY)
    page.keyboard.press("Enter")
    expect(page.locator("#rollout-stage")).to_have_text("1/2")
    expect(page.locator("#resume")).to_be_disabled()

    page.click("#pause")
    expect(page.locator("#confirm-text")).to_have_text(
        f"Pause rollout {rollout_id} of iris (1 → 2) at stage 1/2?")
    page.keyboard.press("Escape")  # cancelled: nothing sent
    assert sent == []
    page.click("#pause")
    page.click("#confirm-ok")
    expect(page.locator("#paused")).to_contain_text("holds this stage")
    expect(page.locator("#pause")).to_be_disabled()
    expect(page.locator("#rollback")).to_have_text("Abort: roll back now")  # still running
    assert sent == [("POST", s.url + f"/v1/rollouts/{rollout_id}/pause", f"Bearer {KEY}")]
    for _ in range(40):  # 10 s of the plane's time: a paused rollout takes no step
        env.plane.tick()
        env.world.now_ms += 250
    expect(page.locator(".steps")).to_contain_text("paused by operator at stage 1/2")
    expect(page.locator("#rollout-stage")).to_have_text("1/2")
    expect(page.locator('.stage[data-stage="1"]')).to_have_class("stage current")
    shoot(page, "console-rollout-paused")

    page.click("#resume")
    expect(page.locator("#confirm-text")).to_contain_text(f"Resume rollout {rollout_id}")
    page.click("#confirm-ok")
    expect(page.locator("#paused")).to_have_count(0)
    expect(page.locator("#pause")).to_be_enabled()
    assert sent[-1] == ("POST", s.url + f"/v1/rollouts/{rollout_id}/resume", f"Bearer {KEY}")
    env.run_until_done(limit_ms=env.world.now_ms + 60_000)
    expect(page.locator("#rollout-status")).to_have_text("succeeded")
    expect(page.locator("#pause")).to_be_disabled()
    expect(page.locator("#rollback")).to_have_text("Roll this model back")

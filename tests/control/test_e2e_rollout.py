"""End to end: real `podium serve` instances behind the real gateway, under continuous load
(16 clients, thousands of requests spanning the rollout)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from podium.control.rollout_config import RolloutConfig
from tests.support.echo_platform import Load, Platform, write_echo

FIRST = RolloutConfig(stages=(100,), num_instances=2, ready_timeout_ms=60_000,
                      analysis_window_ms=0, warm_delay_ms=0)
# 16 clients, the gateway and 4 instances share 2 cores with whatever else runs: p99 latency
# swings by 2x between windows and one window in CI once showed 618 ms vs 20 ms, so it is
# judged loosely here and, as by default, only a regression seen in 2 windows in a row rolls
# back (the fake-clock tests pin the latency rule); the error-rate rule is what these runs
# exercise.
# windows and warm-up as tests/support/two_regions.py's (16 clients give each window hundreds
# of requests, far over min_requests): what these runs check is requests, not waiting
STAGED = RolloutConfig(stages=(25, 50, 100), num_instances=2, ready_timeout_ms=60_000,
                       analysis_window_ms=1_500, min_requests=20, warm_delay_ms=500,
                       max_p99_ratio=4.0, p99_slack_ms=100.0)


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[Platform]:
    p = Platform(tmp_path)
    yield p
    p.close()


def _serving_v1(platform: Platform, tmp_path: Path, **v2: object) -> None:
    for version, params in (("1", {}), ("2", v2)):
        package = write_echo(tmp_path / "packages", version, **params)
        platform.plane.announce(str(package))
    assert platform.wait_done(platform.deploy("1", FIRST)) == "succeeded"


def test_red_black_rollout_under_load_drops_no_request(platform: Platform,
                                                       tmp_path: Path) -> None:
    _serving_v1(platform, tmp_path)
    load = Load(platform.url)
    load.start()
    load.wait_requests(500)
    rollout_id = platform.deploy("2", STAGED)
    status = platform.wait_done(rollout_id)
    load.wait_requests(max(2_000, len(load.results) + 500))
    results = load.stop()

    assert status == "succeeded", platform.store.get_rollout(rollout_id).reason
    failures = [r for r in results if r.status != 200]
    assert failures == []
    assert len(results) >= 2_000
    versions = Counter(r.version for r in results)
    assert versions["1"] > 0 and versions["2"] > 0
    assert {r.version for r in results[-100:]} == {"2"}  # all traffic on v2 at the end
    platform.wait_for(lambda: [i.version for i in platform.runtime.instances()] == ["2", "2"])
    phases = [s.phase for s in platform.store.rollout_steps(rollout_id)]
    # one analysis per stage at least; a window judged slow under CPU load holds its stage for
    # another analysis (seen once: 4), which is the rule working, not a fault
    assert phases.count("analyze") >= len(STAGED.stages) and phases[-1] == "done"


def test_erroring_v2_rolls_back_without_a_failed_request_for_clients(
        platform: Platform, tmp_path: Path) -> None:
    _serving_v1(platform, tmp_path, fail=True)
    load = Load(platform.url)
    load.start()
    load.wait_requests(200)
    rollout_id = platform.deploy("2", STAGED)
    status = platform.wait_done(rollout_id)
    load.wait_requests(len(load.results) + 300)
    results = load.stop()

    record = platform.store.get_rollout(rollout_id)
    assert status == "rolled_back"
    # the analysis saw every failure of v2: each request it failed counts against it (at the
    # first stage, unless a loaded machine gave v2 fewer than min_requests in that window)
    assert re.fullmatch(r"analysis failed at (25|50)%: error rate 100\.0% vs 0\.0% .*",
                        record.reason), record.reason
    num_requests, num_errors, _ = platform.gateway.stats.totals[("echo", "2")]
    assert num_errors == num_requests >= STAGED.min_requests
    # and each was answered by v1 instead: no client saw one
    assert [r for r in results if r.status != 200] == []
    assert {r.version for r in results} == {"1"}
    assert platform.gateway.stats.retried[("echo", "2", "canary")] == num_errors
    platform.wait_for(lambda: [i.version for i in platform.runtime.instances()] == ["1", "1"])


def test_v2_that_never_gets_ready_rolls_back_without_a_failed_request(
        platform: Platform, tmp_path: Path) -> None:
    _serving_v1(platform, tmp_path, boot_fail=True)
    load = Load(platform.url)
    load.start()
    load.wait_requests(200)
    rollout_id = platform.deploy("2", STAGED)
    status = platform.wait_done(rollout_id)
    load.wait_requests(len(load.results) + 200)
    results = load.stop()

    record = platform.store.get_rollout(rollout_id)
    assert status == "rolled_back"
    assert "echo@2" in record.reason  # crashed at boot or never ready: either names it
    assert [r for r in results if r.status != 200] == []
    assert {r.version for r in results} == {"1"}


def test_versioned_rollout_serves_both_versions_side_by_side(platform: Platform,
                                                             tmp_path: Path) -> None:
    _serving_v1(platform, tmp_path)
    versioned = RolloutConfig(strategy="versioned", num_instances=1, ready_timeout_ms=60_000)
    assert platform.wait_done(platform.deploy("2", versioned)) == "succeeded"
    platform.wait_for(lambda: platform.gateway.table.models().get("echo") == ["1", "2"])
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}
    with httpx.Client(base_url=platform.url, timeout=10) as client:
        for version in ("1", "2"):
            r = client.post(f"/v2/models/echo/versions/{version}/infer", json=body)
            assert (r.status_code, r.json()["model_version"]) == (200, version)
        latest = client.post("/v2/models/echo/versions/latest/infer", json=body)
        assert latest.json()["model_version"] == "2"
    assert platform.store.aliases("echo") == {"latest": "2"}

"""A pipeline package rolled out Red-Black v1 → v2 through the control plane under a trickle of
requests, dropping none: real `podium serve` instances (xgb-example and the `recommend`
pipeline's control arm, no LLM) behind the real gateway and control loop, as `podium up`
wires them. The trickle uses both the KServe v2 route and the plain JSON route."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from podium.control.rollout_config import RolloutConfig
from podium.examples.builders import write_xgb_example
from podium.examples.recommend import recommend_manifest, write_recommend_example
from podium.package.package import write_manifest
from tests.support.echo_platform import Platform

FIRST = RolloutConfig(stages=(100,), num_instances=1, ready_timeout_ms=120_000,
                      analysis_window_ms=0, warm_delay_ms=0)
# judged on errors: a trickle on a shared 2-core machine makes p99 too noisy to rule on
STAGED = RolloutConfig(stages=(50, 100), num_instances=1, ready_timeout_ms=120_000,
                       analysis_window_ms=2_000, min_requests=5, warm_delay_ms=1_000,
                       max_p99_ratio=10.0, p99_slack_ms=1_000.0)


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[Platform]:
    p = Platform(tmp_path)
    yield p
    p.close()


def write_pipeline(root: Path, version: str, gateway_url: str) -> Path:
    """`recommend` at `version`: the example's control arm, its model called via the gateway."""
    package = write_recommend_example(root / f"recommend-{version}", "absent-llm")
    manifest = recommend_manifest("absent-llm")
    manifest["version"] = version
    manifest["steps"] = [s for s in manifest["steps"] if s["name"] != "pick"]
    manifest["steps"][0]["variants"] = [{"name": "control", "weight": 1}]
    manifest["steps"][-1]["args"].pop("picked")
    manifest["gateway_url"] = gateway_url
    write_manifest(package, manifest)
    return package


@dataclass
class Trickle:
    """One client sending requests back to back, alternating KServe v2 and the JSON route."""

    url: str
    results: list[tuple[int, str | None, str]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> list[tuple[int, str | None, str]]:
        self._stop.set()
        self._thread.join(timeout=60)
        return self.results

    def wait_requests(self, count: int, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.results) < count:
            assert time.monotonic() < deadline, f"only {len(self.results)} requests"
            time.sleep(0.05)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as client:
            for n in range(10**9):
                if self._stop.is_set():
                    return
                member = f"m{n % 200}"
                try:
                    if n % 2:
                        r = client.post("/pipelines/recommend", json={"member_id": member})
                        version = r.json().get("model_version") if r.is_success else None
                    else:
                        r = client.post("/v2/models/recommend/infer", json={"inputs": [
                            {"name": "member_id", "datatype": "BYTES", "shape": [1],
                             "data": [member]}]})
                        version = r.json().get("model_version") if r.is_success else None
                    self.results.append((r.status_code, version,
                                         "" if r.is_success else r.text[:200]))
                except httpx.HTTPError as exc:
                    self.results.append((0, None, repr(exc)))


def test_pipeline_red_black_rollout_under_a_trickle_drops_no_request(
        platform: Platform, tmp_path: Path) -> None:
    packages = tmp_path / "packages"
    xgb = write_xgb_example(packages / "xgb-example")
    assert platform.plane.announce(str(xgb))["backend"] == "xgboost"
    for version in ("1", "2"):
        announced = platform.plane.announce(str(write_pipeline(packages, version,
                                                               platform.url)))
        assert announced["backend"] == "pipeline"
    for name in ("xgb-example", "recommend"):
        rollout = platform.plane.deploy(name, "1", FIRST)
        assert platform.wait_done(rollout) == "succeeded", platform.plane.rollout(rollout)

    trickle = Trickle(platform.url)
    trickle.start()
    trickle.wait_requests(20)
    rollout_id = platform.plane.deploy("recommend", "2", STAGED)
    status = platform.wait_done(rollout_id, timeout_s=180)
    # past the warm delay: v1's instance drains and stops while requests keep coming
    platform.wait_for(lambda: [i.version for i in platform.runtime.instances("recommend")]
                      == ["2"], timeout_s=60)
    trickle.wait_requests(len(trickle.results) + 20)
    results = trickle.stop()

    assert status == "succeeded", platform.store.get_rollout(rollout_id).reason
    assert [r for r in results if r[0] != 200] == []
    versions = Counter(version for _, version, _ in results)
    assert versions["1"] > 0 and versions["2"] > 0, versions
    assert {version for _, version, _ in results[-10:]} == {"2"}  # all on v2 at the end
    phases = [s.phase for s in platform.store.rollout_steps(rollout_id)]
    assert phases.count("analyze") == 2 and phases[-1] == "done", phases

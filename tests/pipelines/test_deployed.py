"""A pipeline package announced and deployed through the control plane like any model
(store + gateway + local runtime + control loop, as `podium up` wires them): its instance
serves it alone and reaches xgb-example, deployed beside it, through the gateway."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from podium.control.pipeline_figures import PipelineFigures
from podium.control.rollout_config import RolloutConfig
from podium.examples.builders import write_xgb_example
from podium.examples.recommend import recommend_manifest, write_recommend_example
from podium.package.package import write_manifest
from tests.support.echo_platform import Platform

ONE = RolloutConfig(stages=(100,), num_instances=1, ready_timeout_ms=120_000,
                    analysis_window_ms=0, warm_delay_ms=0)


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[Platform]:
    p = Platform(tmp_path)
    yield p
    p.close()


def test_announce_and_deploy_a_pipeline_that_calls_a_model_through_the_gateway(
        platform: Platform, tmp_path: Path) -> None:
    xgb = write_xgb_example(tmp_path / "packages" / "xgb-example")
    pipeline = write_recommend_example(tmp_path / "packages" / "recommend", "absent-llm")
    manifest = recommend_manifest("absent-llm")
    manifest["steps"] = [s for s in manifest["steps"] if s["name"] != "pick"]
    manifest["steps"][0]["variants"] = [{"name": "control", "weight": 1}]
    manifest["steps"][-1]["args"].pop("picked")
    manifest["gateway_url"] = platform.url  # alone in its instance: models are remote
    write_manifest(pipeline, manifest)

    assert platform.plane.announce(str(xgb))["backend"] == "xgboost"
    assert platform.plane.announce(str(pipeline))["backend"] == "pipeline"
    for name in ("xgb-example", "recommend"):
        rollout = platform.plane.deploy(name, "1", ONE)
        assert platform.wait_done(rollout) == "succeeded", platform.plane.rollout(rollout)

    answer = httpx.post(f"{platform.url}/v2/models/recommend/infer", timeout=60, json={
        "inputs": [{"name": "member_id", "datatype": "BYTES", "shape": [1], "data": ["m5"]}]})
    assert answer.status_code == 200, answer.text
    outputs = {o["name"]: o["data"] for o in answer.json()["outputs"]}
    assert outputs["variant"] == ["control"] and outputs["ranked_by"] == ["xgb-example"]
    assert len(outputs["titles"]) == 3
    assert answer.json()["parameters"]["pipeline_path"] == "live"
    # the console's step figures (`GET /v1/pipelines`), read from the real instance's /metrics
    figures = PipelineFigures(platform.runtime.instances, httpx.Client(timeout=5)).read(
        "recommend", "1")
    assert (figures["num_ready"], figures["num_read"]) == (1, 1), figures
    steps = {s["step"]: s for s in figures["steps"]}
    assert steps["arm"]["num_requests"] == 1 and steps["arm"]["outcomes"] == {"ok": 1}, steps
    assert figures["variants"] == {"control": 1}
    assert all(s["p99_ms"] is not None and s["mean_ms"] is not None for s in steps.values())

    # the plain JSON route goes through the gateway too, and names the version it split to
    plain = httpx.post(f"{platform.url}/pipelines/recommend", timeout=60,
                       json={"member_id": "m5"})
    assert plain.status_code == 200, plain.text
    assert (plain.json()["outputs"]["titles"], plain.json()["model_version"]) == (
        outputs["titles"], "1")
    bad = httpx.post(f"{platform.url}/pipelines/recommend/versions/1", timeout=60,
                     json={"member": "m5"})
    assert bad.status_code == 400 and "'member' is not an input" in bad.json()["error"]


"""`GET /v1/pipelines`: a pipeline version's step figures read from its instances' /metrics."""

from __future__ import annotations

from pathlib import Path

import httpx
from fastapi.testclient import TestClient

from podium.control.actions import Scale, SetSplit
from podium.control.api import create_app
from podium.control.pipeline_figures import PipelineFigures, add_pipeline_routes
from podium.control.runtime.base import READY, InstanceView
from tests.support.control_api import Env
from tests.support.fake_pipeline import StepMetrics, fake_pipeline_instance


def test_steps_variants_and_latency_summed_over_ready_instances(tmp_path: Path) -> None:
    env = Env(tmp_path)
    env.store.announce_package("recs", "1", "pipeline", str(tmp_path), {})
    env.store.announce_package("iris", "1", "xgboost", str(tmp_path), {})
    env.store.apply([Scale("recs", "1", 2), SetSplit("recs", {"1": 100}),
                     Scale("iris", "1", 1), SetSplit("iris", {"1": 100})])
    one, two = StepMetrics(), StepMetrics()
    for i in range(30):  # 30 requests: 20 control, 10 treatment; rank fails once
        variant = "control" if i % 3 else "treatment"
        for m in (one, two) if i < 10 else (one,):
            m.observe("arm", variant, "ok", 0.001)
        one.observe("rank", variant, "error" if i == 0 else "ok", 0.04)
    with fake_pipeline_instance(one) as a, fake_pipeline_instance(two) as b:
        views = [InstanceView(id=f"recs-1-{n}", model="recs", version="1", state=state, url=url,
                              pid=1, num_restarts=0, log_path=None)
                 for n, (url, state) in enumerate([(a, READY), (b, READY), (b, "starting")])]
        app = create_app(env.plane)
        add_pipeline_routes(app, env.store, PipelineFigures(lambda _m, _v: views, httpx.Client(),
                                                            interval_s=0), region="default")
        client = TestClient(app)
        bad = client.get("/v1/pipelines?model=Recs!")
        assert bad.status_code == 400 and "model" in bad.text
        assert client.get("/v1/pipelines?model=iris").json()["versions"] == {}  # not a pipeline
        body = client.get("/v1/pipelines?model=recs").json()
    figures = body["versions"]["1"]
    assert (figures["num_ready"], figures["num_read"]) == (2, 2)
    arm, rank = figures["steps"]
    assert arm["step"] == "arm" and arm["num_requests"] == 40  # 30 + the second instance's 10
    assert figures["variants"] == arm["variants"] == {"control": 26, "treatment": 14}
    assert rank["outcomes"] == {"error": 1, "ok": 29}
    assert 25 < rank["p50_ms"] <= 50 and 25 < rank["p99_ms"] <= 50  # the (25, 50] ms bucket
    assert abs(rank["mean_ms"] - 40) < 1e-6
    env.store.close()

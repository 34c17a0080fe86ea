"""One /metrics: podium's metrics and the engine's, merged, in Prometheus text or OpenMetrics."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI, HTTPException, Request
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY, Counter
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from podium.metrics import exposition, server
from tests.support.subproc import run_python

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


@pytest.fixture
def engine_counter() -> Iterator[Counter]:
    """A vllm:* counter in the default registry, where vLLM registers in single-process mode."""
    counter = Counter("vllm:test_prompt_tokens", "fake", ["model_name", "engine"])
    counter.labels("smol", "0").inc(11)
    yield counter
    REGISTRY.unregister(counter)


def families(body: bytes) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(body.decode())}


def test_render_merges_podium_and_engine_metrics(engine_counter: Counter) -> None:
    server.observe_request("openai", "/v1/completions", "smol", "1", 200, 0.1)
    body, content_type = exposition.render(None)
    assert content_type.startswith("text/plain; version=0.0.4")
    found = families(body)
    assert "podium:requests" in found
    [engine] = [s for s in found["vllm:test_prompt_tokens"] if s.name.endswith("_total")]
    assert engine.labels == {"model_name": "smol", "engine": "0"}
    assert engine.value == 11


def test_openmetrics_when_the_accept_header_asks(engine_counter: Counter) -> None:
    body, content_type = exposition.render(f"{OPENMETRICS},text/plain;q=0.5")
    assert content_type.startswith("application/openmetrics-text; version=1.0.0")
    assert body.endswith(b"# EOF\n")
    # The strict OpenMetrics parser rejects samples that do not match their TYPE line.
    parsed = {f.name: f for f in openmetrics_families(body.decode())}
    [sample] = [s for s in parsed["vllm:test_prompt_tokens"].samples if s.name.endswith("_total")]
    assert sample.name == "vllm:test_prompt_tokens_total"
    assert sample.value == 11
    assert parsed["podium:requests"].type == "counter"


def test_router_serves_metrics_and_honours_auth(engine_counter: Counter) -> None:
    def require_key(request: Request) -> None:
        if request.headers.get("authorization") != "Bearer k":
            raise HTTPException(401, "missing key")

    app = FastAPI()
    app.include_router(exposition.create_router(dependencies=[require_key]))
    client = TestClient(app)
    assert client.get("/metrics").status_code == 401
    response = client.get("/metrics", headers={"Authorization": "Bearer k"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert "vllm:test_prompt_tokens_total" in response.text
    om = client.get("/metrics", headers={"Authorization": "Bearer k", "Accept": OPENMETRICS})
    assert om.headers["content-type"].startswith("application/openmetrics-text")


def test_multiprocess_mode_merges_metrics_written_by_a_child_process(tmp_path: Path) -> None:
    # The child plays the engine: a separate process writing vllm:* metrics to the directory.
    result = run_python(
        f"""
        import json, multiprocessing as mp
        from pathlib import Path
        from podium.metrics.multiproc import prepare_multiproc_dir
        prepare_multiproc_dir(Path({str(tmp_path)!r}))
        from podium.metrics import exposition, server
        from engine_child import write_engine_metrics

        if __name__ == "__main__":
            ctx = mp.get_context("spawn")
            child = ctx.Process(target=write_engine_metrics)
            child.start(); child.join()
            server.observe_request("kserve_http", "/v2/models/{{name}}/infer", "smol", "2", 200, 1)
            server.set_ready(True)
            body, ctype = exposition.render(None)
            print(json.dumps({{"body": body.decode(), "child": child.pid}}))
        """
    )
    found = families(result["body"].encode())
    assert found["vllm:num_requests_running"][0].value == 3
    assert found["vllm:num_requests_running"][0].labels == {"model_name": "smol", "engine": "0"}
    [tokens] = found["vllm:generation_tokens"]
    assert tokens.value == 40
    assert found["podium:ready"][0].value == 1
    assert any(s.value == 1 for s in found["podium:requests"])
    assert "process_resident_memory_bytes" in found


def test_a_booting_instance_exposes_ready_zero(tmp_path: Path) -> None:
    result = run_python(
        f"""
        import json
        from pathlib import Path
        from podium.metrics.multiproc import prepare_multiproc_dir
        prepare_multiproc_dir(Path({str(tmp_path)!r}))
        from podium.metrics import exposition
        print(json.dumps({{"body": exposition.render(None)[0].decode()}}))
        """
    )
    [ready] = families(result["body"].encode())["podium:ready"]
    assert ready.value == 0

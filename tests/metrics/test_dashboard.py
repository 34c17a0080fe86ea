"""The Grafana dashboard: current with its generator, valid PromQL, only names an instance exposes.

Exposed names are podium's registry plus the vLLM exposition captured from a real engine
(fixtures/vllm_engine_metrics.prom, refreshed by tests/support/engine_probe.py --write-fixture).
The same queries are checked against the shared real instance's /metrics in
tests/metrics/test_engine_metrics.py (in CI, as every engine test).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest

from podium.metrics import server
from tests.support.dashboard import DASHBOARD, QUERIES, ROOT, metric_names, sample_names

FIXTURE = Path(__file__).with_name("fixtures") / "vllm_engine_metrics.prom"


def load_builder() -> Any:
    spec = importlib.util.spec_from_file_location("dashboard_build", ROOT / "dashboards/build.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def exposed_names() -> set[str]:
    return sample_names(FIXTURE.read_text()) | set(server.metric_names())


def test_dashboard_json_matches_its_generator() -> None:
    assert (ROOT / "dashboards/podium.json").read_text() == load_builder().render(), (
        "dashboards/podium.json is stale: run python dashboards/build.py"
    )


@pytest.mark.parametrize("expr", [e for _, e in QUERIES], ids=[i for i, _ in QUERIES])
def test_query_parses_and_names_only_exposed_metrics(expr: str) -> None:
    names = metric_names(expr)
    assert names, "a panel query selects no metric"
    unknown = names - exposed_names()
    assert not unknown, f"not exposed by an instance: {sorted(unknown)}"


def test_variables_query_exposed_metrics() -> None:
    exposed = exposed_names()
    for variable in DASHBOARD["templating"]["list"]:
        match = re.match(r"label_values\(([\w:]+)", variable.get("definition", ""))
        if match:
            assert match.group(1) in exposed, variable["name"]


@pytest.mark.parametrize(
    "expr",
    [
        "rate(vllm:gpu_cache_usage_perc[5m])",  # renamed to kv_cache_usage_perc in V1
        "sum(rate(podium:requests[5m]))",  # a counter family without its _total
        "histogram_quantile(0.9, rate(vllm:time_to_first_token_seconds[5m]))",  # no _bucket
    ],
    ids=["renamed", "counter-without-total", "histogram-without-bucket"],
)
def test_validation_rejects_names_an_instance_does_not_expose(expr: str) -> None:
    assert metric_names(expr) - exposed_names()


def test_dashboard_answers_the_operator_questions() -> None:
    used = set().union(*(metric_names(e) for _, e in QUERIES))
    wanted = {
        "throughput": {"vllm:generation_tokens_total", "vllm:prompt_tokens_total"},
        "ttft/itl": {
            "vllm:time_to_first_token_seconds_bucket",
            "vllm:inter_token_latency_seconds_bucket",
        },
        "kv cache": {"vllm:kv_cache_usage_perc"},
        "prefix cache": {"vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"},
        "queue": {"vllm:num_requests_waiting", "vllm:num_requests_running"},
        "errors": {"podium:requests_total"},
        "per version": {"podium:model_loaded"},
    }
    missing = {q: sorted(m - used) for q, m in wanted.items() if m - used}
    assert not missing

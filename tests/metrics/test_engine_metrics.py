"""A real engine: /metrics exposes every vllm:* family the engine registers, with its labels.

On the suite's shared instance (no engine of its own): what vLLM's stat loggers register for
its LLM package comes from `support/engine_families.py` (the engine config built as the boot
builds it, the loggers made as `AsyncLLM` makes them, no engine started), what the instance
wrote from its multiprocess directory, and both are compared with its /metrics.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from podium.metrics.multiproc import LOCK_NAME, default_base
from tests.conftest import LLM
from tests.support.dashboard import QUERIES, metric_names, sample_names
from tests.support.engine_probe import label_names
from tests.support.harness import RunningInstance
from tests.support.polling import eventually

pytestmark = pytest.mark.engine

# The families operators build dashboards and alerts on (issue 4); all must be there.
REQUIRED = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:num_preemptions",
    "vllm:request_success",
)
ENGINE = (("engine", "0"), ("model_name", LLM))


@pytest.fixture(scope="module")
def registered(model_repository: Path, default_model_dir: Path,
               tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """{family: label names} vLLM registers for the shared instance's LLM package (usually
    computed in the background since the session's first test: tests/support/background.py)."""
    from tests.support import engine_families

    return engine_families.read(engine_families.start(
        model_repository / LLM, default_model_dir, tmp_path_factory.mktemp("families")))


def scrape(instance: RunningInstance, accept: str | None = None) -> httpx.Response:
    headers = {"Accept": accept} if accept else {}
    reply = httpx.get(f"{instance.http_url}/metrics", headers=headers, timeout=30)
    assert reply.status_code == 200, reply.text
    return reply


def exposed(instance: RunningInstance) -> dict[str, list[str]]:
    return label_names(text_string_to_metric_families(scrape(instance).text))


def test_every_registered_engine_family_is_exposed_with_its_labels(
        instance: RunningInstance, registered: dict[str, list[str]]) -> None:
    assert len(registered) >= 30, sorted(registered)
    shown = exposed(instance)
    missing = {name: labels for name, labels in registered.items() if name not in shown}
    assert not missing, f"engine families absent from /metrics: {missing}"
    # a labelled family with no sample yet at registration (vllm:lora_requests_info, set on
    # the first step with LoRA on) shows no label names there: only its name is compared
    wrong = {n: (registered[n], shown[n]) for n in registered
             if registered[n] and shown[n] != registered[n]}
    assert not wrong, f"labels differ (registered, exposed): {wrong}"
    assert set(REQUIRED) <= set(shown)


def test_every_family_in_the_multiprocess_directory_is_exposed(
        instance: RunningInstance) -> None:
    directory = default_base().resolve() / f"instance-{instance.process.pid}"
    assert directory.is_dir(), sorted(p.name for p in default_base().iterdir())
    in_directory = label_names(MultiProcessCollector(None, str(directory)).collect())
    assert in_directory, "the engine wrote nothing to the multiprocess directory"
    assert set(in_directory) <= set(exposed(instance))
    files = [p.name for p in directory.iterdir()]
    assert all(f.endswith(".db") for f in files if f != LOCK_NAME), files


def _values(instance: RunningInstance) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(scrape(instance).text) for s in f.samples}


def test_engine_values_reflect_served_requests(instance: RunningInstance) -> None:
    success = ("vllm:request_success_total",
               (ENGINE[0], ("finished_reason", "length"), ENGINE[1]))
    keys = {"tokens": ("vllm:generation_tokens_total", ENGINE),
            "ttft": ("vllm:time_to_first_token_seconds_count", ENGINE), "success": success}
    before = _values(instance)
    for _ in range(2):
        reply = httpx.post(f"{instance.openai_url}/completions", headers=instance.headers(),
                           timeout=120, json={"model": LLM, "prompt": "The capital of France is",
                                              "max_tokens": 8, "ignore_eos": True})
        assert reply.status_code == 200, reply.text
    # the engine's stats reach the counters just after the last token is sent
    delta: Callable[[], dict[str, float]] = lambda: {  # noqa: E731
        name: _values(instance).get(key, 0.0) - before.get(key, 0.0)
        for name, key in keys.items()}
    wanted = {"tokens": 16, "ttft": 2, "success": 2}  # 2 requests x 8 tokens
    eventually(lambda: delta() == wanted, timeout_s=10)
    assert delta() == wanted
    assert _values(instance)[("podium:ready", ())] == 1


def test_openmetrics_exposes_the_same_families(
        instance: RunningInstance, registered: dict[str, list[str]]) -> None:
    reply = scrape(instance, "application/openmetrics-text; version=1.0.0")
    assert reply.headers["content-type"].startswith("application/openmetrics-text")
    assert set(registered) <= set(label_names(openmetrics_families(reply.text)))


def test_every_dashboard_query_names_a_metric_the_instance_exposes(
        instance: RunningInstance) -> None:
    """The Grafana dashboard against the real engine's /metrics, not only the captured
    exposition (tests/metrics/test_dashboard.py): after a served request, every vLLM metric a
    panel selects is one this instance exposes; a Podium one is exposed or declared by Podium's
    registry (a labelled family shows once observed: the dynamic batcher's only where a classic
    model batches)."""
    from podium.metrics import server

    reply = httpx.post(f"{instance.openai_url}/completions", headers=instance.headers(),
                       timeout=120, json={"model": LLM, "prompt": "Dashboards", "max_tokens": 2})
    assert reply.status_code == 200, reply.text
    exposed = sample_names(scrape(instance).text)
    assert {n for n in exposed if n.startswith("vllm:")}, "no vLLM metric exposed"
    exposed |= {n for n in server.metric_names() if n.startswith("podium:")}
    unknown = {title: sorted(metric_names(expr) - exposed) for title, expr in QUERIES
               if metric_names(expr) - exposed}
    assert QUERIES and not unknown, unknown

"""A real engine: /metrics exposes every vllm:* family the engine registers, with its labels."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from tests.support.engine_probe import label_names

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


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("metrics")
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    proc = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).parents[1] / "support" / "engine_probe.py"),
            str(default_model_dir),
            str(base),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.engine
def test_every_registered_engine_family_is_exposed_with_its_labels(probe: dict) -> None:
    registered = probe["registered"]
    assert len(registered) >= 30, sorted(registered)
    exposed = label_names(text_string_to_metric_families(probe["text"]))
    missing = {name: labels for name, labels in registered.items() if name not in exposed}
    assert not missing, f"engine families absent from /metrics: {missing}"
    wrong = {n: (registered[n], exposed[n]) for n in registered if exposed[n] != registered[n]}
    assert not wrong, f"labels differ (registered, exposed): {wrong}"
    assert set(REQUIRED) <= set(exposed)


@pytest.mark.engine
def test_every_family_in_the_multiprocess_directory_is_exposed(probe: dict) -> None:
    exposed = label_names(text_string_to_metric_families(probe["text"]))
    assert probe["in_directory"], "the engine wrote nothing to the multiprocess directory"
    assert set(probe["in_directory"]) <= set(exposed)
    assert all(f.endswith(".db") for f in probe["files"] if f != "instance.lock")


@pytest.mark.engine
def test_engine_values_reflect_served_requests(probe: dict) -> None:
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(probe["text"])
        for s in f.samples
    }
    engine = (("engine", "0"), ("model_name", "smol"))
    assert samples[("vllm:generation_tokens_total", engine)] == 16  # 2 requests x 8 tokens
    assert samples[("vllm:time_to_first_token_seconds_count", engine)] == 2
    assert (
        samples[
            ("vllm:request_success_total", (*engine[:1], ("finished_reason", "length"), engine[1]))
        ]
        == 2
    )
    assert samples[("podium:ready", ())] == 1


@pytest.mark.engine
def test_openmetrics_exposes_the_same_families(probe: dict) -> None:
    assert probe["openmetrics_content_type"].startswith("application/openmetrics-text")
    om = label_names(openmetrics_families(probe["openmetrics"]))
    assert set(probe["registered"]) <= set(om)

"""The default model packaged at int8 serves on the real engine, close to the full-precision
model: its log-likelihood of a fixed prompt set and its greedy continuations are measured
against the shared instance's (the default package, `precision: auto`: bf16, or fp32 on a CPU
without bf16 instructions; tests/support/quality.py; the full table is bench/precision.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import LLM
from tests.support.harness import RunningInstance, running_instance
from tests.support.quality import closeness, score

pytestmark = pytest.mark.engine
INT8 = "smollm2-int8"


@pytest.fixture(scope="module")
def int8_package(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Path:
    """The default LLM's package with precision int8, its W8A8 checkpoint in the cache."""
    from podium.package.cache import ModelCache
    from podium.package.defaults import default_llm_manifest
    from podium.package.package import open_package, write_manifest

    package = write_manifest(tmp_path_factory.mktemp("int8") / INT8,
                             {**default_llm_manifest(), "name": INT8, "precision": "int8"})
    ModelCache().materialize(open_package(package.root))  # as `podium announce` would
    return package.root


def test_an_int8_package_serves_close_to_bf16(instance: RunningInstance, int8_package: Path,
                                              tmp_path: Path) -> None:
    reference = score(instance.openai_url, LLM, headers=instance.headers())
    with running_instance([str(int8_package)], tmp_path / "int8.log") as int8:
        scored = score(int8.openai_url, INT8)
        log = int8.log()
    # vLLM names the scheme it serves the Linears with ("Selected <kernel> for <scheme>")
    assert "for CompressedTensorsW8A8Int8" in log, log[-3000:]
    close = closeness(scored, reference)
    report = json.dumps(close.__dict__)
    # measured on this machine kind (docs/benchmarks.md, "Precision"): Δ loglik +0.025,
    # mean |Δ| 0.29 nats/token, common greedy prefix 4.8 of 24; a broken checkpoint (wrong
    # scales, saturated GEMMs) is off by nats per token and diverges at the first token
    assert abs(close.loglik_delta) < 0.15, report
    assert close.mean_abs_token_delta < 0.45, report
    assert close.mean_common_prefix >= 2, report

"""The default model packaged at int8 serves on the real engine, close to the full-precision
model: its log-likelihood of a fixed prompt set and its greedy continuations are measured
against the shared instance's (the default package, `precision: auto`: bf16, or fp32 on a CPU
without bf16 instructions; tests/support/quality.py; the full table is bench/precision.py).

Its instance is also the suite's preloader-bypass case (one engine start for both): its
preloader is killed before the engine starts, and it must boot anyway, spawning its engine
the usual way with a warning (the preloaded case is the session instance,
tests/preload/test_preloaded_real.py). Which way the engine process started does not change
what it computes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import LLM
from tests.support.harness import RunningInstance
from tests.support.int8_instance import INT8
from tests.support.preloader import assert_bypassed
from tests.support.quality import closeness, score

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def int8_instance(tmp_path_factory: pytest.TempPathFactory,
                  default_model_dir: Path) -> Iterator[RunningInstance]:
    """The int8 package served, its preloader killed before its engine started (usually booted
    in the background since the session's first test: tests/support/int8_instance.py)."""
    from tests.support import int8_instance as int8

    assert default_model_dir.is_dir()
    running = int8.start(tmp_path_factory.mktemp("int8"))
    try:
        running.wait_ready()
        yield running
    finally:
        int8.stop()


def test_a_preloader_killed_before_the_engine_starts_is_bypassed(
        int8_instance: RunningInstance) -> None:
    assert_bypassed(int8_instance)
    r = httpx.post(f"{int8_instance.openai_url}/chat/completions", timeout=120,
                   json={"model": INT8, "max_tokens": 2,
                         "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 200, r.text


def test_an_int8_package_serves_close_to_bf16(instance: RunningInstance,
                                              int8_instance: RunningInstance) -> None:
    reference = score(instance.openai_url, LLM, headers=instance.headers())
    scored = score(int8_instance.openai_url, INT8)
    log = int8_instance.log()
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

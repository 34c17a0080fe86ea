"""`podium top` arithmetic: rates and quantiles computed as PromQL would."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from podium.top import stats
from podium.top.snapshot import parse
from tests.support.fake_metrics import exposition

INF = math.inf


@pytest.mark.parametrize(
    ("q", "buckets", "expected"),
    [
        (0.5, {0.1: 10, 0.2: 10, INF: 10}, 0.05),  # interpolate inside the first bucket from 0
        (0.5, {0.1: 0, 0.2: 10, INF: 10}, 0.15),
        (0.99, {0.1: 90, 0.5: 100, INF: 100}, 0.1 + 0.4 * 0.9),
        (0.99, {0.1: 50, 0.5: 50, INF: 100}, 0.5),  # in +Inf: the last finite bound
        (0.5, {0.1: 0, INF: 0}, None),  # no observations in the window
        (0.5, {}, None),
    ],
    ids=["first-bucket", "second-bucket", "p99", "overflow", "empty-window", "no-histogram"],
)
def test_quantile_matches_histogram_quantile(
    q: float, buckets: dict, expected: float | None
) -> None:
    result = stats.quantile(q, buckets)
    assert result == (None if expected is None else pytest.approx(expected))


def test_counter_reset_counts_from_zero() -> None:
    assert stats.rate(100, 130, 2) == 15
    assert stats.rate(100, 30, 2) == 15  # restarted instance: 30 since the restart


def test_row_over_an_interval() -> None:
    before, after = parse(exposition(10), 100.0), parse(exposition(12), 102.0)
    row = stats.row(before, after)
    assert row.requests_per_s == pytest.approx(4)
    assert row.generated_per_s == pytest.approx(100)
    assert row.prompt_per_s == pytest.approx(250)
    assert row.ttft_p50_s == pytest.approx(0.05 + 0.05 * 0.5 / 0.9)
    assert row.ttft_p99_s == pytest.approx(0.38)
    assert (row.kv_cache_perc, row.running, row.waiting, row.ready) == (0.42, 3, 1, True)


def test_first_scrape_shows_gauges_but_no_rates() -> None:
    row = stats.row(None, parse(exposition(5), 1.0))
    assert row.requests_per_s is None and row.ttft_p50_s is None
    assert row.running == 3 and row.kv_cache_perc == 0.42


def test_total_sums_rates_and_merges_latency() -> None:
    pair = (parse(exposition(10), 100.0), parse(exposition(12), 102.0))
    total = stats.total([pair, pair])
    assert total.generated_per_s == pytest.approx(200)
    assert total.running == 6
    assert total.ttft_p99_s == pytest.approx(0.38)


def test_bare_vllm_counts_finished_requests() -> None:
    text = (
        "# TYPE vllm:request_success counter\n"
        'vllm:request_success_total{finished_reason="stop"} 5\n'
        'vllm:request_success_total{finished_reason="length"} 2\n'
    )
    assert parse(text, 0).requests == 7


def test_registering_top_does_not_import_prometheus_client() -> None:
    # `podium` registers `top` before `serve` prepares the metrics directory; importing
    # prometheus_client that early would fix it in single-process mode for the whole instance.
    code = (
        "import argparse, sys; from podium.top import register; "
        "register(argparse.ArgumentParser().add_subparsers()); "
        "print(sorted(m for m in ('prometheus_client', 'httpx', 'rich') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_reads_a_real_engine_exposition() -> None:
    # Captured from vLLM 0.32 after 3 requests of 8 tokens (tests/metrics/fixtures).
    fixture = Path(__file__).parents[1] / "metrics" / "fixtures" / "vllm_engine_metrics.prom"
    snap = parse(fixture.read_text(), 0)
    assert (snap.requests, snap.generated_tokens, snap.prompt_tokens) == (3, 24, 12)
    assert snap.ttft_buckets[math.inf] == 3
    assert (snap.kv_cache_perc, snap.running, snap.waiting) == (0.0, 0, 0)


def _with_adapter(elapsed: float) -> str:
    """An instance of `smol` that also answered LoRA adapter `tone` (2 requests/s)."""
    labels = 'model="tone",version="2",protocol="openai",endpoint="/v1/completions",code="200"'
    return exposition(elapsed).replace(
        "# TYPE podium:ready gauge",
        f"podium:requests_total{{{labels}}} {2.0 * elapsed}\n"
        "# TYPE podium:model_loaded gauge\n"
        'podium:model_loaded{model="smol",version="1"} 1.0\n'
        "# TYPE podium:ready gauge")


def test_adapters_are_shown_under_the_instance_of_their_base() -> None:
    from rich.console import Console

    from podium.top import view

    before, after = parse(_with_adapter(10), 100.0), parse(_with_adapter(12), 102.0)
    assert stats.adapter_rows(before, after) == [("tone", stats.AdapterRow(pytest.approx(2)))]
    assert stats.row(before, after).requests_per_s == pytest.approx(6)  # base and adapter
    assert stats.adapter_rows(None, after) == [("tone", stats.AdapterRow(None))]
    # an instance that reports no loaded model (a bare vLLM) shows no adapter lines
    assert stats.adapter_rows(before, parse(exposition(12), 102.0)) == []
    rows = [("http://a", stats.row(before, after)),
            ("  └ tone (LoRA)", *[r for _n, r in stats.adapter_rows(before, after)])]
    console = Console(width=160)
    with console.capture() as captured:
        console.print(view.table(rows, None, 2.0))
    lines = captured.get().splitlines()
    [base] = [i for i, line in enumerate(lines) if "http://a" in line]
    assert "└ tone (LoRA)" in lines[base + 1] and "2.00" in lines[base + 1]

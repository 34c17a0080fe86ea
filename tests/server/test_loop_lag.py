"""`podium:event_loop_lag_seconds`: how late the server's event loop runs what is due, the
share of every reported wait that is the loop's own queue."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from podium.metrics.server import REGISTRY
from podium.server.loop_lag import probe_loop_lag
from tests.support.harness import running_instance

FAMILY = "podium:event_loop_lag_seconds"


def _late(bound: str) -> float:
    """Probes recorded above `bound` seconds so far."""
    count = REGISTRY.get_sample_value(FAMILY + "_count") or 0.0
    return count - (REGISTRY.get_sample_value(FAMILY + "_bucket", {"le": bound}) or 0.0)


async def test_a_blocked_loop_is_recorded_as_late_by_about_as_long() -> None:
    before_late = _late("0.03")
    before_count = REGISTRY.get_sample_value(FAMILY + "_count") or 0.0
    probe = asyncio.create_task(probe_loop_lag(0.01))
    try:
        await asyncio.sleep(0.05)  # a few probes on time
        time.sleep(0.08)  # a callback that holds the loop: the probe due meanwhile is late
        await asyncio.sleep(0.05)
    finally:
        probe.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await probe
    assert REGISTRY.get_sample_value(FAMILY + "_count") - before_count >= 3
    assert _late("0.03") - before_late >= 1, "the blocked loop's probe was not recorded late"


def test_a_serving_instance_exposes_its_loop_lag(tmp_path: Path,
                                                 classic_examples_dir: Path) -> None:
    def probes(url: str) -> float:
        text = httpx.get(f"{url}/metrics", timeout=30).text
        for family in text_string_to_metric_families(text):
            if family.name == FAMILY:
                return next(s.value for s in family.samples if s.name == FAMILY + "_count")
        raise AssertionError(f"{FAMILY} is not in /metrics")

    with running_instance(["--repository", str(classic_examples_dir)],
                          tmp_path / "serve.log") as inst:
        first = probes(inst.http_url)
        time.sleep(1.0)  # ten probes' worth
        assert probes(inst.http_url) > first
        # the server keeps serving inference beside the probe
        assert httpx.get(f"{inst.http_url}/v2/health/ready", timeout=30).status_code == 200

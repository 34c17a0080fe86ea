"""End to end, two regions on this machine: two local runtimes of real `podium serve` instances
(the Python backend), two real gateways, one control loop; 16 clients load both gateways while
a good version rolls out region by region and a broken one fails in the first region."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.echo_platform import Load, write_echo
from tests.support.two_regions import BAKE_MS, NAMES, STAGED, TwoRegions


@pytest.fixture
def regions(tmp_path: Path) -> Iterator[TwoRegions]:
    r = TwoRegions(tmp_path)
    yield r
    r.close()


def _step_at(steps: list, text: str) -> int:
    return next(s.at_ms for s in steps if text in s.note)


def test_two_regions_roll_one_after_the_other_and_a_broken_version_stops_in_the_first(
        regions: TwoRegions, tmp_path: Path) -> None:
    for version, params in (("1", {}), ("2", {}), ("3", {"fail": True})):
        regions.plane.announce(str(write_echo(tmp_path / "packages", version, **params)))
    regions.serve_v1()
    loads = {n: Load(regions.served[n].url, num_clients=8) for n in NAMES}  # 16 clients
    for load in loads.values():
        load.start()
    for load in loads.values():
        load.wait_requests(100)

    good = regions.plane.deploy("echo", "2", STAGED)
    assert regions.wait_done(good) == "succeeded", regions.store.get_rollout(good).reason
    steps = regions.store.rollout_steps(good)
    a_done = _step_at(steps, "a: warm delay over")
    b_start = _step_at(steps, "b starts")
    assert b_start - a_done >= BAKE_MS  # b started only once a finished and baked
    assert [s for s in steps if s.at_ms < b_start and "b:" in s.note] == []
    for name in NAMES:
        assert regions.store.splits("echo", name) == {"2": 100}
        assert regions.store.aliases("echo", name) == {"latest": "2"}

    broken = regions.plane.deploy("echo", "3", STAGED)
    assert regions.wait_done(broken) == "rolled_back"
    record = regions.store.get_rollout(broken)
    # at the first stage, unless a loaded machine gave v3 fewer than min_requests in its window
    assert re.match(r"a: analysis failed at (50|100)%: error rate 100\.0% vs 0\.0%",
                    record.reason), record.reason
    # v3 never reached b: no deployment, no instance, no route there
    assert [d.version for d in regions.store.list_deployments("echo", region="b")] == ["1", "2"]
    assert regions.store.list_instances("echo", "3", region="b", include_stopped=True) == []
    assert regions.store.splits("echo", "b") == {"2": 100}
    for load in loads.values():
        load.wait_requests(len(load.results) + 100)
    results = {n: load.stop() for n, load in loads.items()}

    for name, got in results.items():
        assert [r for r in got if r.status != 200] == [], name  # 0 failed requests
        assert {r.version for r in got[-50:]} == {"2"}, name
    assert {r.version for r in results["b"]} == {"1", "2"}
    # every request v3 failed in a was answered by v2 instead
    num_requests, num_errors, _ = regions.gateways["a"].stats.totals[("echo", "3")]
    assert num_errors == num_requests >= STAGED.min_requests
    assert ("echo", "3") not in regions.gateways["b"].stats.totals

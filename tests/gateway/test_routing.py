"""The route table: versions by split or alias, instances by health and load."""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx
import pytest

from podium.errors import NotFound, Unavailable
from podium.gateway.health import check_once
from podium.routes.table import Endpoint, RouteTable
from tests.support.servers import Served, closed_port_url, upstream


def _table() -> RouteTable:
    table = RouteTable()
    for version in ("1", "2"):
        table.add_endpoint("iris", version, Endpoint(f"{version}a", f"http://h/{version}a"))
        table.add_endpoint("iris", version, Endpoint(f"{version}b", f"http://h/{version}b"))
    return table


def test_split_proportions_are_exact_and_interleaved() -> None:
    table = _table()
    table.set_split("iris", {"1": 75, "2": 25})
    picks = [table.resolve("iris", None)[0] for _ in range(8)]
    assert Counter(picks) == {"1": 6, "2": 2}
    assert picks[:4].count("2") == 1  # spread out, not bunched at the end


def test_a_version_without_usable_instances_is_skipped_by_the_split() -> None:
    table = _table()
    table.set_split("iris", {"1": 50, "2": 50})
    for endpoint_id in ("2a", "2b"):
        table.drain(endpoint_id)
    assert {table.resolve("iris", None)[0] for _ in range(6)} == {"1"}


def test_without_a_split_the_latest_alias_takes_unversioned_traffic() -> None:
    table = _table()
    table.set_alias("iris", "latest", "2")
    assert table.resolve("iris", None)[0] == "2"
    assert table.resolve("iris", "latest")[0] == "2"


def test_least_in_flight_instance_is_chosen() -> None:
    table = _table()
    table.endpoint("1a").num_in_flight = 3
    assert {table.resolve("iris", "1")[1].id for _ in range(4)} == {"1b"}


def test_excluded_and_unhealthy_instances_are_not_chosen() -> None:
    table = _table()
    table.endpoint("1a").healthy = False
    assert table.resolve("iris", "1")[1].id == "1b"
    with pytest.raises(Unavailable, match="iris@1 has no ready instance"):
        table.resolve("iris", "1", exclude=frozenset({"1b"}))


def test_unknown_model_and_version_name_what_exists() -> None:
    table = _table()
    with pytest.raises(NotFound, match="deployed: iris"):
        table.resolve("ghost", None)
    with pytest.raises(NotFound, match="versions: 1, 2"):
        table.resolve("iris", "3")


def test_removed_endpoint_takes_no_more_traffic() -> None:
    table = _table()
    table.remove_endpoint("1a")
    assert {table.resolve("iris", "1")[1].id for _ in range(4)} == {"1b"}


def test_health_check_marks_ready_and_unreachable_endpoints() -> None:
    served = Served(upstream("1"))
    try:
        table = RouteTable()
        good = Endpoint("good", served.url, healthy=False)
        dead = Endpoint("dead", closed_port_url())
        table.add_endpoint("iris", "1", good)
        table.add_endpoint("iris", "1", dead)

        async def check() -> None:
            async with httpx.AsyncClient(timeout=2) as client:
                await check_once(table, client)

        asyncio.run(check())
        assert (good.healthy, dead.healthy) == (True, False)
    finally:
        served.stop()

"""Idle versioned deployments are collected after a TTL; latest and busy ones never."""

from __future__ import annotations

from podium.control.gc import VersionUsage, idle_versions


def test_idle_versions_past_ttl_are_collected_but_never_latest_or_busy() -> None:
    usages = [VersionUsage("1", last_request_ms=1_000), VersionUsage("2", last_request_ms=9_000),
              VersionUsage("3", last_request_ms=0, deployed_ms=500),
              VersionUsage("4", last_request_ms=100), VersionUsage("5", last_request_ms=0)]
    got = idle_versions(usages, latest="5", busy={"4"}, now_ms=10_000, ttl_ms=5_000)
    assert got == ["1", "3"]


def test_nothing_is_collected_within_the_ttl() -> None:
    usages = [VersionUsage("1", last_request_ms=6_000)]
    assert idle_versions(usages, latest=None, busy=set(), now_ms=10_000, ttl_ms=5_000) == []
    assert idle_versions(usages, latest=None, busy=set(), now_ms=11_001, ttl_ms=5_000) == ["1"]

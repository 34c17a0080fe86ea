"""Versioned deployments: which idle versions to collect. Pure; the caller scales them to 0."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VersionUsage:
    """One running version of a model and when it last served a request."""

    version: str
    last_request_ms: int
    """0 when it never served one; then its deployment time counts instead."""
    deployed_ms: int = 0


def idle_versions(usages: list[VersionUsage], *, latest: str | None, busy: set[str],
                  now_ms: int, ttl_ms: int) -> list[str]:
    """Versions idle longer than `ttl_ms`; never `latest` nor one a rollout is using."""
    collected = []
    for usage in usages:
        if usage.version == latest or usage.version in busy:
            continue
        last_seen = max(usage.last_request_ms, usage.deployed_ms)
        if now_ms - last_seen > ttl_ms:
            collected.append(usage.version)
    return sorted(collected)

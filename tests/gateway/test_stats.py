"""Request stats read by the control loop's thread while the gateway's thread writes them."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator

import pytest

from podium.routes.stats import Outcome, VersionStats


@pytest.fixture
def fast_switching() -> Iterator[None]:
    """Switch threads every few microseconds, as a loaded `podium up` does."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def test_health_is_read_while_requests_are_recorded(fast_switching: None) -> None:
    """The control loop reads health while the gateway appends outcomes: no
    `deque mutated during iteration`, and every reading is a consistent window."""
    stats = VersionStats(max_samples=50_000)
    for i in range(20_000):
        stats.record("echo", "1", Outcome(at_ms=i, latency_ms=1.0, ok=True))
    done = threading.Event()

    def gateway() -> None:
        i = 20_000
        while not done.is_set():
            stats.record("echo", "1", Outcome(at_ms=i, latency_ms=5.0, ok=i % 10 != 0))
            i += 1

    writer = threading.Thread(target=gateway)
    writer.start()
    try:
        readings = [stats.health("echo", "1", since_ms=0) for _ in range(50)]
        last = [stats.last_request_ms("echo", "1") for _ in range(50)]
    finally:
        done.set()
        writer.join()
    assert all(h.num_requests >= 20_000 for h in readings)
    assert all(0 <= h.num_errors <= h.num_requests for h in readings)
    assert last == sorted(last) and last[0] >= 19_999
    final = stats.health("echo", "1", since_ms=0)
    assert final.num_requests == min(50_000, stats.totals[("echo", "1")][0])

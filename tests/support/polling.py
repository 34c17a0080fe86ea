"""Waiting on a condition and reading one Prometheus sample, for tests of live servers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families


def eventually(condition: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    """True once `condition` holds (polled every 10 ms), False after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


async def async_eventually(condition: Callable[[], object], timeout_s: float = 5.0) -> bool:
    """`eventually` inside an event loop: True once `condition` holds, yielding to the loop
    between checks (a task or thread the test waits for keeps running), False after
    `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.005)
    return True


def metric_sample(client: httpx.Client, name: str, **labels: str) -> float | None:
    """The value of one sample on the server's `/metrics`, parsed as Prometheus parses it."""
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return s.value
    return None

"""Load loops: closed (N clients, each sends when its last answer came) and open (Poisson
arrivals at a set rate, whatever the answers do). Both are asyncio, bounded in time and in
count, and refuse any address but loopback: a bench never loads someone else's server."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar
from urllib.parse import urlsplit

import httpx

T = TypeVar("T")

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
MAX_SECONDS = 3600.0
"""No loop runs longer than this, whatever it is asked."""


def check_loopback(url: str) -> str:
    """`url` itself; ValueError unless it points at this machine's loopback."""
    host = urlsplit(url if "//" in url else f"//{url}").hostname
    if host not in LOOPBACK:
        raise ValueError(f"benchmarks load loopback only, not {url!r}")
    return url


def loopback_client(base_url: str = "", timeout: float = 600, **kwargs: object
                    ) -> httpx.AsyncClient:
    """An httpx client with no connection cap (the loop's concurrency is the cap)."""
    if base_url:
        check_loopback(base_url)
    return httpx.AsyncClient(base_url=base_url, timeout=timeout,
                             limits=httpx.Limits(max_connections=None,
                                                 max_keepalive_connections=None),
                             **kwargs)  # type: ignore[arg-type]


@dataclass
class Sample(Generic[T]):
    """One call: when it was sent (time.monotonic), how long it took, what it returned."""

    sent: float
    seconds: float
    value: T


async def _timed(call: Callable[[], Awaitable[T]]) -> Sample[T]:
    sent, started = time.monotonic(), time.perf_counter()
    value = await call()
    return Sample(sent, time.perf_counter() - started, value)


async def closed_loop(call: Callable[[], Awaitable[T]], concurrency: int, *,
                      seconds: float | None = None, requests: int | None = None,
                      warmup_s: float = 0.0, warmup_requests: int = 0,
                      stop: Callable[[], bool] | None = None) -> list[Sample[T]]:
    """`concurrency` workers, each awaiting `call()` again as soon as it returns, until
    `seconds` pass, `requests` calls were started, or `stop()` is true (at least one of
    `seconds`/`requests` is required; MAX_SECONDS bounds it anyway). A warm-up (`warmup_s`
    seconds, then `warmup_requests` calls) runs first and is not returned. An exception from
    `call` ends the run: a call that should count failures returns them instead."""
    if seconds is None and requests is None:
        raise ValueError("a closed loop needs seconds or requests")
    if warmup_s > 0:
        await closed_loop(call, concurrency, seconds=warmup_s)
    if warmup_requests > 0:
        await closed_loop(call, concurrency, requests=warmup_requests)
    samples: list[Sample[T]] = []
    deadline = time.monotonic() + min(seconds if seconds is not None else MAX_SECONDS,
                                      MAX_SECONDS)
    budget = requests if requests is not None else -1

    async def worker() -> None:
        nonlocal budget
        while time.monotonic() < deadline and budget != 0 and not (stop and stop()):
            budget -= 1
            samples.append(await _timed(call))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return samples


async def open_loop(call: Callable[[], Awaitable[T]], phases: list[tuple[float, float]], *,
                    seed: int = 0, max_requests: int = 1_000_000) -> list[Sample[T]]:
    """Poisson arrivals in `phases` of (rate per second, seconds), one after another; each
    arrival is a task of its own, so a slow server does not slow the offered rate. At most
    `max_requests` are sent (and MAX_SECONDS in all); the answers of all are awaited."""
    rng = random.Random(seed)
    tasks: list[asyncio.Task[Sample[T]]] = []
    for rate, seconds in phases:
        end = time.monotonic() + min(seconds, MAX_SECONDS)
        while (now := time.monotonic()) < end and len(tasks) < max_requests:
            tasks.append(asyncio.create_task(_timed(call)))
            await asyncio.sleep(max(0.0, rng.expovariate(rate) - (time.monotonic() - now)))
    return list(await asyncio.gather(*tasks))

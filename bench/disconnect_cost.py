"""What watching for a client's disconnect costs a fast request, in process, A/B alternated.

    python -m bench.disconnect_cost --requests 20000 --concurrency 32 --rounds 3

Each "request" is a short piece of work (two event-loop hops, like a batched classic model)
behind a uvicorn-like `receive()` (an `asyncio.Event` set on disconnect), driven by
`--concurrency` tasks in a closed loop. Variants: `none` (a plain await), `two-tasks` (the
watcher before: the work and a `receive()` watcher as two tasks under `asyncio.wait`), `late`
(`podium.cancellation.unless_client_leaves`: the work in the request's task, a watcher only
after `WATCH_AFTER_S`). Prints microseconds per request for each round and the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from podium.cancellation import unless_client_leaves


class FakeConnection:
    """uvicorn's receive() after the body was read: blocks until the client disconnects."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        await self.event.wait()
        return {"type": "http.disconnect"}


async def work() -> int:
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    return 1


async def none(connection: FakeConnection) -> int:
    return await work()


async def two_tasks(connection: FakeConnection) -> int:
    task = asyncio.ensure_future(work())
    watcher = asyncio.create_task(_disconnected(connection))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        return -1
    finally:
        watcher.cancel()


async def _disconnected(connection: FakeConnection) -> None:
    while (await connection.receive())["type"] != "http.disconnect":
        await asyncio.sleep(0.05)


async def late(connection: FakeConnection) -> int:
    return await unless_client_leaves(connection.receive, work())


VARIANTS: dict[str, Callable[[FakeConnection], Awaitable[int]]] = {
    "none": none, "two-tasks": two_tasks, "late": late}


async def run(variant: Callable[[FakeConnection], Awaitable[int]], requests: int,
              concurrency: int) -> float:
    """Microseconds per request."""
    remaining = requests

    async def client() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await variant(FakeConnection())

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return (time.perf_counter() - started) / requests * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for round_ in range(args.rounds):
        for name, variant in VARIANTS.items():  # alternated: the machine is noisy
            us = asyncio.run(run(variant, args.requests, args.concurrency))
            results[name].append(us)
            print(f"round {round_ + 1} {name:<10} {us:7.2f} us/request")
    base = statistics.median(results["none"])
    for name, values in results.items():
        median = statistics.median(values)
        print(f"median {name:<10} {median:7.2f} us/request  (+{median - base:6.2f} over none)")


if __name__ == "__main__":
    main()

"""The front's own cost per request, in process: no HTTP, no client, only the pipeline.

    python -m bench.pipeline_inprocess [--requests 1000] [--concurrency 1 32] [--rounds 3]

Loads `bench.pipeline_overhead`'s repository (xgb-example and `recommend`'s control arm) into
one `ModelRepository` in this process, with logging set up as `podium serve` sets it (INFO to
stderr), and sends `recommend` requests through `ModelRepository.infer` (the path every
frontend takes) `--concurrency` at a time. Prints the best and median of `--rounds` rounds:
requests per second and milliseconds of this process per request. Run it with another
checkout's `src` first on `PYTHONPATH` to compare two versions of the code on one machine.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import median
from bench.pipeline_overhead import write_repository


async def rounds(requests: int, concurrency: int, num_rounds: int) -> list[float]:
    """Requests per second of each round."""
    import numpy as np

    from podium.backends.base import InferenceRequest, Tensor
    from podium.repository import ModelRepository, scan_repository

    root = write_repository(Path(tempfile.mkdtemp()))
    repository = ModelRepository(root=root)
    repository.register(scan_repository(root))
    await repository.load_model("xgb-example")
    await repository.load_model("recommend")

    def request(i: int) -> InferenceRequest:
        member = np.empty((1,), dtype=object)
        member[0] = f"m{i % 200}".encode()
        return InferenceRequest(inputs={"member_id": Tensor("member_id", "BYTES", member)})

    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with gate:
            await repository.infer("recommend", None, lambda _backend: request(i))

    try:
        await asyncio.gather(*(one(i) for i in range(100)))  # warm-up
        rates = []
        for _ in range(num_rounds):
            started = time.perf_counter()
            await asyncio.gather(*(one(i) for i in range(requests)))
            rates.append(requests / (time.perf_counter() - started))
        return rates
    finally:
        await repository.unload_all()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from podium.server.logs import configure_logging

    configure_logging()  # as `podium serve` does: INFO and up to stderr
    import podium

    print(f"podium from {Path(podium.__file__).parent}")
    print(f"{'c':>4}{'best req/s':>12}{'median req/s':>14}{'ms/request':>12}")
    for concurrency in args.concurrency:
        rates = asyncio.run(rounds(args.requests, concurrency, args.rounds))
        print(f"{concurrency:>4}{max(rates):>12.0f}{median(rates):>14.0f}"
              f"{1000 / median(rates):>12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

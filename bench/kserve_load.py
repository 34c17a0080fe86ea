"""A closed-loop KServe load: N concurrent clients, batch-1 requests, for T seconds.

Uses the asyncio flavours of the real tritonclient (HTTP and gRPC), as users would, driven by
the harness's closed loop.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import numpy as np

from bench.harness import check_loopback, closed_loop, percentile


@dataclass
class LoadResult:
    """Throughput and latency of one run."""

    protocol: str
    concurrency: int
    requests: int
    seconds: float
    latencies_s: list[float]

    @property
    def throughput(self) -> float:
        return self.requests / self.seconds

    def percentile_ms(self, q: float) -> float:
        return percentile(self.latencies_s, q) * 1000

    def row(self, server: str) -> str:
        return (f"{server:<8} {self.protocol:<5} c={self.concurrency:<3} "
                f"{self.throughput:9.1f} req/s  p50 {self.percentile_ms(50):7.2f} ms  "
                f"p99 {self.percentile_ms(99):7.2f} ms  (n={self.requests})")


async def run_load(url: str, protocol: str, model: str, input_name: str, features: np.ndarray,
                   *, concurrency: int, seconds: float, warmup_s: float = 1.0,
                   output_name: str | None = None, binary: bool = True) -> LoadResult:
    """Drive `model` with one-row requests from `features` for `seconds` after a warm-up
    (the harness's closed loop; rows taken in turn).

    `binary=False` sends and asks for JSON tensors over HTTP (for servers without Triton's
    binary extension); it needs `output_name`.
    """
    check_loopback(url)
    if protocol == "http":
        import tritonclient.http.aio as client_module

        client = client_module.InferenceServerClient(url, conn_limit=concurrency)
    else:
        import tritonclient.grpc.aio as client_module

        client = client_module.InferenceServerClient(url)
    rows = itertools.count()

    async def call() -> object:
        row = features[next(rows) % len(features)][None]
        tensor = client_module.InferInput(input_name, list(row.shape), "FP32")
        outputs, headers = None, None
        if protocol == "http":
            # FastAPI servers (MLServer) answer 422 to a JSON body without its content type
            headers = None if binary else {"Content-Type": "application/json"}
            tensor.set_data_from_numpy(row, binary_data=binary)
            if output_name is not None:
                outputs = [client_module.InferRequestedOutput(output_name, binary_data=binary)]
        else:
            tensor.set_data_from_numpy(row)
        return await client.infer(model, [tensor], outputs=outputs, headers=headers)

    try:
        if warmup_s > 0:
            await closed_loop(call, concurrency, seconds=warmup_s)
        started = time.perf_counter()
        samples = await closed_loop(call, concurrency, seconds=seconds)
        elapsed = time.perf_counter() - started
    finally:
        await client.close()
    return LoadResult(protocol, concurrency, len(samples), elapsed,
                      [sample.seconds for sample in samples])

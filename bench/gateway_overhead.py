"""Gateway overhead: the same load straight to an instance vs through the gateway, in one run.

    python -m bench.gateway_overhead [--requests 2000] [--concurrency 1] [--rounds 4]

Starts one `podium serve` instance of xgb-example and one gateway process routing to it, then
sends the same KServe v2 requests (HTTP and gRPC) both ways, in alternating blocks (direct,
gateway, gateway, direct, ... so drift on a shared machine hits both paths alike). Prints median
and p99 latency per path, the added median latency, and the gateway process's CPU time per
request (utime + stime from /proc, so it is the proxy's own cost, whatever else runs); then the
added median and the gateway/direct ratio of each direct+gateway block pair, with their spread.
The load is the harness's closed loop (asyncio: httpx, tritonclient.grpc.aio).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np

from bench.harness import (
    Spread,
    closed_loop,
    cpu_seconds,
    free_port,
    loopback_client,
    median,
    module_command,
    percentile,
    serve,
)

FEATURES = [[0.1 * i for i in range(20)]]
WARMUP = 50
"""Calls before each block (not timed): warm connections and caches."""


def run_gateway(http_port: int, grpc_port: int, upstream_http: str, upstream_grpc: str) -> None:
    """Child mode: a gateway with one static endpoint (what `podium up` builds dynamically)."""
    import uvicorn

    from podium.gateway.grpc_proxy import GrpcGateway
    from podium.gateway.proxy import Gateway
    from podium.routes.table import Endpoint

    gateway = Gateway()
    gateway.table.add_endpoint("xgb-example", "1", Endpoint("xgb-1", upstream_http,
                                                            grpc_target=upstream_grpc))
    gateway.table.set_split("xgb-example", {"1": 100})

    async def main() -> None:
        server, _ = await GrpcGateway(gateway.table, gateway.stats).serve("127.0.0.1", grpc_port)
        config = uvicorn.Config(gateway.app(), host="127.0.0.1", port=http_port,
                                log_level="warning", access_log=False)
        await uvicorn.Server(config).serve()
        await server.stop(0)

    asyncio.run(main())




Caller = Callable[[], Awaitable[object]]
Closer = Callable[[], Awaitable[None]]


async def timed(make: Callable[[str], tuple[Caller, Closer]], target: str, num_requests: int,
                concurrency: int) -> list[float]:
    """Latencies in ms of `num_requests` calls to `target` by `concurrency` clients."""
    call, close = make(target)
    try:
        samples = await closed_loop(call, concurrency, requests=num_requests,
                                    warmup_requests=WARMUP)
    finally:
        await close()
    return [sample.seconds * 1000 for sample in samples]


def http_caller(base: str) -> tuple[Caller, Closer]:
    client = loopback_client(base, timeout=30)
    body = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 20],
                        "data": FEATURES[0]}]}

    async def call() -> object:
        r = await client.post("/v2/models/xgb-example/infer", json=body)
        r.raise_for_status()
        return r

    return call, client.aclose


def grpc_caller(target: str) -> tuple[Caller, Closer]:
    import tritonclient.grpc.aio as grpcclient

    client = grpcclient.InferenceServerClient(target)
    x = grpcclient.InferInput("features", [1, 20], "FP32")
    x.set_data_from_numpy(np.array(FEATURES, dtype=np.float32))
    return (lambda: client.infer("xgb-example", [x])), client.close


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=4,
                        help="direct/gateway blocks alternate ABBA this many times per path")
    parser.add_argument("--gateway-child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.gateway_child:
        http_port, grpc_port, up_http, up_grpc = args.gateway_child
        run_gateway(int(http_port), int(grpc_port), up_http, up_grpc)
        return 0

    from podium.examples.builders import write_xgb_example

    package = write_xgb_example(Path(tempfile.mkdtemp()) / "xgb-example")
    inst_http, inst_grpc, gw_http, gw_grpc = (free_port() for _ in range(4))
    instance = [sys.executable, "-m", "podium.cli", "serve", str(package), "--host",
                "127.0.0.1", "--http-port", str(inst_http), "--grpc-port", str(inst_grpc)]
    gateway = module_command("bench.gateway_overhead", "--gateway-child", str(gw_http),
                             str(gw_grpc), f"http://127.0.0.1:{inst_http}",
                             f"127.0.0.1:{inst_grpc}")
    with serve(instance, f"http://127.0.0.1:{inst_http}/health/ready"), \
            serve(gateway, f"http://127.0.0.1:{gw_http}/health/ready") as gw:
        print(f"xgb-example, {args.requests} requests, concurrency {args.concurrency}, "
              f"{args.rounds} ABBA rounds")
        print(f"{'path':<16}{'median ms':>10}{'p99 ms':>9}{'added median':>14}{'gw CPU/req':>12}")
        spreads = []
        for protocol, make, direct, via in (
                ("HTTP", http_caller, f"http://127.0.0.1:{inst_http}",
                 f"http://127.0.0.1:{gw_http}"),
                ("gRPC", grpc_caller, f"127.0.0.1:{inst_grpc}", f"127.0.0.1:{gw_grpc}")):
            blocks: list[tuple[str, list[float]]] = []
            cpu_s = 0.0
            block = max(args.requests // (2 * args.rounds), 1)
            # direct, gateway, gateway, direct, ...: drift on a shared machine hits both alike
            for i in range(2 * args.rounds):
                if (i % 4) in (0, 3):
                    blocks.append(("direct", asyncio.run(
                        timed(make, direct, block, args.concurrency))))
                else:
                    cpu_before = cpu_seconds(gw.pid)
                    blocks.append(("gateway", asyncio.run(
                        timed(make, via, block, args.concurrency))))
                    cpu_s += cpu_seconds(gw.pid) - cpu_before
            straight = [v for kind, values in blocks if kind == "direct" for v in values]
            proxied = [v for kind, values in blocks if kind == "gateway" for v in values]
            cpu_ms = cpu_s * 1000 / (len(proxied) + WARMUP * args.rounds)
            base = median(straight)
            for label, values, extra in ((f"{protocol} direct", straight, ""),
                                         (f"{protocol} gateway", proxied, f"{cpu_ms:.3f} ms")):
                added = f"{median(values) - base:+.3f} ms" if values is proxied else ""
                print(f"{label:<16}{median(values):>10.3f}{percentile(values, 99):>9.3f}"
                      f"{added:>14}{extra:>12}")
            # blocks 2k and 2k+1 are one direct and one gateway block, in either order
            pairs = [dict(blocks[k:k + 2]) for k in range(0, len(blocks), 2)]
            spreads.append((protocol,
                            Spread(tuple(median(p["gateway"]) - median(p["direct"])
                                         for p in pairs)),
                            Spread(tuple(median(p["gateway"]) / median(p["direct"])
                                         for p in pairs))))
        print("\nper direct+gateway block pair, median [min .. max]:")
        for protocol, added_ms, ratio in spreads:
            print(f"{protocol:<5} added median {added_ms.median:+.3f} ms "
                  f"[{added_ms.min:+.3f} .. {added_ms.max:+.3f}]  gateway/direct "
                  f"x{ratio.median:.3f} [{ratio.min:.3f} .. {ratio.max:.3f}] "
                  f"n={len(ratio.values)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Gateway overhead: the same load straight to an instance vs through the gateway, in one run.

    .venv/bin/python bench/gateway_overhead.py [--requests 2000] [--concurrency 1]

Starts one `podium serve` instance of xgb-example and one gateway process routing to it, then
sends the same KServe v2 requests (HTTP and gRPC) both ways, in alternating blocks (direct,
gateway, gateway, direct, ... so drift on a shared machine hits both paths alike). Prints median
and p99 latency per path, the added median latency, and the gateway process's CPU time per
request (utime + stime from /proc, so it is the proxy's own cost, whatever else runs).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np

FEATURES = [[0.1 * i for i in range(20)]]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def child(command: list[str], ready_url: str) -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(ready_url).status_code == 200:
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{command} did not become ready")
            time.sleep(0.2)
        yield process
    finally:
        process.terminate()
        process.wait(timeout=30)


def run_gateway(http_port: int, grpc_port: int, upstream_http: str, upstream_grpc: str) -> None:
    """Child mode: a gateway with one static endpoint (what `podium up` builds dynamically)."""
    import uvicorn

    from podium.gateway.grpc_proxy import GrpcGateway
    from podium.gateway.proxy import Gateway
    from podium.gateway.routing import Endpoint

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


def timed(call: Callable[[], object], num_requests: int, concurrency: int) -> list[float]:
    """Latencies in ms of `num_requests` calls made by `concurrency` threads."""
    def one(_: int) -> float:
        started = time.perf_counter()
        call()
        return (time.perf_counter() - started) * 1000

    for _ in range(50):  # warm connections and caches
        call()
    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, range(num_requests)))


def http_caller(base: str) -> Callable[[], object]:
    client = httpx.Client(base_url=base, timeout=30)
    body = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 20],
                        "data": FEATURES[0]}]}

    def call() -> object:
        r = client.post("/v2/models/xgb-example/infer", json=body)
        r.raise_for_status()
        return r

    return call


def grpc_caller(target: str) -> Callable[[], object]:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(target)
    x = grpcclient.InferInput("features", [1, 20], "FP32")
    x.set_data_from_numpy(np.array(FEATURES, dtype=np.float32))
    return lambda: client.infer("xgb-example", [x])


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
    gateway = [sys.executable, __file__, "--gateway-child", str(gw_http), str(gw_grpc),
               f"http://127.0.0.1:{inst_http}", f"127.0.0.1:{inst_grpc}"]
    with child(instance, f"http://127.0.0.1:{inst_http}/health/ready"), \
            child(gateway, f"http://127.0.0.1:{gw_http}/health/ready") as gw:
        print(f"xgb-example, {args.requests} requests, concurrency {args.concurrency}")
        print(f"{'path':<16}{'median ms':>10}{'p99 ms':>9}{'added median':>14}{'gw CPU/req':>12}")
        for protocol, make, direct, via in (
                ("HTTP", http_caller, f"http://127.0.0.1:{inst_http}",
                 f"http://127.0.0.1:{gw_http}"),
                ("gRPC", grpc_caller, f"127.0.0.1:{inst_grpc}", f"127.0.0.1:{gw_grpc}")):
            straight: list[float] = []
            proxied: list[float] = []
            cpu_s = 0.0
            block = max(args.requests // (2 * args.rounds), 1)
            to_direct, to_gateway = make(direct), make(via)
            # direct, gateway, gateway, direct, ...: drift on a shared machine hits both alike
            for i in range(2 * args.rounds):
                if (i % 4) in (0, 3):
                    straight += timed(to_direct, block, args.concurrency)
                else:
                    cpu_before = cpu_seconds(gw.pid)
                    proxied += timed(to_gateway, block, args.concurrency)
                    cpu_s += cpu_seconds(gw.pid) - cpu_before
            cpu_ms = cpu_s * 1000 / (len(proxied) + 50 * args.rounds)
            base = statistics.median(straight)
            for label, values, extra in ((f"{protocol} direct", straight, ""),
                                         (f"{protocol} gateway", proxied, f"{cpu_ms:.3f} ms")):
                median = statistics.median(values)
                p99 = float(np.percentile(values, 99))
                added = f"{median - base:+.3f} ms" if values is proxied else ""
                print(f"{label:<16}{median:>10.3f}{p99:>9.3f}{added:>14}{extra:>12}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

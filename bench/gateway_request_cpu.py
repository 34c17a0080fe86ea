"""The gateway's CPU per request, admitted (forwarded to an instance) and refused from its head,
for source trees compared in one run.

    python -m bench.gateway_request_cpu --trees A_SRC_PARENT,B_SRC_PARENT [--mode admit|refuse]
                                        [--requests 10000] [--rounds 2]

Each tree (a directory holding `src/`, e.g. `git archive <commit> src | tar -x -C DIR`) runs
`bench.overload_xgb`'s gateway child (what `podium gateway` runs: its HTTP protocol, early
shed, heap frozen) on cpu 0, in front of a stand-in instance: a raw asyncio server answering
every POST at once with the 200 xgb-example answers (`admit`), or never (`refuse`: 16 held
requests fill the gateway's in-flight bound of 16, and every request after them is shed from
its head). A closed loop of 16 keep-alive connections sends the xgb KServe infer; the figure is
the gateway process's user + system CPU (/proc) over the requests after a warm-up, per
request: the proxy's own cost whatever else runs, the kernel's loopback work included. Rounds
alternate the trees' order (A B, B A, ...).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

import httptools

from bench.gateway_overhead import FEATURES
from bench.harness import ROOT, cpu_seconds, free_port

INFER = "/v2/models/xgb-example/infer"
BODY = json.dumps({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 20],
                               "data": FEATURES[0]}]}).encode()
_ANSWER = json.dumps({"model_name": "xgb-example", "model_version": "1", "outputs": [
    {"name": "predict", "datatype": "FP32", "shape": [1], "data": [0.5]}]}).encode()
ANSWER = (b"HTTP/1.1 200 OK\r\ndate: Fri, 04 Dec 2026 20:00:00 GMT\r\nserver: uvicorn\r\n"
          b"content-length: " + str(len(_ANSWER)).encode() + b"\r\ncontent-type: "
          b"application/json\r\npodium-admission-bound: 16\r\n\r\n" + _ANSWER)
HEALTH = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"
WARMUP = 2000
CONNECTIONS = 16


def stand_in(port: int, hold: bool) -> None:
    """Child process: the instance stand-in (health checks answered, POSTs answered or held)."""

    class Proto(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport
            self.parser = httptools.HttpRequestParser(self)

        def data_received(self, data: bytes) -> None:
            self.parser.feed_data(data)

        def on_message_complete(self) -> None:
            post = self.parser.get_method() == b"POST"
            if not (post and hold):
                self.transport.write(ANSWER if post else HEALTH)  # type: ignore[attr-defined]

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Proto, "127.0.0.1", port)
        await server.serve_forever()

    asyncio.run(main())


async def _loop(port: int, count: int, connections: int) -> None:
    raw = (f"POST {INFER} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
           f"Content-Length: {len(BODY)}\r\n\r\n").encode() + BODY
    left = [count]

    async def one() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while left[0] > 0:
            left[0] -= 1
            writer.write(raw)
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
        writer.close()

    await asyncio.gather(*[one() for _ in range(connections)])


async def _held(port: int) -> list[asyncio.StreamWriter]:
    """16 requests the stand-in never answers: the gateway's bound is full."""
    raw = (f"POST {INFER} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(BODY)}\r\n\r\n"
           ).encode() + BODY
    writers = []
    for _ in range(16):
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(raw)
        writers.append(writer)
    await asyncio.sleep(0.5)
    return writers


def measure(tree: str, mode: str, requests: int) -> tuple[float, float]:
    """(gateway CPU µs per request, requests per second) for one tree."""
    instance, gateway = free_port(), free_port()
    stand = multiprocessing.Process(target=stand_in, args=(instance, mode == "refuse"),
                                    daemon=True)
    stand.start()
    env = dict(os.environ, PYTHONPATH=f"{tree}/src:{ROOT}")
    child = subprocess.Popen(
        ["taskset", "-c", "0", sys.executable, "-m", "bench.overload_xgb", "--gateway-child",
         str(gateway), f"http://127.0.0.1:{instance}", "16" if mode == "refuse" else "256",
         "early", tempfile.mktemp(), "asyncio", "frozen"], env=env, cwd=ROOT)
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{gateway}/health/ready", timeout=1)
                break
            except OSError:
                time.sleep(0.1)

        async def run() -> tuple[float, float]:
            held = await _held(gateway) if mode == "refuse" else []
            await _loop(gateway, WARMUP, CONNECTIONS)
            cpu, start = cpu_seconds(child.pid), time.monotonic()
            await _loop(gateway, requests, CONNECTIONS)
            result = cpu_seconds(child.pid) - cpu, time.monotonic() - start
            for writer in held:
                writer.close()
            return result

        cpu, seconds = asyncio.run(run())
    finally:
        child.terminate()
        child.wait(timeout=30)
        stand.terminate()
    return cpu / requests * 1e6, requests / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", required=True, help="comma-separated parents of src/")
    parser.add_argument("--mode", choices=["admit", "refuse"], default="admit")
    parser.add_argument("--requests", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=2)
    opts = parser.parse_args()
    trees = opts.trees.split(",")
    results: dict[str, list[float]] = {tree: [] for tree in trees}
    for round_ in range(opts.rounds):
        for tree in trees if round_ % 2 == 0 else trees[::-1]:
            us, rps = measure(tree, opts.mode, opts.requests)
            results[tree].append(us)
            print(f"{opts.mode} {tree}: {us:.1f} us of gateway CPU per request "
                  f"({rps:.0f} req/s)", flush=True)
    for tree, values in results.items():
        print(f"{opts.mode} {tree}: {min(values):.1f}-{max(values):.1f} us per request over "
              f"{len(values)} rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The KServe HTTP path of two source trees, alternated: throughput and server CPU per request.

    python -m bench.kserve_tree_ab OLD_TREE NEW_TREE [--rounds 3] [--seconds 8] [--concurrency 32]

Each tree is a checkout (e.g. `git worktree add /tmp/old 6f6b19e`); its own `src` and
`bench/kserve_server.py` (run by path: an older tree has no `bench` package) serve
xgb-example, driven by `kserve_load.run_load` (tritonclient aio HTTP, JSON tensors, batch-1
requests, the harness's closed loop). The order alternates (old, new, new, old,
…) so drift in the machine's load falls on both; the server's CPU time per request (user +
system, psutil, warm-up included) is less sensitive to that load than throughput is. Prints one
line per run, the new/old ratios per pair, and each ratio's median [min .. max].
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path

import psutil

from bench.harness import free_port, print_ratios, serve
from bench.kserve_load import run_load
from podium.examples.builders import synthetic_features, write_xgb_example


def measure(tree: Path, repository: Path, seconds: float, concurrency: int) -> tuple[float, float]:
    """(requests per second, server CPU µs per request) of one run on `tree`."""
    http_port, grpc_port = free_port(), free_port()
    command = [sys.executable, str(tree / "bench" / "kserve_server.py"), "--repository",
               str(repository), "--http-port", str(http_port), "--grpc-port", str(grpc_port),
               "xgb-example"]
    # by path, not `-m`: an older tree has no `bench` package; the script imports only podium
    env = {"PYTHONPATH": f"{tree / 'src'}:{tree / 'bench'}"}
    with serve(command, f"http://127.0.0.1:{http_port}/v2/health/ready", env=env):
        server = _server_process(http_port)
        before = sum(server.cpu_times()[:2])
        result = asyncio.run(run_load(
            f"127.0.0.1:{http_port}", "http", "xgb-example", "features",
            synthetic_features(1024, seed=42), concurrency=concurrency, seconds=seconds,
            output_name="probability", binary=False))
        cpu_s = sum(server.cpu_times()[:2]) - before
    return result.throughput, 1e6 * cpu_s / result.requests


def _server_process(http_port: int) -> psutil.Process:
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if "kserve_server.py" in " ".join(cmdline) and str(http_port) in cmdline:
            return process
    raise RuntimeError(f"no kserve_server.py process on port {http_port}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    trees = {"old": args.old.resolve(), "new": args.new.resolve()}
    runs: dict[str, list[tuple[float, float]]] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory() as tmp:
        write_xgb_example(Path(tmp) / "xgb-example")
        for index in range(args.rounds):
            for name in ("old", "new") if index % 2 == 0 else ("new", "old"):
                rps, cpu_us = measure(trees[name], Path(tmp), args.seconds, args.concurrency)
                runs[name].append((rps, cpu_us))
                print(f"round {index} {name:<3} {rps:8.1f} req/s  {cpu_us:6.0f} us CPU/request "
                      f"(load {os.getloadavg()[0]:.1f})", flush=True)
    print("\nnew / old per round (throughput: higher is better; CPU: lower is better)")
    for index, (old, new) in enumerate(zip(runs["old"], runs["new"], strict=True)):
        print(f"round {index}: throughput x{new[0] / old[0]:.2f}  "
              f"CPU/request x{new[1] / old[1]:.2f}")
    print()
    print_ratios([("throughput req/s", [r[0] for r in runs["new"]], [r[0] for r in runs["old"]]),
                  ("server CPU us/request", [r[1] for r in runs["new"]],
                   [r[1] for r in runs["old"]])], podium="new", peer="old")


if __name__ == "__main__":
    main()

"""Where the served engine's processes spend their cycles: `perf record` of the worker and the
engine core of `podium serve` (the default package, every default) under a decode load.

    python -m bench.served_perf [--input 32] [--output 256] [--prompts 32] [--seconds 8]
                                [--env KEY=VALUE ...] [--package DIR]

Starts the server, waits for ready, starts vLLM's serving benchmark (concurrency 16) in a
thread, and after a third of the expected run records the worker (the engine's deepest
process) and the engine core with `perf record -g` for `--seconds` (0: no perf, the load's
figures alone, to compare `--env` settings). Prints `perf report`'s
shares by shared object and the top symbols of each. perf reads native frames: time in the
interpreter shows as libpython's `_PyEval_EvalFrameDefault` and friends, time in OpenMP
barriers as libgomp's, the GEMM in oneDNN's JIT code (`[JIT]` / unknown) or libtorch.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from bench.boot import _roles
from bench.harness import free_port, serve

PERF = "/usr/bin/perf"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", type=int, default=32)
    parser.add_argument("--output", type=int, default=256)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=8, help="0: the load alone, no perf")
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for the server")
    parser.add_argument("--package", default=None, help="a package directory (default model)")
    args = parser.parse_args()
    from bench.harness.vllm_serving import serving_benchmark
    from podium.package.defaults import DEFAULT_MODEL, default_model_dir

    port = free_port()
    env = {**os.environ, **dict(item.split("=", 1) for item in args.env)}
    argv = [sys.executable, "-m", "podium.cli", "serve", "--host", "127.0.0.1", "--http-port",
            str(port), "--grpc-port", str(free_port()), *([args.package] if args.package else [])]
    base = f"http://127.0.0.1:{port}"
    with (tempfile.TemporaryDirectory() as tmp,
          serve(argv, f"{base}/health/ready", timeout_s=600, env=env, poll_s=0.2,
                stop_timeout_s=120) as served):
        roles = _roles(served.pid, psutil.Process(served.pid).children(recursive=True))
        result: dict = {}
        load = threading.Thread(target=lambda: result.update(serving_benchmark(
            base, DEFAULT_MODEL, default_model_dir(), args.prompts, 16, ready_check=False,
            input_len=args.input, output_len=args.output)))
        load.start()
        time.sleep(max(5.0, args.prompts / 16 * args.output * 0.045 / 3))
        data = {role: Path(tmp) / f"{role}.data" for role in ("worker", "core")
                if args.seconds > 0}
        recorders = [subprocess.Popen([PERF, "record", "-F", "499", "-g", "-o", str(path), "-p",
                                       str(roles[role].pid), "--", "sleep", str(args.seconds)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                     for role, path in data.items()]
        for recorder in recorders:
            recorder.wait()
        load.join()
        print(f"load: {result.get('output_throughput', 0):.1f} output tok/s, median ITL "
              f"{result.get('median_itl_ms', 0):.1f} ms")
        for role, path in data.items():
            _report(role, path)


def _report(role: str, path: Path) -> None:
    for sort, limit in (("dso", 12), ("dso,sym", 30)):
        out = subprocess.run([PERF, "report", "-i", str(path), "--no-children", "--sort", sort,
                              "--stdio", "-g", "none", "--percent-limit", "0.5"],
                             capture_output=True, text=True, check=False).stdout
        rows = [line for line in out.splitlines() if line.strip() and not line.startswith("#")]
        print(f"--- {role}: by {sort} ---")
        print("\n".join(rows[:limit]))


if __name__ == "__main__":
    main()

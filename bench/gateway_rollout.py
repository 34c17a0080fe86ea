"""Rollout under load: wall time of a Red-Black rollout, p99 latency during it vs steady state,
failed requests. Runs a real `podium up` with xgb-example v1 → v2.

    python -m bench.gateway_rollout [--concurrency 16] [--stages 10,25,50,100]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench.harness import closed_loop, free_port, loopback_client, percentile, serve, wait_until


class Load:
    """Closed-loop clients (the harness's loop, in a thread of its own until `stop` is set);
    each result is (start time, latency ms, ok)."""

    def __init__(self, url: str, concurrency: int, max_seconds: float = 1800) -> None:
        self.url, self.concurrency, self.max_seconds = url, concurrency, max_seconds
        self.results: list[tuple[float, float, bool]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        body = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 20],
                            "data": [0.1] * 20}]}
        async with loopback_client(self.url, timeout=60) as client:
            async def one() -> None:
                started = time.monotonic()
                try:
                    ok = (await client.post("/v2/models/xgb-example/infer",
                                            json=body)).status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.results.append((started, (time.monotonic() - started) * 1000, ok))

            await closed_loop(one, self.concurrency, seconds=self.max_seconds,
                              stop=self.stop.is_set)

    def window(self, start: float, end: float) -> list[tuple[float, float, bool]]:
        return [r for r in self.results if start <= r[0] < end]


def p99(results: list[tuple[float, float, bool]]) -> float:
    return percentile([r[1] for r in results], 99)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--stages", default="10,25,50,100")
    parser.add_argument("--analysis-window", type=float, default=5.0)
    parser.add_argument("--steady", type=float, default=15.0, help="seconds of steady state")
    args = parser.parse_args()

    from podium.examples.builders import write_xgb_example

    home = Path(tempfile.mkdtemp(prefix="podium-bench-"))
    v1 = write_xgb_example(home / "pkgs" / "xgb-1")
    v2 = home / "pkgs" / "xgb-2"
    shutil.copytree(v1, v2)
    manifest = json.loads((v2 / "podium.json").read_text())
    (v2 / "podium.json").write_text(json.dumps({**manifest, "version": "2"}))
    http_port, grpc_port, api_port = free_port(), free_port(), free_port()
    api = f"http://127.0.0.1:{api_port}"
    up = [sys.executable, "-m", "podium.cli", "up", "--host", "127.0.0.1", "--http-port",
          str(http_port), "--grpc-port", str(grpc_port), "--api-port", str(api_port)]
    with serve(up, api + "/health", env={"PODIUM_HOME": str(home)}, log=home / "up.log",
               stop_timeout_s=60):
        for package in (v1, v2):
            httpx.post(api + "/v1/packages", json={"path": str(package)}).raise_for_status()
        first = httpx.post(api + "/v1/rollouts", json={
            "model": "xgb-example", "version": "1", "stages": [100], "num_instances": 2,
            "analysis_window_ms": 0, "warm_delay_ms": 0}).json()
        wait_until(lambda: httpx.get(f"{api}/v1/rollouts/{first['id']}").json()["status"]
                   == "succeeded")
        load = Load(f"http://127.0.0.1:{http_port}", args.concurrency)
        load.thread.start()
        time.sleep(2)  # warm up
        steady_start = time.monotonic()
        time.sleep(args.steady)
        rollout_start = time.monotonic()
        second = httpx.post(api + "/v1/rollouts", json={
            "model": "xgb-example", "version": "2", "num_instances": 2,
            "stages": [int(s) for s in args.stages.split(",")],
            "analysis_window_ms": int(args.analysis_window * 1000), "warm_delay_ms": 2000,
            "max_p99_ratio": 4.0, "p99_slack_ms": 50}).json()
        if "id" not in second:
            raise RuntimeError(f"rollout refused: {second}")
        wait_until(lambda: httpx.get(f"{api}/v1/rollouts/{second['id']}").json()["status"]
                   != "running", timeout_s=600)
        rollout_end = time.monotonic()
        load.stop.set()
        load.thread.join(timeout=60)
        status = httpx.get(f"{api}/v1/rollouts/{second['id']}").json()
        steady = load.window(steady_start, rollout_start)
        during = load.window(rollout_start, rollout_end)
        failed = sum(1 for r in load.results if not r[2])
        print(f"xgb-example v1 -> v2, red-black stages {args.stages}, "
              f"{args.concurrency} clients, analysis window {args.analysis_window}s")
        print(f"rollout status        {status['status']} {status['reason']}")
        print(f"rollout wall time     {rollout_end - rollout_start:.1f} s")
        print(f"requests              {len(load.results)} ({failed} failed)")
        print(f"p99 steady            {p99(steady):.1f} ms ({len(steady)} requests)")
        print(f"p99 during rollout    {p99(during):.1f} ms ({len(during)} requests)")
        print(f"ratio                 {p99(during) / p99(steady):.2f}x (target <= 1.5x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

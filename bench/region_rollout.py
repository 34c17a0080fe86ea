"""A two-region rollout under load: wall time, and p99 latency in each region during its own
leg vs steady state. Runs a real `podium up --region a,... --region b,...` (two local
runtimes, two gateways) with xgb-example v1 -> v2; clients are split over both gateways.

    python -m bench.region_rollout [--concurrency 16] [--stages 10,25,50,100]
        [--analysis-window 5] [--bake 5] [--steady 15]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.gateway_rollout import Load, p99
from bench.harness import free_port, serve, wait_until

REGIONS = ("a", "b")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=16, help="clients over both regions")
    parser.add_argument("--stages", default="10,25,50,100")
    parser.add_argument("--analysis-window", type=float, default=5.0)
    parser.add_argument("--bake", type=float, default=5.0, help="seconds between regions")
    parser.add_argument("--steady", type=float, default=15.0, help="seconds of steady state")
    args = parser.parse_args()

    from podium.examples.builders import write_xgb_example

    home = Path(tempfile.mkdtemp(prefix="podium-bench-"))
    v1 = write_xgb_example(home / "pkgs" / "xgb-1")
    v2 = home / "pkgs" / "xgb-2"
    shutil.copytree(v1, v2)
    manifest = json.loads((v2 / "podium.json").read_text())
    (v2 / "podium.json").write_text(json.dumps({**manifest, "version": "2"}))
    ports = {r: (free_port(), free_port()) for r in REGIONS}
    api_port = free_port()
    api = f"http://127.0.0.1:{api_port}"
    flags = [f for r, (http, grpc) in ports.items()
             for f in ("--region", f"name={r},http={http},grpc={grpc}")]
    up = [sys.executable, "-m", "podium.cli", "up", "--host", "127.0.0.1", "--api-port",
          str(api_port), *flags]
    with serve(up, api + "/health", env={"PODIUM_HOME": str(home)}, log=home / "up.log",
               stop_timeout_s=60):
        for package in (v1, v2):
            httpx.post(api + "/v1/packages", json={"path": str(package)}).raise_for_status()
        first = httpx.post(api + "/v1/rollouts", json={
            "model": "xgb-example", "version": "1", "stages": [100], "num_instances": 2,
            "analysis_window_ms": 0, "warm_delay_ms": 0, "bake_ms": 0}).json()
        wait_until(lambda: httpx.get(f"{api}/v1/rollouts/{first['id']}").json()["status"]
                   == "succeeded")
        loads = {r: Load(f"http://127.0.0.1:{ports[r][0]}", args.concurrency // 2)
                 for r in REGIONS}
        for load in loads.values():
            load.thread.start()
        time.sleep(2)  # warm up
        steady_start = time.monotonic()
        time.sleep(args.steady)
        rollout_start = time.monotonic()
        second = httpx.post(api + "/v1/rollouts", json={
            "model": "xgb-example", "version": "2", "num_instances": 2,
            "stages": [int(s) for s in args.stages.split(",")],
            "analysis_window_ms": int(args.analysis_window * 1000), "warm_delay_ms": 2000,
            "bake_ms": int(args.bake * 1000), "max_p99_ratio": 4.0, "p99_slack_ms": 50}).json()
        if "id" not in second:
            raise RuntimeError(f"rollout refused: {second}")
        legs = _follow(f"{api}/v1/rollouts/{second['id']}", rollout_start)
        rollout_end = time.monotonic()
        for load in loads.values():
            load.stop.set()
            load.thread.join(timeout=60)
        status = httpx.get(f"{api}/v1/rollouts/{second['id']}").json()
        print(f"xgb-example v1 -> v2 in regions a then b, red-black stages {args.stages}, "
              f"{args.concurrency} clients over both gateways, analysis window "
              f"{args.analysis_window}s, bake {args.bake}s")
        print(f"rollout status        {status['status']} {status['reason']}")
        (a_start, a_end), (b_start, b_end) = legs["a"], legs["b"]
        print(f"rollout wall time     {rollout_end - rollout_start:.1f} s (a "
              f"{a_end - a_start:.1f} s, bake, b {b_end - b_start:.1f} s)")
        print(f"b started             {b_start - a_end:.1f} s after a finished")
        for region, load in loads.items():
            steady = load.window(steady_start, rollout_start)
            start, end = legs[region]
            during = load.window(rollout_start + start, rollout_start + end)
            failed = sum(1 for r in load.results if not r[2])
            print(f"region {region}: requests {len(load.results)} ({failed} failed); p99 "
                  f"steady {p99(steady):.1f} ms ({len(steady)}), during its leg "
                  f"{p99(during):.1f} ms ({len(during)}): {p99(during) / p99(steady):.2f}x "
                  "(target <= 1.5x)")
    return 0


def _follow(url: str, started: float, timeout_s: float = 1800
            ) -> dict[str, tuple[float, float]]:
    """Poll the rollout until done; per region, (start, end) seconds after `started`."""
    seen: dict[str, list[float]] = {}
    while time.monotonic() - started < timeout_s:
        data = httpx.get(url).json()
        now = time.monotonic() - started
        for row in data["regions"]:
            times = seen.setdefault(row["region"], [])
            if row["status"] != "pending" and not times:
                times.append(now)
            if row["status"] != "running" and row["status"] != "pending" and len(times) == 1:
                times.append(now)
        if data["status"] != "running":
            return {r: (t[0], t[-1]) for r, t in seen.items()}
        time.sleep(0.2)
    raise TimeoutError(f"rollout still running after {timeout_s} s")


if __name__ == "__main__":
    sys.exit(main())

"""First-request latency of the default LLM from zero instances against a warm instance, under
a real `podium up` (local runtime: instances after the first fork from its zygote).

    python -m bench.cold_start [--cycles 5] [--cooldown-ms 3000] [--warm 10]

Announces the default LLM with `min_instances: 0` and an idle cooldown of `--cooldown-ms`,
deploys it, then `--cycles` times: waits until it is at zero (the instance drained and
stopped), sends one chat completion (8 tokens) through the gateway and times it to the answer
(the gateway holds it while the control plane starts an instance), then sends `--warm`
requests to the now warm instance one after the other. Prints each cycle, then p50/p99 of
both. The held request's wait bound is `PODIUM_COLD_START_WAIT_S` (set to 300 s here so no
cycle ends in a 503).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from bench.harness import free_port, median


def _wait(condition: Callable[[], bool], what: str, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if condition():
                return
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--cooldown-ms", type=int, default=3_000)
    parser.add_argument("--warm", type=int, default=10, help="warm requests per cycle")
    args = parser.parse_args()
    from podium.package.defaults import DEFAULT_MODEL, default_llm_manifest
    from podium.package.package import write_manifest

    home = Path(tempfile.mkdtemp(prefix="bench-cold-start-"))
    api_port, http_port = free_port(), free_port()
    api, gateway = f"http://127.0.0.1:{api_port}", f"http://127.0.0.1:{http_port}"
    from podium.package.cache import ModelCache

    env = {**os.environ, "PODIUM_HOME": str(home), "PODIUM_CACHE": str(ModelCache().root),
           "PODIUM_COLD_START_WAIT_S": "300", "HF_HUB_OFFLINE": "1"}
    manifest = default_llm_manifest()
    manifest["autoscale"] = {"scale_down_cooldown_ms": args.cooldown_ms}
    package = write_manifest(home / "packages" / DEFAULT_MODEL, manifest).root
    cli = [sys.executable, "-m", "podium.cli"]
    with (home / "up.log").open("ab") as log:
        up = subprocess.Popen([*cli, "up", "--host", "127.0.0.1", "--http-port", str(http_port),
                               "--api-port", str(api_port), "--grpc-port", str(free_port())],
                              env=env, stdout=log, stderr=subprocess.STDOUT)
    cold: list[float] = []
    warm: list[float] = []
    request = {"model": DEFAULT_MODEL, "max_tokens": 8, "temperature": 0,
               "messages": [{"role": "user", "content": "Name a colour."}]}

    def status() -> dict:
        return httpx.get(api + "/v1/status", timeout=10).json()

    def version() -> dict:
        return status()["models"][DEFAULT_MODEL]["versions"][manifest["version"]]

    def ask() -> float:
        started = time.monotonic()
        r = httpx.post(gateway + "/v1/chat/completions", json=request, timeout=600)
        r.raise_for_status()
        return time.monotonic() - started

    try:
        _wait(lambda: httpx.get(api + "/health", timeout=2).status_code == 200, "the API")
        for step in (["announce", str(package)],
                     ["deploy", f"{DEFAULT_MODEL}@{manifest['version']}", "--stages", "100",
                      "--analysis-window", "0", "--warm-delay", "0"]):
            subprocess.run([*cli, *step, "--api", api], env=env, check=True,
                           stdout=subprocess.DEVNULL)
        _wait(lambda: any(i["state"] == "ready" for i in version()["instances"]), "deployed")
        subprocess.run([*cli, "scale", f"{DEFAULT_MODEL}@{manifest['version']}", "--min", "0",
                        "--max", "1", "--api", api], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        for cycle in range(args.cycles):
            _wait(lambda: version()["num_desired"] == 0 and all(
                i["state"] == "stopped" for i in version()["instances"]), "zero instances")
            time.sleep(1.0)  # the process gone, the gateway's table at zero
            first = ask()
            mine = [ask() for _ in range(args.warm)]
            cold.append(first)
            warm.extend(mine)
            print(f"cycle {cycle + 1}: from zero {first:6.2f}s  warm p50 "
                  f"{median(mine) * 1000:6.0f} ms", flush=True)
    finally:
        up.terminate()
        try:
            up.wait(timeout=120)
        except subprocess.TimeoutExpired:
            up.kill()
    print(json.dumps({"cycles": len(cold),
                      "from_zero_s": {"p50": round(median(cold), 2),
                                      "p99": round(_percentile(cold, 0.99), 2)},
                      "warm_ms": {"p50": round(median(warm) * 1000, 1),
                                  "p99": round(_percentile(warm, 0.99) * 1000, 1)}}))


if __name__ == "__main__":
    main()

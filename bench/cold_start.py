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
import subprocess
import time
from pathlib import Path

import httpx

from bench.harness import median
from bench.harness.up import Up, fresh_up, wait_for


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

    manifest = default_llm_manifest()
    manifest["autoscale"] = {"scale_down_cooldown_ms": args.cooldown_ms}
    with fresh_up("bench-cold-start-", {"PODIUM_COLD_START_WAIT_S": "300"}) as up:
        package = write_manifest(up.home / "packages" / DEFAULT_MODEL, manifest).root
        cold, warm = _cycles(up, package, manifest["version"], args)
    print(json.dumps({"cycles": len(cold),
                      "from_zero_s": {"p50": round(median(cold), 2),
                                      "p99": round(_percentile(cold, 0.99), 2)},
                      "warm_ms": {"p50": round(median(warm) * 1000, 1),
                                  "p99": round(_percentile(warm, 0.99) * 1000, 1)}}))


def _cycles(up: Up, package: Path, ver: str, args: argparse.Namespace,
            ) -> tuple[list[float], list[float]]:
    """Deploy, allow zero, then each cycle: wait for zero, one request from zero, warm ones."""
    from podium.package.defaults import DEFAULT_MODEL

    api, gateway, cli, env = up.api, up.gateway, up.cli, up.env
    cold: list[float] = []
    warm: list[float] = []
    request = {"model": DEFAULT_MODEL, "max_tokens": 8, "temperature": 0,
               "messages": [{"role": "user", "content": "Name a colour."}]}

    def status() -> dict:
        return httpx.get(api + "/v1/status", timeout=10).json()

    def version() -> dict:
        return status()["models"][DEFAULT_MODEL]["versions"][ver]

    def ask() -> float:
        started = time.monotonic()
        r = httpx.post(gateway + "/v1/chat/completions", json=request, timeout=600)
        r.raise_for_status()
        return time.monotonic() - started

    for step in (["announce", str(package)],
                 ["deploy", f"{DEFAULT_MODEL}@{ver}", "--stages", "100",
                  "--analysis-window", "0", "--warm-delay", "0"]):
        subprocess.run([*cli, *step, "--api", api], env=env, check=True,
                       stdout=subprocess.DEVNULL)
    wait_for(lambda: any(i["state"] == "ready" for i in version()["instances"]), "deployed")
    subprocess.run([*cli, "scale", f"{DEFAULT_MODEL}@{ver}", "--min", "0",
                    "--max", "1", "--api", api], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    for cycle in range(args.cycles):
        wait_for(lambda: version()["num_desired"] == 0 and all(
            i["state"] == "stopped" for i in version()["instances"]), "zero instances")
        time.sleep(1.0)  # the process gone, the gateway's table at zero
        first = ask()
        mine = [ask() for _ in range(args.warm)]
        cold.append(first)
        warm.extend(mine)
        print(f"cycle {cycle + 1}: from zero {first:6.2f}s  warm p50 "
              f"{median(mine) * 1000:6.0f} ms", flush=True)
    return cold, warm


if __name__ == "__main__":
    main()

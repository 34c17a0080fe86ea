"""LoRA adapter rollouts: time from `podium deploy ADAPTER@N` to 100% of the adapter's traffic
on version N, under load, on the base's running instance (no boot). Runs a real `podium up`
with the default LLM (LoRA on) and two random adapters, then rolls between them `--repeat`
times (1 -> 2, 2 -> 1, ...).

    python -m bench.adapter_rollout [--repeat 4] [--plan 100:0 --plan 10,50,100:1]

Each `--plan STAGES:WINDOW` (Red-Black stages in percent, analysis window in seconds per stage)
runs `--repeat` rollouts on the same `podium up` (one base boot for all).

"100%" is the moment the gateway's split gives the new version every request, read from the
control API every 50 ms; the load's own counts (the gateway's /metrics per version) confirm
that the old version took no request after it. Target: <= 5 s (a base-model Red-Black needs a
boot: ~40-120 s here).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx

from bench.harness import closed_loop, free_port, loopback_client, serve, wait_until
from podium.package.cache import ModelCache
from podium.package.defaults import DEFAULT_MODEL, default_llm_manifest
from podium.package.package import write_manifest

ADAPTER = f"bench-tone-{uuid.uuid4().hex[:6]}"
"""Unique: the model cache (and its adapter index) is shared with other runs; removed at the end."""


class Load:
    """Closed-loop OpenAI chat clients on the adapter, in a thread of their own."""

    def __init__(self, url: str, concurrency: int) -> None:
        self.url, self.concurrency = url, concurrency
        self.num_ok = self.num_failed = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        body = {"model": ADAPTER, "max_tokens": 4, "temperature": 0,
                "messages": [{"role": "user", "content": "Say hello."}]}
        async with loopback_client(self.url, timeout=120) as client:
            async def one() -> None:
                try:
                    ok = (await client.post("/v1/chat/completions", json=body)).status_code \
                        == 200
                except httpx.HTTPError:
                    ok = False
                if ok:
                    self.num_ok += 1
                else:
                    self.num_failed += 1

            await closed_loop(one, self.concurrency, seconds=3600, stop=self.stop.is_set)


def counts(gateway: str) -> dict[str, int]:
    """Requests of the adapter per version so far, from the gateway's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, int] = {}
    for family in text_string_to_metric_families(httpx.get(gateway + "/metrics").text):
        for s in family.samples:
            if s.name == "podium:gateway_requests_total" and s.labels.get("model") == ADAPTER:
                found[s.labels["version"]] = found.get(s.labels["version"], 0) + int(s.value)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=4)
    parser.add_argument("--plan", action="append", default=None,
                        help="STAGES:WINDOW, e.g. 10,50,100:1 (repeatable; "
                             "default 100:0 and 10,50,100:1)")
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    plans = [(tuple(int(s) for s in stages.split(",")), float(window)) for stages, window in
             (plan.split(":") for plan in args.plan or ["100:0", "10,50,100:1"])]
    from tests.support.lora_adapters import write_adapter_package

    from podium.package.adapter_store import AdapterStore

    home = Path(tempfile.mkdtemp(prefix="podium-bench-lora-"))
    manifest = {**default_llm_manifest(), "version": "1", "lora": {}}
    base = write_manifest(home / "pkgs" / "base", manifest).root
    base_key = f"{DEFAULT_MODEL}@1"
    adapters = [write_adapter_package(home / "pkgs" / f"{ADAPTER}-{v}", ADAPTER, seed=int(v),
                                      version=v, base=base_key) for v in ("1", "2")]
    http_port, grpc_port, api_port = free_port(), free_port(), free_port()
    api, gateway = f"http://127.0.0.1:{api_port}", f"http://127.0.0.1:{http_port}"
    up = [sys.executable, "-m", "podium.cli", "up", "--host", "127.0.0.1", "--http-port",
          str(http_port), "--grpc-port", str(grpc_port), "--api-port", str(api_port)]
    env = {"PODIUM_HOME": str(home), "PODIUM_CACHE": str(ModelCache().root),
           "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    results: list[tuple[str, list[float], list[int]]] = []
    try:
        with serve(up, api + "/health", env=env, log=home / "up.log", stop_timeout_s=120):
            for package in (base, *adapters):
                httpx.post(api + "/v1/packages", json={"path": str(package)},
                           timeout=600).raise_for_status()

            def deploy(model: str, version: str, **config: object) -> int:
                answer = httpx.post(api + "/v1/rollouts", timeout=30, json={
                    "model": model, "version": version, **config})
                answer.raise_for_status()
                return int(answer.json()["id"])

            def finished(rollout_id: int) -> bool:
                return httpx.get(f"{api}/v1/rollouts/{rollout_id}").json()["status"] \
                    != "running"

            booted = time.monotonic()
            first = deploy(DEFAULT_MODEL, "1", stages=[100], analysis_window_ms=0,
                           warm_delay_ms=0, ready_timeout_ms=900_000)
            wait_until(lambda: finished(first), timeout_s=900, poll_s=1, what="base deployed")
            boot_s = time.monotonic() - booted
            placed = deploy(ADAPTER, "1", stages=[100], analysis_window_ms=0, warm_delay_ms=0)
            wait_until(lambda: finished(placed), timeout_s=60, what="adapter placed")
            load = Load(gateway, args.concurrency)
            load.thread.start()
            wait_until(lambda: load.num_ok >= 8, timeout_s=300, what="first answers")
            current = "1"
            for stages, window in plans:
                seconds, leaks = [], []
                for _ in range(args.repeat):
                    target = "2" if current == "1" else "1"
                    started = time.monotonic()
                    rollout_id = deploy(ADAPTER, target, warm_delay_ms=1_000,
                                        stages=list(stages),
                                        analysis_window_ms=int(window * 1000))
                    while httpx.get(f"{api}/v1/status").json()["models"][ADAPTER][
                            "splits"].get(target) != 100:
                        time.sleep(0.05)
                    seconds.append(time.monotonic() - started)
                    at_100 = counts(gateway)
                    wait_until(lambda rid=rollout_id: finished(rid), timeout_s=120,
                               what="rollout finished")
                    time.sleep(2)
                    leaks.append(counts(gateway).get(current, 0) - at_100.get(current, 0))
                    current = target
                label = f"stages {','.join(map(str, stages))}, analysis window {window:g} s"
                results.append((label, seconds, leaks))
                print(json.dumps({"plan": label, "seconds": seconds, "leaks": leaks}),
                      flush=True)
            load.stop.set()
            load.thread.join(timeout=120)
    finally:
        store = AdapterStore()
        for version in ("1", "2"):
            store.remove(base_key, ADAPTER, version)
    print(f"\n{ADAPTER} rolled {args.repeat} times per plan between 2 versions on {base_key} "
          f"({args.concurrency} closed-loop clients); base boot {boot_s:.0f} s")
    for label, seconds, leaks in results:
        print(f"{label}: deploy -> 100% of traffic median {statistics.median(seconds):.2f} s, "
              f"min {min(seconds):.2f}, max {max(seconds):.2f} (target <= 5 s); "
              f"old version's requests after 100% (in flight at the switch): {leaks}")
    print(f"requests {load.num_ok + load.num_failed} ({load.num_failed} failed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

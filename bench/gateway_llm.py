"""LLM throughput through the gateway vs straight to the instance, in one run.

    python -m bench.gateway_llm [--num-prompts 64] [--concurrency 16] [--rounds 2]

Starts one `podium serve` instance of the default LLM (smollm2-135m-instruct, from the model
cache) and one gateway process routing to it (the gateway `podium up` runs, with its health
checks), then drives the same load with vLLM's own serving benchmark (`vllm.benchmarks.serve`:
random dataset, 128 tokens in / 64 out, `--ignore-eos`, streaming `/v1/completions`) straight to
the instance and through the gateway, alternating direct/gateway/gateway/direct... so drift on a
shared machine hits both paths alike. Prints one JSON line per run, then the output-token
throughput ratio (gateway / direct, medians over rounds; target >= 0.97) and the gateway
process's CPU time per request (utime + stime from /proc: the proxy's own cost, every SSE chunk
of every request, whatever else runs on the machine).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.harness import ROOT, Spread, abba, cpu_seconds, free_port, median, module_command, serve

MODEL = "smollm2-135m-instruct"
NUM_WARMUPS = 4


def run_gateway(http_port: int, upstream: str) -> None:
    """Child mode: the gateway with one static endpoint (what `podium up` builds dynamically)
    and the same active health checks `podium up` runs."""
    import uvicorn

    from podium.gateway.health import run_health_checks
    from podium.gateway.proxy import Gateway
    from podium.routes.table import Endpoint

    gateway = Gateway()
    gateway.table.add_endpoint(MODEL, "1", Endpoint(f"{MODEL}-1", upstream))
    gateway.table.set_split(MODEL, {"1": 100})

    async def main() -> None:
        health = asyncio.create_task(run_health_checks(gateway.table, interval_s=2.0))
        config = uvicorn.Config(gateway.app(), host="127.0.0.1", port=http_port,
                                log_level="warning", access_log=False)
        try:
            await uvicorn.Server(config).serve()
        finally:
            health.cancel()

    asyncio.run(main())


def load(base_url: str, model_dir: Path, num_prompts: int, concurrency: int) -> dict[str, Any]:
    """vLLM's serving benchmark against `base_url`; the figures this script reports."""
    from bench.harness.vllm_serving import serving_benchmark

    result = serving_benchmark(base_url, MODEL, model_dir, num_prompts, concurrency,
                               warmups=NUM_WARMUPS, ready_check=False)
    return {"output_throughput": result["output_throughput"],
            "median_ttft_ms": result["median_ttft_ms"],
            "median_tpot_ms": result["median_tpot_ms"], "duration_s": result["duration"],
            "completed": result["completed"], "failed": num_prompts - result["completed"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2,
                        help="each round runs both paths; the order alternates")
    parser.add_argument("--gateway-child", nargs=2, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.gateway_child:
        run_gateway(int(opts.gateway_child[0]), opts.gateway_child[1])
        return 0

    home = Path(os.environ.get("PODIUM_HOME", ROOT / ".podium"))
    env = {**os.environ, "PODIUM_HOME": str(home), "HF_HUB_OFFLINE": "1",
           "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
    os.environ.update(env)
    from podium.package.cache import ModelCache
    from podium.package.defaults import write_default_package

    package = write_default_package()
    model_dir = ModelCache().materialize(package).path
    logs = Path(tempfile.mkdtemp(prefix="podium-gateway-llm-"))
    inst_port, gw_port = free_port(), free_port()
    direct, via = f"http://127.0.0.1:{inst_port}", f"http://127.0.0.1:{gw_port}"
    instance = [sys.executable, "-m", "podium.cli", "serve", str(package.root), "--host",
                "127.0.0.1", "--http-port", str(inst_port), "--grpc-port", "-1"]
    gateway = module_command("bench.gateway_llm", "--gateway-child", str(gw_port), direct)
    runs: dict[str, list[dict[str, Any]]] = {"direct": [], "gateway": []}
    requests_per_run = opts.num_prompts + NUM_WARMUPS  # no ready-check request
    with serve(instance, direct + "/health/ready", log=logs / "instance.log", env=env,
               timeout_s=600, poll_s=0.5, stop_timeout_s=120), \
            serve(gateway, via + "/health/ready", log=logs / "gateway.log", env=env,
                  timeout_s=600, poll_s=0.5, stop_timeout_s=120) as gw:
        print(f"{MODEL}: {opts.num_prompts} prompts, 128 in / 64 out, concurrency "
              f"{opts.concurrency}, {opts.rounds} round(s); logs in {logs}", flush=True)
        for round_no, path in abba(opts.rounds, peer="direct", podium="gateway"):
            cpu_before = cpu_seconds(gw.pid)
            figures = load(direct if path == "direct" else via, model_dir, opts.num_prompts,
                           opts.concurrency)
            if path == "gateway":
                cpu_s = cpu_seconds(gw.pid) - cpu_before
                figures["gateway_cpu_ms_per_request"] = cpu_s * 1000 / requests_per_run
                figures["gateway_cpu_share"] = cpu_s / figures["duration_s"]
            runs[path].append(figures)
            print(json.dumps({"path": path, "round": round_no, **figures}), flush=True)

    def med(path: str, key: str) -> float:
        return median(r[key] for r in runs[path])

    print(f"\n{'path':<9}{'output tok/s':>13}{'median TTFT ms':>16}{'median TPOT ms':>16}"
          f"{'failed':>8}{'gw CPU/req':>12}{'gw % of a core':>16}")
    for path in ("direct", "gateway"):
        cpu = (f"{med(path, 'gateway_cpu_ms_per_request'):.2f} ms",
               f"{med(path, 'gateway_cpu_share'):.1%}") if path == "gateway" else ("", "")
        print(f"{path:<9}{med(path, 'output_throughput'):>13.1f}"
              f"{med(path, 'median_ttft_ms'):>16.1f}{med(path, 'median_tpot_ms'):>16.1f}"
              f"{sum(r['failed'] for r in runs[path]):>8}{cpu[0]:>12}{cpu[1]:>16}")
    ratio = med("gateway", "output_throughput") / med("direct", "output_throughput")
    print(f"output-token throughput, gateway / direct: {ratio:.3f}x (target >= 0.97x)")
    per_round = Spread(tuple(g["output_throughput"] / d["output_throughput"]
                             for g, d in zip(runs["gateway"], runs["direct"], strict=True)))
    print(f"  per round: {per_round}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

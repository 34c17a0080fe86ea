"""LoRA adapters under load: one base and 8 adapters on one engine, against the base alone and
against vLLM's own `--enable-lora` server with the same 8 adapters, in one run; then the first
request to a cold adapter against a warm one.

Servers, each booted once (never both at once: they would share 2 cores):
- Podium: `podium serve` of the default LLM with `"lora": {}` (8 adapters a batch, rank 16,
  8 kept loaded), its 8 adapters announced into the cache as `podium announce` does;
- the reference: `python -m vllm.entrypoints.openai.api_server --enable-lora --lora-modules
  NAME=DIR x8` with the same engine settings and dtype, stock (`VLLM_PLUGINS=""`: none of
  Podium's engine plugins, so the -1 slot fault Podium patches is the reference's own).

Load: vLLM's own serving benchmark (`bench.harness.vllm_serving`): random prompts, `--input-len`
in / `--output-len` out, `--concurrency` clients, `--num-prompts` per load. "mixed" spreads the
requests round-robin over the base and the 8 adapters (1/9 each); "base" sends them all to the
base. Each server runs `--rounds` of (base, mixed), the order alternated A/B/B/A so drift hits
both alike; every adapter gets one request before the first load (loaded, not measured here).

Cold vs warm: `--cold` new adapters stored into the cache while Podium serves; for each, the
first request (found in the cache, checked against the base, loaded into the engine) then a
second one (warm), both one token, timed at the client.

    python -m bench.lora_mixed [--rounds 2] [--num-prompts 48] [--concurrency 16]
        [--input-len 128] [--output-len 32] [--cold 16] [--max-loras 4,8] [--skip-reference]

`--max-loras 4,8` boots Podium once per value (`"lora": {"max_loras": N, "max_cpu_loras":
max(8, N)}`), one after the other, each with its own loads and cold probe, and prints each
one's mixed / base ratio and the mixed throughput of each value against the first; the
reference keeps Podium's defaults.

The adapters are random rank-8 ones made the way the tests make them
(`tests/support/lora_adapters.py`: PEFT's files, numpy, no training). Prints one JSON line per
load and the ratios, each with its spread over the rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx

from bench.harness import Served, abba, free_port, percentiles, print_ratios, serve
from bench.harness.vllm_serving import serving_benchmark
from bench.openai_overhead import ENGINE_ARGS, resolved_precision
from podium.package.defaults import DEFAULT_MODEL, default_llm_manifest

NUM_ADAPTERS = 8
LORA = {"max_loras": 8, "max_lora_rank": 16, "max_cpu_loras": 8}
"""Podium's defaults (`"lora": {}`), given to the reference as its flags."""


@contextlib.contextmanager
def podium_server(base: Path, port: int, env: dict[str, str], log: Path) -> Iterator[Served]:
    cmd = [sys.executable, "-m", "podium.cli", "serve", str(base), "--host", "127.0.0.1",
           "--http-port", str(port), "--grpc-port", "-1"]
    with serve(cmd, f"http://127.0.0.1:{port}/health/ready", timeout_s=900, log=log, env=env,
               stop_timeout_s=120) as served:
        yield served


@contextlib.contextmanager
def reference_server(model_dir: Path, adapters: dict[str, Path], precision: str, port: int,
                     env: dict[str, str], log: Path) -> Iterator[Served]:
    from podium.package.precision import PRECISIONS

    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
           str(model_dir), "--served-model-name", DEFAULT_MODEL, "--host", "127.0.0.1",
           "--port", str(port), "--disable-uvicorn-access-log", *ENGINE_ARGS,
           "--dtype", PRECISIONS[precision].dtype,
           "--enable-lora", "--max-loras", str(LORA["max_loras"]), "--max-lora-rank",
           str(LORA["max_lora_rank"]), "--max-cpu-loras", str(LORA["max_cpu_loras"]),
           "--lora-modules", *(f"{name}={path}" for name, path in adapters.items())]
    with serve(cmd, f"http://127.0.0.1:{port}/health", timeout_s=900, log=log,
               env={**env, "VLLM_PLUGINS": ""}, stop_timeout_s=120) as served:
        yield served


def one_token(url: str, model: str) -> float:
    """Seconds for one completion of one token of `model`."""
    started = time.perf_counter()
    answer = httpx.post(f"{url}/v1/completions", timeout=300, json={
        "model": model, "prompt": "Hello there, how are you", "max_tokens": 1,
        "temperature": 0})
    answer.raise_for_status()
    return time.perf_counter() - started


def loads(url: str, model_dir: Path, adapters: list[str], opts: argparse.Namespace,
          side: str) -> list[dict]:
    """`opts.rounds` of (base, mixed), alternated A/B/B/A; one result per load."""
    results = []
    for round_no, kind in abba(opts.rounds, peer="base", podium="mixed"):
        result = serving_benchmark(url, DEFAULT_MODEL, model_dir, opts.num_prompts,
                                   opts.concurrency, input_len=opts.input_len,
                                   output_len=opts.output_len,
                                   models=[DEFAULT_MODEL, *adapters] if kind == "mixed"
                                   else None)
        figures = {"server": side, "load": kind, "round": round_no,
                   "output_throughput": result["output_throughput"],
                   "median_ttft_ms": result["median_ttft_ms"],
                   "p99_ttft_ms": result["p99_ttft_ms"], "completed": result["completed"],
                   "failed": opts.num_prompts - result["completed"]}
        print(json.dumps(figures), flush=True)
        results.append(figures)
    return results


def cold_and_warm(url: str, write, count: int, prefix: str = "") -> dict[str, list[float]]:
    """`count` adapters stored while the server runs: first request (cold), then warm."""
    cold, warm = [], []
    for i in range(count):
        name = write(f"cold{prefix}{i}", seed=1000 + i)
        cold.append(one_token(url, name))
        warm.append(one_token(url, name))
    return {"cold": cold, "warm": warm}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--num-prompts", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--cold", type=int, default=16, help="cold adapters to time")
    parser.add_argument("--skip-reference", action="store_true")
    parser.add_argument("--max-loras", default=str(LORA["max_loras"]),
                        help="comma-separated: one Podium server per value, e.g. 4,8")
    opts = parser.parse_args()
    slot_counts = [int(v) for v in opts.max_loras.split(",")]
    sides = {n: ("podium" if len(slot_counts) == 1 else f"podium-ml{n}") for n in slot_counts}

    from tests.support.lora_adapters import write_adapter_package

    from podium.package.adapter_base import store_adapter
    from podium.package.adapter_store import AdapterStore
    from podium.package.cache import ModelCache
    from podium.package.defaults import write_default_package
    from podium.package.package import open_package, write_manifest

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE":
           os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
    os.environ.update(env)
    model_dir = ModelCache().materialize(write_default_package()).path
    precision = resolved_precision(model_dir)
    work = Path(tempfile.mkdtemp(prefix="podium-bench-lora-"))
    bases = {n: open_package(write_manifest(work / f"base-ml{n}", {
        **default_llm_manifest(), "precision": precision,
        "lora": {} if n == LORA["max_loras"] else
        {"max_loras": n, "max_cpu_loras": max(LORA["max_cpu_loras"], n)}}).root)
        for n in slot_counts}
    base = bases[slot_counts[0]]  # same name@version for all: the adapters' base key
    tag = uuid.uuid4().hex[:6]  # the cache is shared with other runs: remove ours at the end

    def write(stem: str, seed: int) -> str:
        name = f"bench-{stem}-{tag}"
        package = write_adapter_package(work / name, name, seed=seed, base=base.key,
                                        bf16=True)
        store_adapter(open_package(package), base)
        return name

    adapters = {write(f"tone{i}", seed=i): work / f"bench-tone{i}-{tag}"
                for i in range(NUM_ADAPTERS)}
    names = list(adapters)
    print(f"{NUM_ADAPTERS} rank-8 adapters on {base.key} at {precision}; "
          f"{opts.num_prompts} prompts x {opts.rounds} rounds, {opts.input_len} in / "
          f"{opts.output_len} out, concurrency {opts.concurrency}; logs {work}", flush=True)
    results: list[dict] = []
    try:
        probes = {}
        for n, side in sides.items():
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            with podium_server(bases[n].root, port, env, work / f"{side}.log") as served:
                print(json.dumps({"server": side, "max_loras": n, "boot_s": served.boot_s}),
                      flush=True)
                for name in names:  # loaded once, before any load is measured
                    one_token(url, name)
                results += loads(url, model_dir, names, opts, side)
                probes[side] = cold_and_warm(url, write, opts.cold, prefix=f"-ml{n}-")
                print(json.dumps({"server": side, **probes[side]}), flush=True)
        if not opts.skip_reference:
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            with reference_server(model_dir, adapters, precision, port, env,
                                  work / "reference.log") as served:
                print(json.dumps({"server": "reference", "boot_s": served.boot_s}),
                      flush=True)
                for name in names:
                    one_token(url, name)
                results += loads(url, model_dir, names, opts, "reference")
    finally:
        store = AdapterStore()
        for stored in store.list_for(base.key):
            if stored.info.name.endswith(f"-{tag}"):
                store.remove(base.key, stored.info.name, stored.info.version)

    def values(side: str, load: str, key: str) -> list[float]:
        return [r[key] for r in results if r["server"] == side and r["load"] == load]

    for n, side in sides.items():
        print(f"\n{side} (max_loras {n}), mixed (base + {NUM_ADAPTERS} adapters) / base alone, "
              "per round\n")
        print_ratios([("output tok/s", values(side, "mixed", "output_throughput"),
                       values(side, "base", "output_throughput")),
                      ("median TTFT ms", values(side, "mixed", "median_ttft_ms"),
                       values(side, "base", "median_ttft_ms")),
                      ("p99 TTFT ms", values(side, "mixed", "p99_ttft_ms"),
                       values(side, "base", "p99_ttft_ms"))],
                     podium="mixed", peer="base")
    first = sides[slot_counts[0]]
    for side in list(sides.values())[1:]:
        print(f"\nmixed load, {side} / {first}, per round\n")
        print_ratios([("output tok/s", values(side, "mixed", "output_throughput"),
                       values(first, "mixed", "output_throughput")),
                      ("p99 TTFT ms", values(side, "mixed", "p99_ttft_ms"),
                       values(first, "mixed", "p99_ttft_ms"))],
                     podium=side, peer=first)
    if not opts.skip_reference and len(sides) == 1:
        for load in ("mixed", "base"):
            print(f"\n{load} load, Podium / vllm --enable-lora, per round\n")
            print_ratios([("output tok/s", values("podium", load, "output_throughput"),
                           values("reference", load, "output_throughput")),
                          ("median TTFT ms", values("podium", load, "median_ttft_ms"),
                           values("reference", load, "median_ttft_ms"))], peer="reference")
    failed = sum(r["failed"] for r in results)
    print(f"\nfailed requests: {failed}")
    for side, probe in probes.items():
        cold = percentiles([s * 1000 for s in probe["cold"]], (50, 99))
        warm = percentiles([s * 1000 for s in probe["warm"]], (50, 99))
        print(f"{side}: first request, cold adapter ({opts.cold}): p50 {cold['p50']:.0f} ms, "
              f"p99 {cold['p99']:.0f} ms; warm: p50 {warm['p50']:.0f} ms, "
              f"p99 {warm['p99']:.0f} ms")


if __name__ == "__main__":
    main()

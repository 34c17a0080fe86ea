"""Prefix-aware routing vs least-in-flight over two LLM instances, in one run.

    python -m bench.prefix_routing [--prefixes 8] [--prefix-words 1000]
        [--requests 48] [--concurrency 8] [--max-tokens 16] [--kv-blocks 48] [--rounds 2]

Starts two `podium serve` instances of the default LLM (smollm2-135m-instruct, from the model
cache) with a KV cache of `--kv-blocks` blocks of 128 tokens each (`num_gpu_blocks_override`:
room for about half the system prompts, so where each one goes matters), and two gateway
processes over both: one with prefix-aware routing (the default), one least-in-flight. The
load: `--requests` streaming chat completions, `--concurrency` at a time, each with one of
`--prefixes` long system prompts (picked at random, the same sequence for both gateways) and a
short question. The gateways alternate (prefix/least, then least/prefix...), and every run
gets system prompts of its own, so no run finds another's in a cache. Prints one JSON line per
run (median TTFT, throughput, each instance's prefix cache hit rate: the change of
`vllm:prefix_cache_hits` / `vllm:prefix_cache_queries` on its /metrics), then the ratios of
the medians over rounds (targets: TTFT <= 0.5x, throughput >= 1.3x least-in-flight).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.harness import (
    abba,
    closed_loop,
    free_port,
    loopback_client,
    median,
    module_command,
    percentile,
    print_ratios,
    serve,
)

MODEL = "smollm2-135m-instruct"
WORDS = ["harbor", "lantern", "tide", "compass", "anchor", "rope", "sail", "storm", "island",
         "map", "coin", "river", "forest", "mountain", "valley", "castle", "bridge", "tower",
         "garden", "market", "window", "candle", "letter", "stone"]
POLICIES = ("prefix", "least")
BOOT_TIMEOUT_S = 1800
"""Two engines booting at once on a loaded 2-core machine took more than 10 minutes."""


def run_gateway(http_port: int, policy: str, upstreams: list[str]) -> None:
    """Child mode: a gateway over the instances with `policy`, and `podium up`'s health checks."""
    import uvicorn

    from podium.gateway.health import run_health_checks
    from podium.gateway.prefix_router import PrefixPolicy
    from podium.gateway.proxy import Gateway
    from podium.routes.table import Endpoint

    gateway = Gateway(prefix=PrefixPolicy() if policy == "prefix" else None)
    for n, url in enumerate(upstreams):
        gateway.table.add_endpoint(MODEL, "1", Endpoint(f"{MODEL}-{n}", url))
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


def cache_counters(url: str) -> dict[str, float]:
    """An instance's prefix cache hits and queries (tokens) and finished requests so far."""
    from prometheus_client.parser import text_string_to_metric_families

    names = {"vllm:prefix_cache_hits_total": "hits",
             "vllm:prefix_cache_queries_total": "queries",
             "vllm:request_success_total": "requests"}
    totals = dict.fromkeys(names.values(), 0.0)
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=30).text):
        for sample in family.samples:
            if sample.name in names:
                totals[names[sample.name]] += sample.value
    return totals


def system_prompts(seed: int, num: int, num_words: int) -> list[str]:
    """`num` long system prompts no other run uses (about one token a word)."""
    rng = random.Random(seed)
    return [f"[{seed}.{n}] You are assistant {n}. Reply briefly. "
            + " ".join(rng.choice(WORDS) for _ in range(num_words)) for n in range(num)]


async def one_request(client: httpx.AsyncClient, system: str, question: str,
                      max_tokens: int) -> tuple[float, int]:
    """TTFT (s) and output tokens of one streaming chat completion."""
    body = {"model": MODEL, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": question}]}
    started = time.perf_counter()
    ttft, tokens = None, 0
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{response.status_code}: {(await response.aread())[:300]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if ttft is None and any(c.get("delta", {}).get("content")
                                    for c in chunk.get("choices", [])):
                ttft = time.perf_counter() - started
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return (ttft if ttft is not None else time.perf_counter() - started), tokens


async def drive(base_url: str, work: list[tuple[str, str]], concurrency: int,
                max_tokens: int) -> dict[str, Any]:
    """Send every (system, question) with `concurrency` in flight (the harness's closed loop,
    one request per item); the run's figures."""
    items = iter(work)
    async with loopback_client(base_url, timeout=600) as client:
        async def next_request() -> tuple[float, int]:
            system, question = next(items)
            return await one_request(client, system, question, max_tokens)

        started = time.perf_counter()
        samples = await closed_loop(next_request, concurrency, requests=len(work))
        duration = time.perf_counter() - started
    results = [sample.value for sample in samples]
    ttfts = [t for t, _ in results]
    return {"median_ttft_ms": median(ttfts) * 1000,
            "p90_ttft_ms": percentile(ttfts, 90) * 1000,
            "requests_per_s": len(results) / duration,
            "output_tok_per_s": sum(n for _, n in results) / duration,
            "duration_s": duration}


def bench_package(kv_blocks: int) -> Any:
    """The default LLM with a KV cache of `kv_blocks` 128-token blocks."""
    from podium.package.defaults import default_llm_manifest
    from podium.package.package import write_manifest

    manifest = default_llm_manifest()
    # vLLM refuses a KV cache that cannot hold one max-length request: 2048 < 32 blocks
    manifest["engine_args"] = {**manifest["engine_args"], "max_model_len": 2048,
                               "num_gpu_blocks_override": kv_blocks}
    return write_manifest(Path(tempfile.mkdtemp(prefix="podium-prefix-pkg-")) / MODEL,
                          manifest)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefixes", type=int, default=8)
    parser.add_argument("--prefix-words", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--kv-blocks", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2,
                        help="each round runs both gateways; the order alternates")
    parser.add_argument("--gateway-child", nargs="+", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.gateway_child:
        port, policy, *upstreams = opts.gateway_child
        run_gateway(int(port), policy, upstreams)
        return 0

    env = {**os.environ, "HF_HUB_OFFLINE": "1",
           "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    os.environ.update(env)
    from podium.package.cache import ModelCache

    package = bench_package(opts.kv_blocks)
    ModelCache().materialize(package)
    logs = Path(tempfile.mkdtemp(prefix="podium-prefix-routing-"))
    instances = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    # a core each for the engines' workers, as `podium up`'s local runtime gives them (vLLM's
    # own `auto` binding would pin both to the first core)
    cores = [str(c) for c in sorted(os.sched_getaffinity(0))]
    gateways = {p: f"http://127.0.0.1:{free_port()}" for p in POLICIES}
    rng = random.Random(0)
    choices = [rng.randrange(opts.prefixes) for _ in range(opts.requests)]
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in POLICIES}
    with contextlib.ExitStack() as stack:
        # both instances boot at once: each `child` waits only once the other has started
        booting = [stack.enter_context(contextlib.ExitStack()) for _ in instances]
        with concurrent.futures.ThreadPoolExecutor(len(instances)) as pool:
            for future in [pool.submit(booting[n].enter_context, serve(
                    [sys.executable, "-m", "podium.cli", "serve", str(package.root), "--host",
                     "127.0.0.1", "--http-port", url.rsplit(":", 1)[1], "--grpc-port", "-1",
                     "--metrics-open"], url + "/health/ready", log=logs / f"instance-{n}.log",
                    env={**env, "VLLM_CPU_OMP_THREADS_BIND": cores[n % len(cores)]},
                    timeout_s=BOOT_TIMEOUT_S, poll_s=0.5, stop_timeout_s=120))
                    for n, url in enumerate(instances)]:
                future.result()
        for policy, url in gateways.items():
            stack.enter_context(serve(
                module_command("bench.prefix_routing", "--gateway-child", url.rsplit(":", 1)[1],
                               policy, *instances), url + "/health/ready",
                log=logs / f"gateway-{policy}.log", env=env, timeout_s=600, poll_s=0.5))
        print(f"{MODEL} x2, {opts.kv_blocks} KV blocks each; {opts.requests} chats over "
              f"{opts.prefixes} system prompts of {opts.prefix_words} words, concurrency "
              f"{opts.concurrency}, {opts.max_tokens} tokens out; logs in {logs}", flush=True)
        for policy in POLICIES:  # warm both paths (connections, first-request costs)
            asyncio.run(drive(gateways[policy], [("warm up", "hi")] * 2, 2, 2))
        # prefix, least, least, prefix, ...: A/B/B/A
        for run_no, (round_no, policy) in enumerate(abba(opts.rounds, *POLICIES), start=1):
            prompts = system_prompts(run_no, opts.prefixes, opts.prefix_words)
            work = [(prompts[c], f"Question {i}: name one word you know.")
                    for i, c in enumerate(choices)]
            before = [cache_counters(url) for url in instances]
            figures = asyncio.run(drive(gateways[policy], work, opts.concurrency,
                                        opts.max_tokens))
            after = [cache_counters(url) for url in instances]
            for n, (b, a) in enumerate(zip(before, after, strict=True)):
                queries = a["queries"] - b["queries"]
                figures[f"hit_rate_{n}"] = (a["hits"] - b["hits"]) / queries if queries else 0
                figures[f"requests_{n}"] = a["requests"] - b["requests"]
            runs[policy].append(figures)
            print(json.dumps({"policy": policy, "round": round_no,
                              **{k: round(v, 3) for k, v in figures.items()}}), flush=True)

    def med(policy: str, key: str) -> float:
        return median(r[key] for r in runs[policy])

    print(f"\n{'policy':<8}{'median TTFT ms':>16}{'req/s':>8}{'out tok/s':>11}"
          f"{'hit rate 0':>12}{'hit rate 1':>12}")
    for policy in POLICIES:
        print(f"{policy:<8}{med(policy, 'median_ttft_ms'):>16.0f}"
              f"{med(policy, 'requests_per_s'):>8.2f}{med(policy, 'output_tok_per_s'):>11.1f}"
              f"{med(policy, 'hit_rate_0'):>12.1%}{med(policy, 'hit_rate_1'):>12.1%}")
    ttft = med("prefix", "median_ttft_ms") / med("least", "median_ttft_ms")
    rate = med("prefix", "requests_per_s") / med("least", "requests_per_s")
    print(f"prefix / least-in-flight: median TTFT {ttft:.2f}x (target <= 0.5x), "
          f"throughput {rate:.2f}x (target >= 1.3x)")
    print()
    print_ratios([(label, [r[key] for r in runs["prefix"]], [r[key] for r in runs["least"]])
                  for label, key in (("median TTFT ms", "median_ttft_ms"),
                                     ("requests/s", "requests_per_s"))],
                 podium="prefix", peer="least")
    return 0


if __name__ == "__main__":
    sys.exit(main())

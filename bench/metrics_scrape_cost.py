"""Cost of scraping /metrics on an instance under LLM load: output tokens/s with and without.

    python -m bench.metrics_scrape_cost --serve PACKAGE_DIR        # starts `podium serve`
    python -m bench.metrics_scrape_cost --url http://127.0.0.1:8000 --model NAME
    python -m bench.metrics_scrape_cost --render-dir $PODIUM_HOME/run/prometheus/instance-PID

A constant completion load (ignore_eos, fixed max_tokens) runs throughout; phases alternate
scraping off / on (GET /metrics every --scrape-interval, asking for OpenMetrics as Prometheus
does). Load is never restarted between phases, so the ratio compares like with like. Prints each
phase, the scrape latency and size, and the on/off throughput ratio (issue 4 asks cost < 2%).

On a shared or small machine the A/B ratio is dominated by noise; `--render-dir` measures what a
scrape costs the instance directly: CPU time of `render()` over a copy of a real instance's
multiprocess directory, in a fresh interpreter, and that as a share of one core per interval.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path

import httpx

from bench.harness import check_loopback, closed_loop, free_port, percentile, serve

OPENMETRICS = "application/openmetrics-text; version=1.0.0,text/plain;version=0.0.4;q=0.5"
PROMPT = " ".join(["The quick brown fox jumps over the lazy dog."] * 12)  # ~128 tokens


class Counters:
    """Streamed output tokens and scrape observations, by wall-clock time."""

    def __init__(self) -> None:
        self.tokens: list[float] = []  # arrival time of each streamed token
        self.scrapes: list[tuple[float, float, int]] = []  # (time, seconds, bytes)
        self.errors = 0
        self.last_body = ""


async def stream_once(client: httpx.AsyncClient, body: dict, c: Counters) -> None:
    """One streamed completion, each token counted when it arrives (counting whole
    completions would quantize throughput to waves of `concurrency` finishing together)."""
    try:
        async with client.stream("POST", "/v1/completions", json=body) as r:
            r.raise_for_status()
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    c.tokens.append(time.monotonic())
    except httpx.HTTPError:
        c.errors += 1
        await asyncio.sleep(0.1)


def load(client: httpx.AsyncClient, args: argparse.Namespace, c: Counters,
         stop: asyncio.Event) -> Coroutine[None, None, object]:
    """The constant load: the harness's closed loop of `--concurrency` streams until `stop`."""
    body = {"model": args.model, "prompt": PROMPT, "max_tokens": args.max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True}
    bound_s = args.warmup_seconds + 2 * args.rounds * args.phase_seconds + 600
    return closed_loop(lambda: stream_once(client, body, c), args.concurrency,
                       seconds=bound_s, stop=stop.is_set)


async def scraper(
    client: httpx.AsyncClient,
    interval: float,
    c: Counters,
    enabled: asyncio.Event,
    stop: asyncio.Event,
) -> None:
    while not stop.is_set():
        await enabled.wait()
        start = time.monotonic()
        r = await client.get("/metrics", headers={"Accept": OPENMETRICS})
        r.raise_for_status()
        c.scrapes.append((start, time.monotonic() - start, len(r.content)))
        c.last_body = r.text
        await asyncio.sleep(max(0.0, interval - (time.monotonic() - start)))


def tokens_per_s(c: Counters, start: float, end: float) -> float:
    return sum(1 for t in c.tokens if start <= t < end) / (end - start)


async def measure(args: argparse.Namespace, url: str) -> dict:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=args.concurrency + 2)
    c, stop, enabled = Counters(), asyncio.Event(), asyncio.Event()
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=600, limits=limits) as cl:
        tasks: list[asyncio.Task] = [asyncio.create_task(load(cl, args, c, stop))]
        tasks.append(asyncio.create_task(scraper(cl, args.scrape_interval, c, enabled, stop)))
        await asyncio.sleep(args.warmup_seconds)
        phases: list[dict] = []
        for i in range(2 * args.rounds):
            scraping = i % 2 == 1
            enabled.set() if scraping else enabled.clear()
            start = time.monotonic()
            await asyncio.sleep(args.phase_seconds)
            end = time.monotonic()
            phases.append({"scraping": scraping, "tokens_per_s": tokens_per_s(c, start, end)})
            print(
                f"phase {i + 1}: scraping={'on ' if scraping else 'off'} "
                f"{phases[-1]['tokens_per_s']:.1f} output tok/s",
                flush=True,
            )
        stop.set()
        enabled.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    off = statistics.mean(p["tokens_per_s"] for p in phases if not p["scraping"])
    on = statistics.mean(p["tokens_per_s"] for p in phases if p["scraping"])
    latencies = sorted(s for _, s, _ in c.scrapes)
    return {
        "tokens_per_s_off": round(off, 1),
        "tokens_per_s_on": round(on, 1),
        "ratio_on_off": round(on / off, 4),
        "cost_percent": round((1 - on / off) * 100, 2),
        "num_scrapes": len(latencies),
        "scrape_p50_ms": round(1000 * percentile(latencies, 50), 1),
        "scrape_max_ms": round(1000 * latencies[-1], 1),
        "scrape_bytes": c.scrapes[-1][2],
        "vllm_families_exposed": len(
            {
                line.split()[2]
                for line in c.last_body.splitlines()
                if line.startswith("# TYPE vllm:")
            }
        ),
        "request_errors": c.errors,
        "settings": {k: v for k, v in vars(args).items() if k not in ("api_key",)},
        "phases": phases,
    }


RENDER_SNIPPET = """
import json, sys, time
from podium.metrics import exposition
out = {}
for name, accept in (("text", None), ("openmetrics", "application/openmetrics-text")):
    body, _ = exposition.render(accept)
    start = time.process_time()
    for _ in range(200):
        exposition.render(accept)
    out[name] = {"cpu_ms_per_render": round((time.process_time() - start) * 5, 3),
                 "bytes": len(body)}
print(json.dumps(out))
"""


def render_cost(directory: Path, intervals: list[float]) -> dict:
    """CPU per render() of a real multiprocess directory, and its share of a core per interval."""
    import os
    import subprocess

    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    out = subprocess.run(
        [sys.executable, "-c", RENDER_SNIPPET], env=env, check=True, capture_output=True, text=True
    ).stdout
    result = json.loads(out)
    cpu_ms = result["openmetrics"]["cpu_ms_per_render"]
    result["share_of_one_core"] = {f"every {i:g}s": f"{cpu_ms / (i * 10):.3f}%" for i in intervals}
    return result


@contextlib.contextmanager
def instance(args: argparse.Namespace) -> Iterator[str]:
    """The URL of the instance to measure: given, or a `podium serve` started for the run."""
    if args.url:
        yield check_loopback(args.url.rstrip("/"))
        return
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "podium.cli",
        "serve",
        str(args.serve),
        "--http-port",
        str(port),
        "--grpc-port",
        "-1",
        "--metrics-open",
        "--host",
        "127.0.0.1",
    ]
    with serve(command, f"http://127.0.0.1:{port}/health/ready", timeout_s=600):
        yield f"http://127.0.0.1:{port}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running instance")
    where.add_argument("--serve", type=Path, help="package to serve with `podium serve`")
    where.add_argument("--render-dir", type=Path, help="only time render() over this directory")
    parser.add_argument("--model", help="model to call (default: the package's name)")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--scrape-interval",
        type=float,
        default=1.0,
        help="seconds between scrapes while on (Prometheus' default is 15)",
    )
    parser.add_argument("--phase-seconds", type=float, default=20)
    parser.add_argument("--rounds", type=int, default=2, help="off/on pairs")
    parser.add_argument("--warmup-seconds", type=float, default=10)
    args = parser.parse_args()
    if args.render_dir:
        print(json.dumps(render_cost(args.render_dir, [1, 15, 60]), indent=2))
        return
    if args.model is None:
        if args.serve is None:
            parser.error("--model is required with --url")
        args.model = json.loads((args.serve / "podium.json").read_text())["name"]
    with instance(args) as url:
        result = asyncio.run(measure(args, url))
    print(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()

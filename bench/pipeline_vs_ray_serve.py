"""The `recommend` pipeline served by Podium vs the same pipeline built with Ray Serve model
composition: same models, same steps, same machine, one run, never both servers up at once.

    python -m bench.pipeline_vs_ray_serve [--concurrency 1 32] [--rounds 3] [--seconds 3]
        [--client raw|httpx] [--requests 1200]

Podium: one `podium serve --repository` of xgb-example and `recommend`'s control arm
(`bench.pipeline_overhead.write_repository`: experiment → SQL member → SQL candidates → SQL
features → xgb-example in-process → post-processing), called on `POST /pipelines/recommend`.
Ray Serve: a local Ray head with two deployments composed by a handle, as its model
composition guide builds a pipeline: `Recommend` (HTTP ingress; the same salted experiment
hash, the same three SQLite queries on the same catalog, the sort) calling `Scorer`
(xgb-example's `model.json` with xgboost's `inplace_predict`, batched by `@serve.batch` as
Podium's dynamic batcher batches it: up to 64, 0.5 ms). Both answer `{"member_id": ...}`
with the same three titles (checked after measuring, from what each answered while up).

Fair on a 2-core machine: each server is measured with the other one fully stopped (Podium's
process tree gone; `ray.shutdown()` and every Ray process of this bench gone: GCS, raylet, the
Serve controller, proxy and replicas, checked), in the order Podium, Ray Serve, Ray Serve,
Podium per round (ABBA; the two middle blocks share one Ray start and a round's last Podium
block the next round's first Podium start). Each block measures every concurrency with the
same client: closed loops over keep-alive HTTP, the same pre-encoded body. Prints every block
(median, p99, req/s; Podium's CPU per request), then per concurrency the pooled figures and
the Podium/Ray Serve ratios of adjacent blocks with their spread (issue 31's target: at least
2x Ray Serve's throughput, at most 0.5x its p99).

The client is `bench.harness.rawload`'s by default (`--client raw`: pre-encoded requests for
one member over keep-alive connections, one per loop, `--seconds` per block): the asyncio +
httpx client (`--client httpx`, `--requests` per server and concurrency, members cycled) costs
about a millisecond of CPU per request and, at c=32 on this 2-core machine, passed some of its
own requests over for 0.4-0.8 s: its p99 was 4x its median while Podium's own request
duration metric said p99 <= 100 ms (docs/benchmarks.md, the pipeline section).

Needs Ray Serve's own dependencies (`pip install "ray[serve]"`): it says which is missing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness import (
    closed_loop,
    cpu_seconds,
    free_port,
    loopback_client,
    median,
    percentile,
    wait_until,
)
from bench.harness import serve as serve_process
from bench.harness.rawload import Target
from bench.harness.rawload import closed_loop as raw_closed_loop
from bench.harness.report import ratios
from bench.pipeline_overhead import write_repository

WARMUP = 40
FEATURES = [f"f{i}" for i in range(20)]


def ray_serve_app(root: Path) -> Any:
    """The Ray Serve application: `Recommend` composed with `Scorer` through a handle."""
    import numpy as np
    from ray import serve
    from ray.serve.handle import DeploymentHandle
    from starlette.requests import Request

    @serve.deployment(max_ongoing_requests=256)
    class Scorer:
        def __init__(self, model_file: str) -> None:
            import xgboost

            self.booster = xgboost.Booster()
            self.booster.load_model(model_file)
            self.booster.set_param({"nthread": 1})

        @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.0005)
        async def score(self, matrices: list[Any]) -> list[list[float]]:
            stacked = np.concatenate(matrices).astype(np.float32)
            flat = self.booster.inplace_predict(stacked).tolist()
            out, start = [], 0
            for matrix in matrices:
                out.append(flat[start:start + len(matrix)])
                start += len(matrix)
            return out

    @serve.deployment(max_ongoing_requests=256)
    class Recommend:
        def __init__(self, scorer: DeploymentHandle, catalog: str, salt: str) -> None:
            self.scorer = scorer
            self.salt = salt
            self.db = sqlite3.connect(catalog, check_same_thread=False)

        async def __call__(self, request: Request) -> dict[str, Any]:
            member = (await request.json())["member_id"]
            digest = hashlib.sha256(f"{self.salt}\0{member}".encode()).digest()
            _ = int.from_bytes(digest[:8], "big")  # the experiment: one arm here, as in Podium
            row = self.db.execute("SELECT genre FROM members WHERE member_id = ?",
                                  (member,)).fetchone()
            genre = row[0] if row else "drama"
            titles = [r[0] for r in self.db.execute(
                "SELECT title FROM titles WHERE genre = ? LIMIT 12", (genre,))]
            marks = ",".join("?" * len(titles))
            rows = {r[0]: list(r[1:]) for r in self.db.execute(
                f"SELECT title, {', '.join(FEATURES)} FROM titles WHERE title IN ({marks})",
                titles)}
            matrix = np.array([rows[t] for t in titles], dtype=np.float32)
            scores = await self.scorer.score.remote(matrix)
            ranked = sorted(zip(titles, scores, strict=True), key=lambda p: -p[1])
            return {"titles": [t for t, _ in ranked[:3]], "variant": "control",
                    "ranked_by": "xgb-example"}

    from podium.examples.recommend import recommend_manifest

    salt = recommend_manifest("absent-llm")["steps"][0]["salt"]
    return Recommend.bind(Scorer.bind(str(root / "xgb-example" / "model.json")),
                          str(root / "recommend" / "catalog.db"), salt)


MEMBERS = ("m5", "m42", "unknown")
PODIUM, RAY = "podium", "ray serve"


@dataclass
class Block:
    """One server's closed loop at one concurrency."""

    server: str
    concurrency: int
    latencies_ms: list[float]
    rate: float
    cpu_ms: float | None = None
    """The server process's CPU per request (Podium's one process; None for Ray Serve)."""


def raw_block(url: str, concurrency: int, seconds: float) -> tuple[list[float], float]:
    """One closed-loop block with the light client: latencies (ms) and requests per second,
    after a half-second warm-up that opens the connections."""
    target = Target.post_json(url, b'{"member_id": "m42"}')
    raw_closed_loop(target, concurrency, 0.5, processes=1)
    answers = raw_closed_loop(target, concurrency, seconds, processes=1)
    bad = [status for _, status, _ in answers if status != 200]
    assert not bad, f"{url}: {len(bad)} answers were not 200 ({bad[:3]})"
    return [took * 1000 for _, _, took in answers], len(answers) / seconds


async def httpx_block(url: str, concurrency: int, requests: int) -> tuple[list[float], float]:
    """One closed-loop block with the asyncio + httpx client, members cycled."""
    counter = iter(range(10**9))
    async with loopback_client(timeout=60) as client:
        async def call() -> object:
            r = await client.post(url, json={"member_id": f"m{next(counter) % 200}"})
            r.raise_for_status()
            return r

        started = time.perf_counter()
        samples = await closed_loop(call, concurrency, requests=requests,
                                    warmup_requests=WARMUP)
        elapsed = time.perf_counter() - started
    return [s.seconds * 1000 for s in samples], len(samples) / elapsed


def answers_of(url: str, unwrap: Callable[[dict[str, Any]], list[str]]) -> list[list[str]]:
    import httpx

    return [unwrap(httpx.post(url, json={"member_id": m}, timeout=30).json()) for m in MEMBERS]


@contextlib.contextmanager
def podium_up(root: Path) -> Iterator[tuple[str, int]]:
    """`podium serve` of the repository for the block: (the pipeline's URL, its pid)."""
    http, grpc = free_port(), free_port()
    command = [sys.executable, "-m", "podium.cli", "serve", "--repository", str(root),
               "--host", "127.0.0.1", "--http-port", str(http), "--grpc-port", str(grpc)]
    base = f"http://127.0.0.1:{http}"
    with serve_process(command, f"{base}/health/ready") as served:
        yield f"{base}/pipelines/recommend", served.pid


def _own_children() -> list[Any]:
    import psutil

    alive = []
    for process in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
    return alive


@contextlib.contextmanager
def ray_up(root: Path, cpus: int) -> Iterator[str]:
    """A local Ray head with the Ray Serve application for the block: its URL. Afterwards
    every process Ray started is gone (waited for; killed after 30 s), so none takes the
    cores from the next Podium block."""
    import psutil
    import ray
    from ray import serve

    port = free_port()
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(ray_serve_app(root), route_prefix="/recommend")
        yield f"http://127.0.0.1:{port}/recommend"
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()
        left = _own_children()
        _gone, alive = psutil.wait_procs(left, timeout=30)
        for process in alive:
            with contextlib.suppress(psutil.Error):
                process.kill()
        if alive:
            print(f"  (killed {len(alive)} Ray processes still up 30 s after shutdown)")


def sessions(rounds: int) -> list[tuple[str, int]]:
    """(server, blocks in a row) for `rounds` rounds of Podium, Ray Serve, Ray Serve, Podium:
    consecutive blocks of one server share its start."""
    order = [s for _ in range(rounds) for s in (PODIUM, RAY, RAY, PODIUM)]
    merged: list[tuple[str, int]] = []
    for server in order:
        if merged and merged[-1][0] == server:
            merged[-1] = (server, merged[-1][1] + 1)
        else:
            merged.append((server, 1))
    return merged


def measure_blocks(server: str, url: str, pid: int | None, blocks: int, concurrencies: list[int],
                   client: str, seconds: float, requests: int, rounds: int) -> list[Block]:
    out = []
    for _ in range(blocks):
        for concurrency in concurrencies:
            cpu = cpu_seconds(pid) if pid is not None else None
            if client == "raw":
                latencies, rate = raw_block(url, concurrency, seconds)
            else:
                latencies, rate = asyncio.run(httpx_block(url, concurrency,
                                                          requests // (2 * rounds)))
            cpu_ms = None
            if pid is not None and cpu is not None:
                # the warm-up's requests are in the CPU too: per answer of the block it is
                # an upper bound, the same for every Podium block
                cpu_ms = (cpu_seconds(pid) - cpu) * 1000 / len(latencies)
            block = Block(server, concurrency, latencies, rate, cpu_ms)
            out.append(block)
            cpu_text = f"{cpu_ms:8.2f}" if cpu_ms is not None else f"{'-':>8}"
            print(f"{time.strftime('%H:%M:%S')} {server:<10}{concurrency:>4}"
                  f"{median(latencies):>11.2f}{percentile(latencies, 99):>9.2f}"
                  f"{rate:>9.0f}{cpu_text}", flush=True)
    return out


def summarize(blocks: list[Block], concurrencies: list[int]) -> None:
    print(f"\n{'server':<12}{'c':>4}{'median ms':>11}{'p99 ms':>9}{'req/s':>9}  "
          "(pooled latencies; median req/s of blocks)")
    for concurrency in concurrencies:
        mine = {s: [b for b in blocks if b.server == s and b.concurrency == concurrency]
                for s in (PODIUM, RAY)}
        for server, own in mine.items():
            pooled = [x for b in own for x in b.latencies_ms]
            print(f"{server:<12}{concurrency:>4}{median(pooled):>11.2f}"
                  f"{percentile(pooled, 99):>9.2f}{median([b.rate for b in own]):>9.0f}")
        podium, ray = mine[PODIUM], mine[RAY]
        pooled_p = [x for b in podium for x in b.latencies_ms]
        pooled_r = [x for b in ray for x in b.latencies_ms]
        rate = ratios([b.rate for b in podium], [b.rate for b in ray])
        p99 = ratios([percentile(b.latencies_ms, 99) for b in podium],
                     [percentile(b.latencies_ms, 99) for b in ray])
        overall = median([b.rate for b in podium]) / median([b.rate for b in ray])
        print(f"  c={concurrency} podium/ray serve: throughput x{overall:.2f} "
              f"(adjacent blocks: {rate.median:.2f} [{rate.min:.2f} .. {rate.max:.2f}]), "
              f"p99 x{percentile(pooled_p, 99) / percentile(pooled_r, 99):.2f} (adjacent "
              f"blocks: {p99.median:.2f} [{p99.min:.2f} .. {p99.max:.2f}])")
        cpu = [b.cpu_ms for b in podium if b.cpu_ms is not None]
        if cpu:
            print(f"  c={concurrency} podium CPU ms per request: {median(cpu):.2f} "
                  f"[{min(cpu):.2f} .. {max(cpu):.2f}]")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1200,
                        help="per server and concurrency with --client httpx")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of Podium, Ray Serve, Ray Serve, Podium blocks")
    parser.add_argument("--client", choices=["raw", "httpx"], default="raw",
                        help="raw: rawload's light client (default); httpx: asyncio + httpx")
    parser.add_argument("--seconds", type=float, default=3.0,
                        help="per block with --client raw")
    parser.add_argument("--ray-cpus", type=int, default=2, help="the local Ray head's CPUs")
    parser.add_argument("--podium-only", action="store_true",
                        help="only Podium's blocks (no Ray: tuning without the Ray lock)")
    args = parser.parse_args()
    try:
        if not args.podium_only:
            import ray  # noqa: F401
            from ray import serve  # noqa: F401
    except ImportError as exc:
        print(f"Ray Serve cannot be imported here ({exc}); install its dependencies with "
              "`pip install \"ray[serve]\"`", file=sys.stderr)
        return 2
    root = write_repository(Path(tempfile.mkdtemp()))
    blocks: list[Block] = []
    answers: dict[str, list[list[str]]] = {}
    print(f"{'time':<9}{'server':<10}{'c':>4}{'median ms':>11}{'p99 ms':>9}{'req/s':>9}"
          f"{'CPU ms':>8}")
    for server, count in sessions(args.rounds):
        if args.podium_only and server != PODIUM:
            continue
        assert not _own_children(), "a server of the last block is still up"
        measure = (args.concurrency, args.client, args.seconds, args.requests, args.rounds)
        if server == PODIUM:
            with podium_up(root) as (url, pid):
                answers.setdefault(server, answers_of(url, lambda a: a["outputs"]["titles"]))
                blocks += measure_blocks(server, url, pid, count, *measure)
        else:
            with ray_up(root, args.ray_cpus) as url:
                answers.setdefault(server, answers_of(url, lambda a: a["titles"]))
                blocks += measure_blocks(server, url, None, count, *measure)
        wait_until(lambda: not _own_children(), timeout_s=30, what="the servers' exit")
    if args.podium_only:
        return 0
    assert answers[PODIUM] == answers[RAY], answers
    summarize(blocks, args.concurrency)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Pipeline overhead: the same work through a pipeline vs called directly, in one run.

    python -m bench.pipeline_overhead [--requests 1200] [--concurrency 1 32] [--rounds 2]

Serves one `podium serve --repository` of xgb-example, a one-step pipeline `score` (its one
step calls xgb-example in-process) and the `recommend` example's control arm (experiment →
SQL member → SQL candidates → SQL features → xgb-example → post-processing; no LLM). Over
KServe v2 HTTP, in ABBA blocks per concurrency:

- per step: xgb-example directly vs `score` (one step: the pipeline's fixed cost);
- end to end: `recommend` vs a client doing its work itself (the same SQLite queries in the
  client, then xgb-example, then the sort): what the front costs over composing by hand;
- live vs precomputed: `recommend` computed live vs `recommend-cached` (the same graph with a
  `result_cache` that `podium batch` filled for every member before the run) answering from
  its cache.

Prints median and p99 latency and throughput of each path, and the pipeline/direct ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from bench.harness import closed_loop, free_port, loopback_client, median, percentile, serve

WARMUP = 40
Caller = Callable[[], Awaitable[object]]


def write_repository(root: Path) -> Path:
    from podium.examples.builders import write_xgb_example
    from podium.examples.recommend import recommend_manifest, write_recommend_example
    from podium.package.package import write_manifest

    write_xgb_example(root / "xgb-example")
    package = write_recommend_example(root / "recommend", "absent-llm")
    manifest = recommend_manifest("absent-llm")
    manifest["steps"] = [s for s in manifest["steps"] if s["name"] != "pick"]
    manifest["steps"][0]["variants"] = [{"name": "control", "weight": 1}]
    manifest["steps"][-1]["args"].pop("picked")
    write_manifest(package, manifest)
    cached = write_recommend_example(root / "recommend-cached", "absent-llm")
    write_manifest(cached, {**manifest, "name": "recommend-cached", "result_cache": {
        "url": "sqlite:///results.db", "key": "member_id", "ttl_s": 86_400}})
    write_manifest(root / "score", {
        "name": "score", "backend": "pipeline",
        "inputs": [{"name": "features", "datatype": "FP32", "shape": [20]}],
        "outputs": [{"name": "probability", "datatype": "FP32", "shape": [1],
                     "from": "$rank.probability.0"}],
        "steps": [{"name": "rank", "kind": "model", "model": "xgb-example",
                   "inputs": {"features": ["$input.features"]}}]})
    return root


def precompute(root: Path) -> None:
    """`podium batch recommend-cached` over every member of the catalog (in this process)."""
    from podium.examples.recommend import NUM_MEMBERS
    from podium.pipelines.batch import run_batch

    members = root / "recommend-cached" / "members.jsonl"
    members.write_text("".join(f'{{"member_id": "m{i}"}}\n' for i in range(NUM_MEMBERS)))
    report = asyncio.run(run_batch(root, "recommend-cached", members, batch_size=64))
    assert report.computed == NUM_MEMBERS and report.failed == 0, report


def callers(base: str, catalog: Path) -> dict[str, tuple[Caller, Callable[[], Awaitable[None]]]]:
    client = loopback_client(base, timeout=60)
    features = [0.1 * i for i in range(20)]
    counter = iter(range(10**9))
    db = sqlite3.connect(catalog, check_same_thread=False)

    async def xgb(rows: list[list[float]]) -> list[float]:
        r = await client.post("/v2/models/xgb-example/infer", json={"inputs": [
            {"name": "features", "datatype": "FP32", "shape": [len(rows), 20],
             "data": [v for row in rows for v in row]}]})
        r.raise_for_status()
        return r.json()["outputs"][0]["data"]

    async def direct_step() -> object:
        return await xgb([features])

    async def score() -> object:
        r = await client.post("/v2/models/score/infer", json={"inputs": [
            {"name": "features", "datatype": "FP32", "shape": [20], "data": features}]})
        r.raise_for_status()
        return r

    async def recommend() -> object:
        member = f"m{next(counter) % 200}"
        r = await client.post("/v2/models/recommend/infer", json={"inputs": [
            {"name": "member_id", "datatype": "BYTES", "shape": [1], "data": [member]}]})
        r.raise_for_status()
        return r

    async def cached() -> object:
        member = f"m{next(counter) % 200}"
        r = await client.post("/v2/models/recommend-cached/infer", json={"inputs": [
            {"name": "member_id", "datatype": "BYTES", "shape": [1], "data": [member]}]})
        r.raise_for_status()
        assert r.json()["parameters"]["pipeline_path"] == "cache", r.text
        return r

    async def by_hand() -> object:
        member = f"m{next(counter) % 200}"
        genre = db.execute("SELECT genre FROM members WHERE member_id = ?", (member,)
                           ).fetchone()[0]
        titles = [r[0] for r in db.execute(
            "SELECT title FROM titles WHERE genre = ? LIMIT 12", (genre,))]
        marks = ",".join("?" * len(titles))
        rows = {r[0]: list(r[1:]) for r in db.execute(
            f"SELECT title, {', '.join(f'f{i}' for i in range(20))} FROM titles "
            f"WHERE title IN ({marks})", titles)}
        scores = await xgb([rows[t] for t in titles])
        return sorted(zip(titles, scores, strict=True), key=lambda p: -p[1])[:3]

    async def close() -> None:
        await client.aclose()

    return {"xgb-example": (direct_step, close), "score": (score, close),
            "recommend": (recommend, close), "by hand": (by_hand, close),
            "recommend-cached": (cached, close)}


async def block(call: Caller, requests: int, concurrency: int) -> tuple[list[float], float]:
    started = time.perf_counter()
    samples = await closed_loop(call, concurrency, requests=requests, warmup_requests=WARMUP)
    elapsed = time.perf_counter() - started
    return [s.seconds * 1000 for s in samples], len(samples) / elapsed


async def measure(base: str, catalog: Path, requests: int, concurrencies: list[int],
                  rounds: int) -> None:
    calls = callers(base, catalog)
    print(f"{'pair':<28}{'c':>4}{'median ms':>11}{'p99 ms':>9}{'req/s':>9}")
    for concurrency in concurrencies:
        for direct, piped in (("xgb-example", "score"), ("by hand", "recommend"),
                              ("recommend", "recommend-cached")):
            results: dict[str, tuple[list[float], list[float]]] = {direct: ([], []),
                                                                   piped: ([], [])}
            for _ in range(rounds):
                for name in (direct, piped, piped, direct):  # ABBA: drift hits both alike
                    latencies, rate = await block(calls[name][0], requests // (2 * rounds),
                                                  concurrency)
                    results[name][0].extend(latencies)
                    results[name][1].append(rate)
            for name in (direct, piped):
                latencies, rates = results[name]
                print(f"{name:<28}{concurrency:>4}{median(latencies):>11.2f}"
                      f"{percentile(latencies, 99):>9.2f}{median(rates):>9.0f}")
            ratio_med = median(results[piped][0]) / median(results[direct][0])
            ratio_rate = median(results[piped][1]) / median(results[direct][1])
            print(f"  {piped}/{direct}: median latency x{ratio_med:.2f}, "
                  f"throughput x{ratio_rate:.2f}")
    await calls["score"][1]()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1200, help="per path and concurrency")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    root = write_repository(Path(tempfile.mkdtemp()))
    precompute(root)
    http, grpc = free_port(), free_port()
    command = [sys.executable, "-m", "podium.cli", "serve", "--repository", str(root),
               "--host", "127.0.0.1", "--http-port", str(http), "--grpc-port", str(grpc)]
    base = f"http://127.0.0.1:{http}"
    with serve(command, f"{base}/health/ready"):
        asyncio.run(measure(base, root / "recommend" / "catalog.db", args.requests,
                            args.concurrency, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())

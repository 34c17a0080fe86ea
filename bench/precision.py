"""The default model at each precision this machine serves, against bf16, in one run.

For each precision in turn (one engine at a time: they would share 2 cores), a package of
SmolLM2-135M-Instruct with that `precision` is materialized (int8: the W8A8 checkpoint is
written then) and served by `podium serve`; then:
- boot to ready (from the cache);
- quality against bf16 on tests/support/quality.py's fixed prompts: mean log-likelihood per
  prompt token (vLLM's prompt logprobs), mean |Δ logprob| per token, and greedy
  continuations (24 tokens) equal to bf16's, exactly and by common prefix;
- output tokens/s under a short fixed load (--requests completions of --max-tokens tokens,
  --concurrency at a time, greedy, ignore_eos);
- peak RSS of the server and its engine process together during that load, and the size of
  the weights folder it loaded.

Usage: python -m bench.precision [--precisions bf16,int8,fp16,fp32]
           [--requests 32] [--concurrency 8] [--max-tokens 64] [--json out.json]
Prints one JSON line per precision and a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

from tests.support.quality import Scored, closeness, score

from bench.harness import ROOT, closed_loop, free_port, loopback_client, serve

LOAD_PROMPT = ("Write a short story about a lighthouse keeper who finds a message in a bottle "
               "and decides to answer it.")


def package_for(precision: str, root: Path) -> Path:
    """The default LLM's package under its own name per precision (its own cache ref)."""
    from podium.package.defaults import default_llm_manifest
    from podium.package.package import write_manifest

    manifest = {**default_llm_manifest(), "name": f"smollm2-bench-{precision}",
                "precision": precision}
    return write_manifest(root / precision, manifest).root


def materialize(package_dir: Path) -> tuple[Path, float]:
    from podium.package.cache import ModelCache
    from podium.package.package import open_package

    started = time.monotonic()
    entry = ModelCache().materialize(open_package(package_dir))
    return entry.path, time.monotonic() - started


def podium_command(package_dir: Path, port: int) -> list[str]:
    return [sys.executable, "-m", "podium.cli", "serve", str(package_dir), "--host",
            "127.0.0.1", "--http-port", str(port), "--grpc-port", "-1"]


class PeakRss:
    """Samples the RSS of a process and its children until stopped; keeps the peak."""

    def __init__(self, pid: int, every_s: float = 0.2) -> None:
        import psutil

        self.process, self.every_s, self.peak = psutil.Process(pid), every_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def sample(self) -> int:
        import psutil

        total = 0
        for proc in [self.process, *self.process.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):  # a child that just exited
                total += proc.memory_info().rss
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.sample())
            self._stop.wait(self.every_s)


async def load(url: str, model: str, requests: int, concurrency: int,
               max_tokens: int) -> tuple[int, float]:
    """(output tokens, seconds) for `requests` greedy completions, `concurrency` at a time."""
    async with loopback_client(url, timeout=600) as client:
        async def one() -> int:
            r = await client.post("/v1/completions", json={
                "model": model, "prompt": LOAD_PROMPT, "max_tokens": max_tokens,
                "temperature": 0, "ignore_eos": True})
            r.raise_for_status()
            return int(r.json()["usage"]["completion_tokens"])

        started = time.monotonic()
        samples = await closed_loop(one, concurrency, requests=requests)
        return sum(sample.value for sample in samples), time.monotonic() - started


def measure(precision: str, root: Path, args: argparse.Namespace) -> tuple[dict, Scored]:
    package = package_for(precision, root)
    weights, materialize_s = materialize(package)
    size = sum(f.stat().st_size for f in weights.glob("*.safetensors"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    model = f"smollm2-bench-{precision}"
    with serve(podium_command(package, port), f"{url}/health/ready", timeout_s=900,
               log=root / f"{precision}.log", cwd=ROOT, stop_timeout_s=120) as served:
        boot_s = served.boot_s
        scored = score(f"{url}/v1", model)
        idle_rss = PeakRss(served.pid).sample()
        with PeakRss(served.pid) as rss:
            tokens, seconds = asyncio.run(load(url, model, args.requests, args.concurrency,
                                               args.max_tokens))
    row = {"precision": precision, "materialize_s": round(materialize_s, 1),
           "boot_s": round(boot_s, 1), "weights_mb": round(size / 2**20),
           "idle_rss_mb": round(idle_rss / 2**20), "peak_rss_mb": round(rss.peak / 2**20),
           "output_tokens": tokens, "load_s": round(seconds, 2),
           "output_tok_s": round(tokens / seconds, 1),
           "mean_loglik": round(scored.mean_loglik, 4)}
    return row, scored


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precisions", default="bf16,int8,fp16,fp32")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    names = args.precisions.split(",")
    if names[0] != "bf16":
        names = ["bf16", *[n for n in names if n != "bf16"]]  # the reference comes first
    rows, reference = [], None
    with tempfile.TemporaryDirectory(prefix="podium-precision-") as tmp:
        for name in names:
            row, scored = measure(name, Path(tmp), args)
            reference = reference or scored
            close = closeness(scored, reference)
            row.update(loglik_delta=round(close.loglik_delta, 4),
                       mean_abs_token_delta=round(close.mean_abs_token_delta, 4),
                       greedy_exact=round(close.exact_match, 3),
                       greedy_prefix=round(close.mean_common_prefix, 1))
            print(json.dumps(row), flush=True)
            rows.append(row)
            if args.json:  # after each precision: a run cut short keeps what it measured
                args.json.write_text(json.dumps(rows, indent=2))
    print_table(rows)


def print_table(rows: list[dict]) -> None:
    base = rows[0]
    print("\n| precision | output tok/s | vs bf16 | peak RSS MiB | weights MiB | boot s | "
          "mean loglik | Δ loglik | mean abs Δ/token | greedy = bf16 | common prefix /24 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['precision']} | {r['output_tok_s']} | "
              f"{r['output_tok_s'] / base['output_tok_s']:.2f} | {r['peak_rss_mb']} | "
              f"{r['weights_mb']} | {r['boot_s']} | {r['mean_loglik']} | {r['loglik_delta']} | "
              f"{r['mean_abs_token_delta']} | {r['greedy_exact']:.0%} | {r['greedy_prefix']} |")


if __name__ == "__main__":
    main()
